"""Sweeps under real faults: Dask workers or the scheduler SIGKILLed mid-sweep, and a full disk; nothing finished is lost.

Every cluster here is real: a scheduler and single-threaded workers started by the test as
their own processes on 127.0.0.1 (ports chosen by the OS), killed with SIGKILL. The disk is
real too: a per-file size limit (RLIMIT_FSIZE, EFBIG on the write) and, where user namespaces
allow it, a small tmpfs that fills up (ENOSPC). Each case ends with ``--resume`` and compares
the table with an uninterrupted sweep's, byte for byte.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipesim.sweep import read_table, run_sweep, write_table
from sweep_specs import reference_sweep, spec_fixture, user_namespaces_work

SPEC = """\
profile: {uniform: {layers: 16, forward_ms: 1.0, backward_ms: 2.0, activation_bytes: 1000000, param_bytes: 4000000}}
bandwidth: [10GB/s]
latency: [5us]
stages: [2, 3, 8, 9]
microbatches: [8, 1024]
minibatches: [32]
schedule: [gpipe, 1f1b, pipedream, 2bw, pipemare]
engine: des
where: "stages < 8 and microbatches == 8 or stages >= 8 and microbatches == 1024"
"""
# A sweep runs its points by stages first (pipesim.sweep.points.SHARED_WORK, kept by Dask through falling task
# priorities; without them, about half the tries ran heavy points first and finished before the kill): the ten
# cheap ones (p <= 3, m=8) finish first, and the ten heavy ones (p >= 8, m=1024, K=32: about half a second each on
# the DES, 3 s of work on two workers) are still running when a test kills a worker or the scheduler after three
# chunks, even where the sweep process, slowed by other load, writes its chunks late.
NUM_POINTS = 20
PYTHON = sys.executable


spec_path = spec_fixture(SPEC)


@pytest.fixture(scope="module")
def reference(spec_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The uninterrupted sweep's table, as Parquet and as CSV bytes."""
    out, _ = reference_sweep(spec_path, tmp_path_factory)
    csv = out.with_suffix(".csv")
    write_table(read_table(out), csv)
    return {".parquet": out.read_bytes(), ".csv": csv.read_bytes()}


class Cluster:
    """A Dask scheduler and workers, each its own process; every one is stopped by ``close``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.scheduler_file = folder / "scheduler.json"
        self.scheduler = self._start([PYTHON, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port",
                                      "0", "--no-dashboard", "--scheduler-file", str(self.scheduler_file)])
        self.workers: list[subprocess.Popen[bytes]] = []
        deadline = time.monotonic() + 60
        while not self.scheduler_file.exists() or not self.scheduler_file.read_text().strip():
            assert self.scheduler.poll() is None and time.monotonic() < deadline, "the scheduler did not start"
            time.sleep(0.05)
        self.address: str = json.loads(self.scheduler_file.read_text())["address"]

    def _start(self, command: list[str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def add_workers(self, count: int) -> None:
        """Start ``count`` single-threaded workers (no nanny: SIGKILL ends the worker itself) and wait for them."""
        from distributed import Client

        before = len(self.workers) - sum(worker.poll() is not None for worker in self.workers)
        for _ in range(count):
            self.workers.append(self._start([
                PYTHON, "-m", "distributed.cli.dask_worker", self.address, "--nworkers", "1", "--nthreads", "1",
                "--host", "127.0.0.1", "--no-dashboard", "--no-nanny"]))
        with Client(self.address, timeout="30s") as client:
            client.wait_for_workers(before + count, timeout=60)

    def close(self) -> None:
        """Stop the workers with SIGTERM, then SIGKILL whatever is left (the scheduler) and reap it.

        A worker that outlived its scheduler goes on with its batch and writes the chunk itself; on
        SIGTERM Dask lets the batch in hand finish and starts no other, so no write of the workers is
        cut short by the test's own clean-up (a SIGKILL could leave a temporary file behind that
        ``kept_points`` would blame on pipesim).
        """
        for worker in self.workers:
            if worker.poll() is None:
                worker.terminate()
        for worker in self.workers:
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(timeout=30)
        if self.scheduler.poll() is None:
            self.scheduler.kill()
        self.scheduler.wait(timeout=30)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A scheduler with two workers."""
    made = Cluster(tmp_path)
    try:
        made.add_workers(2)
        yield made
    finally:
        made.close()


