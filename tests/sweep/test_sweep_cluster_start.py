"""Reaching a cluster: a port that never answers and a Ctrl-C while the embedded cluster starts are
one line each (issue 37, items 11 and 14).

Both through the real CLI: the silent port is a real listening socket that never accepts, the
Ctrl-C a real SIGINT to the command's whole process group, as a terminal sends it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pipesim.sweep.cluster import CtrlCHeld
from child_signals import default_sigint
from sweep_specs import HEAVY_SPEC

psutil = pytest.importorskip("psutil")

ROOT = Path(__file__).resolve().parents[2]
SMALL = """\
profile: {uniform: {layers: 8, forward_ms: 1.0, backward_ms: 2.0, activation_bytes: 1000, param_bytes: 4000}}
stages: [2, 4]
microbatches: [4]
schedule: [gpipe]
"""


def test_a_scheduler_port_that_never_answers_is_one_line_within_the_connect_timeout(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SMALL)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # the kernel completes connections; nobody reads or writes
        address = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pipesim", "sweep", str(spec), "--out", str(tmp_path / "t.csv"),
                               "--scheduler", address, "--worker-timeout", "5"], capture_output=True, text=True,
                              cwd=ROOT, timeout=120)
    assert time.monotonic() - started < 60
    assert done.returncode == 2 and done.stderr == (
        f"pipesim: error: scheduler='{address}': did not answer within 10 s (a port that takes connections but is "
        "not a Dask scheduler?)\n")


def test_a_ctrl_c_that_a_library_thread_takes_while_held_is_raised_at_release() -> None:
    stop = threading.Event()
    library = threading.Thread(target=stop.wait)  # started with SIGINT open, as a BLAS pool at numpy's import
    library.start()
    # Ctrl-C's default handler, even where the suite runs under a shell that ignores SIGINT (a job
    # started with ``&`` in a script): with SIGINT ignored, the hold rightly ignores the press too.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        held = CtrlCHeld().__enter__()
        os.kill(os.getpid(), signal.SIGINT)  # the main thread blocks it now: the kernel gives it to `library`
        time.sleep(0.2)
        with pytest.raises(KeyboardInterrupt):
            held.release()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)
        stop.set()
        library.join()


def test_ctrl_c_while_the_embedded_cluster_starts_prints_one_line(tmp_path: Path) -> None:
    spec = tmp_path / "heavy.yaml"
    # K = 1024, 64 times the shared heavy spec's: predicted work past local.CLUSTER_FROM_OPS, so the cluster
    # starts at once, in the background, and the sweep would run on long after it, were the press lost (as it
    # was when a library's thread that did not block SIGINT took it under SIG_IGN).
    spec.write_text(HEAVY_SPEC.replace("minibatches: [16]", "minibatches: [1024]"))
    out = tmp_path / "results.csv"
    command = [sys.executable, "-m", "pipesim", "sweep", str(spec), "--out", str(out), "--workers", "2"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                               start_new_session=True,  # its own group, as a terminal's foreground job
                               preexec_fn=default_sigint)
    try:
        sweep = psutil.Process(process.pid)
        deadline = time.monotonic() + 120
        while not _workers(sweep) and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.01)
        assert _workers(sweep), "the sweep never started its cluster"
        started = [child.pid for child in _children(sweep)]
        os.killpg(process.pid, signal.SIGINT)  # the first worker is starting now; one press must do
        _, stderr = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 130
    assert stderr == f"pipesim: interrupted; finished points are kept in {out}.parts (rerun with --resume)\n"
    time.sleep(1)
    assert not [pid for pid in started if _alive(pid)]


def _children(process: psutil.Process) -> list[psutil.Process]:
    """The processes below ``process`` now (one that exits while they are listed is left out)."""
    children = []
    for pid in {child.pid for child in psutil.process_iter(["pid"])}:
        try:
            child = psutil.Process(pid)
            if process.pid in {parent.pid for parent in child.parents()}:
                children.append(child)
        except psutil.Error:
            continue
    return children


def _workers(process: psutil.Process) -> list[psutil.Process]:
    """The Dask worker processes that ``process`` started: multiprocessing's spawned interpreters, or
    the processes its fork server forked (they keep the server's command line; the server is the
    one whose parent is ``process``)."""
    found = []
    for child in _children(process):
        try:
            command = " ".join(child.cmdline())
            if "spawn_main" in command or ("multiprocessing.forkserver" in command and child.ppid() != process.pid):
                found.append(child)
        except psutil.Error:
            continue
    return found


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs still: a process that exits between two looks is gone, not an error."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
