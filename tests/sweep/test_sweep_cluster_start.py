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
import time
from pathlib import Path

import pytest

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


@pytest.mark.xfail(reason="known bug, issue 37 left open: while the cluster starts, SIGINT is ignored process-wide "
                          "and a press delivered to a thread that does not block it is dropped; on a fresh clone "
                          "(cold numba cache) both presses were lost", strict=False)
def test_ctrl_c_while_the_embedded_cluster_starts_prints_one_line(tmp_path: Path) -> None:
    spec = tmp_path / "heavy.yaml"
    # K = 1024, 64 times the shared heavy spec's: predicted work past local.CLUSTER_FROM_OPS, so the cluster
    # starts at once, in the background, and the sweep outlasts the 15 s before the second press on a quiet
    # host (K = 128 did not, on a quiet 2-core CI host), should the first press land in a library's thread
    # that ignores it, as it does today.
    spec.write_text(HEAVY_SPEC.replace("minibatches: [16]", "minibatches: [1024]"))
    out = tmp_path / "results.csv"
    command = [sys.executable, "-m", "pipesim", "sweep", str(spec), "--out", str(out), "--workers", "2"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                               start_new_session=True)  # its own group, as a terminal's foreground job
    try:
        sweep = psutil.Process(process.pid)
        deadline = time.monotonic() + 120
        while not _workers(sweep) and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.01)
        assert _workers(sweep), "the sweep never started its cluster"
        started = [child.pid for child in _children(sweep)]
        os.killpg(process.pid, signal.SIGINT)  # the first worker is starting now
        try:
            _, stderr = process.communicate(timeout=15)
        except subprocess.TimeoutExpired:  # the Ctrl-C went to a library's thread and was dropped: press again
            os.killpg(process.pid, signal.SIGINT)
            _, stderr = process.communicate(timeout=60)
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
    """The Dask worker processes that ``process`` started (multiprocessing's spawned interpreters)."""
    found = []
    for child in _children(process):
        try:
            if any("spawn_main" in part for part in child.cmdline()):
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