def sweep(spec_path: Path, out: Path, *extra: str, **kwargs: object) -> subprocess.Popen[str]:
    """``pipesim sweep`` as its own process group (so a test can stop all of it)."""
    return subprocess.Popen([PYTHON, "-m", "pipesim", "sweep", str(spec_path), "--out", str(out), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            **kwargs)  # type: ignore[call-overload]


def finish(process: subprocess.Popen[str], timeout_s: float) -> tuple[int, str, str]:
    """Wait for a sweep; kill its whole group if it overruns (then fail)."""
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(f"the sweep did not end within {timeout_s} s")
    return process.returncode, stdout, stderr


def wait_for_chunks(parts: Path, count: int, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120
    while (len(list(parts.glob("chunk-*.parquet"))) if parts.exists() else 0) < count:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no chunks were written"
        time.sleep(0.02)


def kept_points(parts: Path) -> set[int]:
    """The points of every chunk, each chunk read whole (so each must be a readable Parquet file)."""
    points: list[int] = []
    for chunk in sorted(parts.glob("chunk-*.parquet")):
        points += pq.read_table(chunk).column("point").to_pylist()
    assert len(points) == len(set(points)), "a point is in two chunks"
    assert not list(parts.glob(".*.tmp")), "a temporary file was left behind"
    return set(points)


KILL_ATTEMPTS = 3


def interrupted_sweep(spec_path: Path, out: Path, tmp_path: Path, kill: Callable[[Cluster], None],
                      *extra: str) -> tuple[str, int, str, float]:
    """A sweep on a fresh scheduler with two workers, ``kill`` applied to the cluster once three chunks are on
    disk; the scheduler's address, the sweep's exit code and stderr, and its seconds from the kill to its end.

    The cheap points run first and the heavy ones leave seconds of work after the third chunk, but the sweep
    process shares the two cores with both workers and a scheduler, and under other load it can write its
    first chunks after every result has reached it; then the kill lands on a finished sweep. Such a try (exit
    0, the table written) tested nothing: it is run again on a fresh cluster, up to KILL_ATTEMPTS times, and
    the test fails when the kill never landed mid-sweep.
    """
    for attempt in range(KILL_ATTEMPTS):
        folder = tmp_path / f"cluster-{attempt}"
        folder.mkdir()
        cluster = Cluster(folder)
        try:
            cluster.add_workers(2)
            process = sweep(spec_path, out, "--scheduler", cluster.address, "--batch-size", "1", *extra)
            wait_for_chunks(Path(f"{out}.parts"), 3, process)
            kill(cluster)
            killed = time.monotonic()
            code, _, stderr = finish(process, 60)
            elapsed = time.monotonic() - killed
        finally:
            cluster.close()
        if code == 0 and out.exists() and not Path(f"{out}.parts").exists():
            out.unlink()
            continue
        return cluster.address, code, stderr, elapsed
    pytest.fail(f"in {KILL_ATTEMPTS} tries, every point had finished before the kill landed")


def resume_to_the_end(spec_path: Path, out: Path, reference: dict[str, bytes], kept: set[int]) -> None:
    """``--resume`` on a fresh embedded cluster completes the table to exactly the uninterrupted one."""
    code, stdout, stderr = finish(sweep(spec_path, out, "--resume", "--workers", "1"), 180)
    assert code == 0, stderr
    assert f"{NUM_POINTS - len(kept)} simulated, {len(kept)} resumed" in stdout
    assert not Path(f"{out}.parts").exists()
    assert out.read_bytes() == reference[out.suffix]


def test_a_killed_worker_is_replaced_by_the_other_and_the_sweep_completes(
    cluster: Cluster, spec_path: Path, reference: dict[str, bytes], tmp_path: Path
) -> None:
    out = tmp_path / "results.parquet"
    process = sweep(spec_path, out, "--scheduler", cluster.address, "--batch-size", "1")
    wait_for_chunks(Path(f"{out}.parts"), 3, process)
    cluster.workers[0].send_signal(signal.SIGKILL)
    code, stdout, stderr = finish(process, 120)
    assert cluster.workers[0].wait(timeout=10) == -signal.SIGKILL
    assert code == 0 and stderr == "", stderr  # Dask reran the lost batch on the other worker
    assert f"{NUM_POINTS} points ({NUM_POINTS} simulated" in stdout
    assert out.read_bytes() == reference[".parquet"]


def kill_every_worker(cluster: Cluster) -> None:
    for worker in cluster.workers:
        worker.send_signal(signal.SIGKILL)


def test_every_worker_killed_stops_after_the_worker_timeout_and_resume_completes(
    spec_path: Path, reference: dict[str, bytes], tmp_path: Path
) -> None:
    out, parts = tmp_path / "results.parquet", tmp_path / "results.parquet.parts"
    address, code, stderr, elapsed = interrupted_sweep(spec_path, out, tmp_path, kill_every_worker,
                                                       "--worker-timeout", "2")
    assert elapsed < 30
    assert code == 1 and len(stderr.splitlines()) == 1, stderr
    kept = kept_points(parts)
    assert f"the Dask scheduler at {address} has had no workers for 2 s" in stderr
    assert f"{len(kept)} finished points are kept in {parts} (rerun with --resume)" in stderr
    assert 3 <= len(kept) < NUM_POINTS and not out.exists()
    resume_to_the_end(spec_path, out, reference, kept)


@pytest.mark.slow
def test_workers_that_come_back_finish_the_sweep_after_all_were_killed(
    cluster: Cluster, spec_path: Path, reference: dict[str, bytes], tmp_path: Path
) -> None:
    """The points' inputs live in a task, not in scattered data, so losing every worker loses nothing."""
    out = tmp_path / "results.parquet"
    process = sweep(spec_path, out, "--scheduler", cluster.address, "--batch-size", "1")
    wait_for_chunks(Path(f"{out}.parts"), 3, process)
    for worker in cluster.workers:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
    cluster.add_workers(1)
    code, stdout, stderr = finish(process, 120)
    assert code == 0, stderr
    assert out.read_bytes() == reference[".parquet"]


def test_a_lost_scheduler_ends_the_sweep_naming_its_address_and_resume_completes(
    spec_path: Path, reference: dict[str, bytes], tmp_path: Path
) -> None:
    out, parts = tmp_path / "results.csv", tmp_path / "results.csv.parts"
    address, code, stderr, elapsed = interrupted_sweep(
        spec_path, out, tmp_path, lambda cluster: cluster.scheduler.send_signal(signal.SIGKILL))
    assert elapsed < 30, "the sweep hung on a dead scheduler"
    assert code == 1 and len(stderr.splitlines()) == 1, stderr
    assert stderr.startswith(f"pipesim: error: lost the Dask scheduler at {address}")
    kept = kept_points(parts)
    assert 3 <= len(kept) < NUM_POINTS and not out.exists()
    resume_to_the_end(spec_path, out, reference, kept)


def file_size_limit(limit: int) -> None:
    """In the child: files may not grow past ``limit`` bytes (writes fail with EFBIG; Python ignores SIGXFSZ)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


WIDE_SPEC = """\
profile: {uniform: {layers: 16, forward_ms: 1.0, backward_ms: 2.0, activation_bytes: 1000000, param_bytes: 4000000}}
bandwidth: [10GB/s, 100GB/s]
latency: [5us]
stages: [2, 4, 8, 16]
microbatches: [16, 32, 64, 128]
schedule: [gpipe, 1f1b, pipedream, 2bw, pipemare]
"""
FILE_LIMIT = 64 << 10  # chunks of 16 points are about 32-36 KB, the 160-row CSV about 137 KB


def test_a_write_refused_by_the_disk_keeps_the_chunks_and_resume_completes(tmp_path: Path) -> None:
    """Under a per-file size limit every chunk fits but the merged CSV does not: EFBIG on the real write."""
    spec = tmp_path / "wide.yaml"
    spec.write_text(WIDE_SPEC)
    expected = tmp_path / "uninterrupted.csv"
    run_sweep(spec, expected, workers=1, batch_size=16)
    assert expected.stat().st_size > 1.5 * FILE_LIMIT
    out, parts = tmp_path / "results.csv", tmp_path / "results.csv.parts"
    process = sweep(spec, out, "--workers", "1", "--batch-size", "16", preexec_fn=lambda: file_size_limit(FILE_LIMIT))
    code, _, stderr = finish(process, 120)
    assert code == 1 and len(stderr.splitlines()) == 1, stderr
    assert stderr == f"pipesim: error: cannot write {out}: File too large; 160 finished points are kept in {parts} " \
                     "(rerun with --resume)\n"
    assert max(chunk.stat().st_size for chunk in parts.glob("chunk-*")) < FILE_LIMIT
    assert not out.exists() and kept_points(parts) == set(range(160))
    code, stdout, stderr = finish(sweep(spec, out, "--resume"), 120)  # nothing left to run: no cluster starts
    assert code == 0 and "0 simulated, 160 resumed" in stdout, stderr
    assert out.read_bytes() == expected.read_bytes() and not parts.exists()


FULL_DISK_SCRIPT = """\
set -u
mount -t tmpfs -o size=96k tmpfs "$DISK"
"$PYTHON" -m pipesim sweep "$SPEC" --out "$DISK/results.parquet" --workers 2 --batch-size 1 \
    >"$STATE/full.out" 2>"$STATE/full.err"
echo $? >"$STATE/full.rc"
mkdir "$STATE/after"
cp -a "$DISK/." "$STATE/after/"
mount -o remount,size=64m "$DISK"
"$PYTHON" -m pipesim sweep "$SPEC" --out "$DISK/results.parquet" --workers 1 --resume \
    >"$STATE/resume.out" 2>"$STATE/resume.err"
echo $? >"$STATE/resume.rc"
cp "$DISK/results.parquet" "$STATE/"
"""


def test_a_full_filesystem_keeps_every_whole_chunk_and_resume_completes(
    spec_path: Path, reference: dict[str, bytes], tmp_path: Path
) -> None:
    """A 96 KiB tmpfs in a private mount namespace fills after a few ~31 KB chunks (ENOSPC); then it grows."""
    disk, state = tmp_path / "disk", tmp_path / "state"
    disk.mkdir()
    state.mkdir()
    if not user_namespaces_work(disk):
        pytest.skip("no unprivileged user and mount namespaces here (unshare -rm) to mount a small tmpfs")
    env = dict(os.environ, DISK=str(disk), STATE=str(state), PYTHON=PYTHON, SPEC=str(spec_path))
    subprocess.run(["unshare", "-rm", "sh", "-c", FULL_DISK_SCRIPT], env=env, check=True, timeout=300)
    stderr = (state / "full.err").read_text()
    assert (state / "full.rc").read_text().strip() == "1" and len(stderr.splitlines()) == 1, stderr
    parts = disk / "results.parquet.parts"
    assert stderr.startswith(f"pipesim: error: cannot write {parts}/chunk-")
    assert "No space left on device" in stderr and "(rerun with --resume)" in stderr
    kept = kept_points(state / "after" / "results.parquet.parts")
    assert 1 <= len(kept) < NUM_POINTS and not (state / "after" / "results.parquet").exists()
    assert f"{len(kept)} finished points are kept" in stderr
    assert (state / "resume.rc").read_text().strip() == "0", (state / "resume.err").read_text()
    assert f"{NUM_POINTS - len(kept)} simulated, {len(kept)} resumed" in (state / "resume.out").read_text()
    assert (state / "results.parquet").read_bytes() == reference[".parquet"]
