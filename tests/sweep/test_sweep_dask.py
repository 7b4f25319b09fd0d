"""Sweeps on real embedded Dask clusters, uninterrupted and interrupted (external clusters: test_sweep_external.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest

from pipesim.sweep import COLUMNS, read_table, run_sweep
from child_signals import default_sigint
from sweep_specs import reference_sweep, spec_fixture

SPEC = """\
profile: {uniform: {layers: 16, forward_ms: 1.0, backward_ms: 2.0, activation_bytes: 1000000, param_bytes: 4000000}}
bandwidth: [10GB/s, 100GB/s]
latency: [5us]
stages: [4, 8]
microbatches: [4, 64, 256, 512]
minibatches: [16]
schedule: [gpipe, 1f1b, pipedream, 2bw, pipemare]
engine: des  # with 16 minibatches of up to 512 microbatches the sweep lasts seconds: an interruption lands midway
"""
NUM_POINTS = 2 * 2 * 4 * 5


spec_path = spec_fixture(SPEC)


@pytest.fixture(scope="module")
def reference(spec_path: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """The uninterrupted sweep on the embedded LocalCluster."""
    out, summary = reference_sweep(spec_path, tmp_path_factory)
    assert summary.num_points == summary.num_run == NUM_POINTS and summary.num_batches > 2
    assert summary.num_here == 0 and summary.startup_s > 0, summary
    return out, read_table(out)


def test_embedded_sweep_writes_one_sorted_row_per_point(reference: tuple[Path, Any]) -> None:
    out, frame = reference
    assert list(frame.columns) == list(COLUMNS)
    assert frame["point"].tolist() == list(range(NUM_POINTS))
    assert not Path(f"{out}.parts").exists()
    errors = frame[frame["error"].notna()]
    # 2bw needs m >= p: p=8 with m=4 fails, once per bandwidth; the row says why.
    assert len(errors) == 2 and set(errors["schedule"]) == {"2bw"}
    assert errors["error"].str.contains("must be >= num_stages for 2bw").all()
    ok = frame[frame["error"].isna()]
    assert (ok["iteration_time_s"] > 0).all() and set(ok["engine"]) <= {"des", "analytic"}
    flush = ok[ok["schedule"].isin(["gpipe", "1f1b"])]
    assert (flush["weight_versions_max"] == 1).all()
    assert (ok[ok["schedule"] == "2bw"]["weight_versions_max"] == 2).all()
    assert pq.read_schema(out).metadata[b"pipesim.sweep.digest"]


def sweep_process(spec_path: Path, out: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pipesim", "sweep", str(spec_path), "--out", str(out), "--workers", "2",
         "--batch-size", "1", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=default_sigint,
    )


def wait_for_chunks(parts: Path, count: int, process: subprocess.Popen[str]) -> int:
    deadline = time.monotonic() + 120
    while True:
        found = len(list(parts.glob("chunk-*.parquet"))) if parts.exists() else 0
        if found >= count:
            return found
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no chunks were written"
        time.sleep(0.02)


def finished_points(parts: Path) -> set[int]:
    done: set[int] = set()
    for chunk in parts.glob("chunk-*.parquet"):
        done.update(pq.read_table(chunk).column("point").to_pylist())
    return done


def test_an_interrupted_sweep_resumes_to_exactly_the_uninterrupted_table(
    spec_path: Path, reference: tuple[Path, Any], tmp_path: Path
) -> None:
    out = tmp_path / "results.parquet"
    parts = Path(f"{out}.parts")
    # 1. Ctrl-C midway: the finished chunks stay, the table is not written.
    first = sweep_process(spec_path, out)
    wait_for_chunks(parts, 3, first)
    first.send_signal(signal.SIGINT)
    _, stderr = first.communicate(timeout=120)
    assert first.returncode == 130, stderr
    assert "rerun with --resume" in stderr and stderr.count("\n") == 1
    assert not out.exists()
    after_interrupt = finished_points(parts)
    assert 3 <= len(after_interrupt) < NUM_POINTS
    # 2. Without --resume the chunks are refused, not overwritten.
    refused = subprocess.run([sys.executable, "-m", "pipesim", "sweep", str(spec_path), "--out", str(out)],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "pass --resume" in refused.stderr and refused.stderr.count("\n") == 1
    # 3. Resume, then kill everything (sweep and workers) with SIGKILL: no finished point is lost.
    second = sweep_process(spec_path, out, "--resume")
    wait_for_chunks(parts, len(list(parts.glob("chunk-*.parquet"))) + 3, second)
    os.killpg(second.pid, signal.SIGKILL)
    second.communicate(timeout=60)
    after_kill = finished_points(parts)
    assert after_interrupt < after_kill and len(after_kill) < NUM_POINTS
    assert not out.exists()
    # 4. Resume to the end: the same table, byte for byte, as the uninterrupted run.
    third = sweep_process(spec_path, out, "--resume")
    stdout, stderr = third.communicate(timeout=300)
    assert third.returncode == 0, stderr
    assert f"{NUM_POINTS - len(after_kill)} simulated, {len(after_kill)} resumed" in stdout
    assert not parts.exists()
    pd.testing.assert_frame_equal(read_table(out), reference[1])
    assert out.read_bytes() == reference[0].read_bytes()


def test_embedded_workers_keep_freed_memory_instead_of_trimming_it() -> None:
    """Dask's default (trim at 64 KiB) made the workers fault every point's columns in again."""
    from pipesim.allocator import KEEP_BYTES
    from pipesim.sweep.dask_cluster import dask_client

    def thresholds() -> tuple[str | None, str | None]:
        return os.environ.get("MALLOC_TRIM_THRESHOLD_"), os.environ.get("MALLOC_MMAP_THRESHOLD_")

    with dask_client(workers=1, scheduler=None) as client:
        seen = client.run(thresholds)
    assert list(seen.values()) == [(str(KEEP_BYTES), str(KEEP_BYTES))]


def _what_the_worker_holds() -> tuple[bool, bool]:
    """On a worker, before any task: the preload imported, numba's main kernel loaded."""
    from pipesim import jit
    from pipesim.engine import kernel

    loaded = jit.AVAILABLE and kernel.solve._compiled is not None and bool(kernel.solve.dispatcher().signatures)
    return "pipesim.sweep.worker_preload" in sys.modules, loaded


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are forked on Linux only")
def test_embedded_workers_start_with_pipesim_and_its_kernels_loaded() -> None:
    """Forked from the fork server that imported ``worker_preload``: nothing left to import or load
    (a spawned worker has neither before its first task)."""
    from pipesim import jit
    from pipesim.sweep.dask_cluster import dask_client

    with dask_client(workers=2, scheduler=None) as client:
        held = list(client.run(_what_the_worker_holds).values())
    assert held == [(True, jit.AVAILABLE and jit.setting_from_environment() != "never")] * 2


def _fork_server() -> Any:
    from multiprocessing import forkserver

    return forkserver._forkserver  # type: ignore[attr-defined]


def _sigint_blocked() -> bool:
    return signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, set())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are forked on Linux only")
def test_the_fork_server_ends_with_the_cluster_and_what_it_was_asked_to_preload_is_put_back() -> None:
    """Nothing forked later in the user's process comes from a server that holds the sweep's modules,
    its environment and a blocked Ctrl-C; a second cluster gets a server of its own, with the
    environment as it is then."""
    from pipesim.sweep.dask_cluster import dask_client

    import multiprocessing

    server = _fork_server()
    assert server._forkserver_pid is None
    found = list(server._preload_modules)
    multiprocessing.set_forkserver_preload(["json"])  # the program's own list (Dask's first use would replace it)
    try:
        with dask_client(workers=1, scheduler=None) as client:
            first = server._forkserver_pid
            assert first is not None and list(client.run(_what_the_worker_holds).values())[0][0]
        assert server._forkserver_pid is None and list(server._preload_modules) == ["json"]
    finally:
        multiprocessing.set_forkserver_preload(found)
    with pytest.raises(ProcessLookupError):
        os.kill(first, 0)
    os.environ["PIPESIM_TEST_LATER"] = "seen"
    try:
        with dask_client(workers=1, scheduler=None) as client:
            assert server._forkserver_pid not in (None, first)
            assert list(client.run(os.environ.get, "PIPESIM_TEST_LATER").values()) == ["seen"]
    finally:
        del os.environ["PIPESIM_TEST_LATER"]
    assert server._forkserver_pid is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are forked on Linux only")
def test_a_fork_server_started_elsewhere_in_the_program_is_left_alone_and_the_workers_spawned() -> None:
    """Its children would lack the preload and take Ctrl-C: the cluster spawns its workers (SIGINT
    blocked in them all the same, as the sweep's start holds it), and the server runs on after."""
    import multiprocessing

    from pipesim.sweep.cluster import CtrlCHeld
    from pipesim.sweep.dask_cluster import dask_client

    server = _fork_server()
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([])
    child = context.Process(target=time.sleep, args=(0,))
    child.start()
    child.join()
    theirs = server._forkserver_pid
    try:
        assert theirs is not None
        with CtrlCHeld(), dask_client(workers=1, scheduler=None) as client:
            held = list(client.run(_what_the_worker_holds).values())
            blocked = list(client.run(_sigint_blocked).values())
        assert held[0][0] is False and blocked == [True]
        assert server._forkserver_pid == theirs
        os.kill(theirs, 0)  # still running
    finally:
        server._stop()


def test_a_bad_jit_setting_does_not_end_the_fork_server_the_workers_come_from(monkeypatch: pytest.MonkeyPatch) -> None:
    """The preload meets ``PIPESIM_JIT=bogus`` and leaves it for the sweep to report; the workers start."""
    from pipesim.sweep.dask_cluster import dask_client

    monkeypatch.setenv("PIPESIM_JIT", "bogus")
    with dask_client(workers=1, scheduler=None) as client:
        assert list(client.run(os.environ.get, "PIPESIM_JIT").values()) == ["bogus"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are forked on Linux only")
def test_clusters_within_fork_server_kept_share_one_server_that_ends_with_the_block() -> None:
    """A search starts a cluster a round: their workers fork from one preloaded server."""
    from pipesim.sweep.dask_cluster import dask_client, fork_server_kept

    server = _fork_server()
    pids = []
    with fork_server_kept():
        for _ in range(2):
            with dask_client(workers=1, scheduler=None) as client:
                assert list(client.run(_what_the_worker_holds).values())[0][0]
                pids.append(server._forkserver_pid)
        assert server._forkserver_pid == pids[0]
    assert pids[0] is not None and pids == [pids[0]] * 2 and server._forkserver_pid is None
