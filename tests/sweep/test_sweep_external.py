"""An external Dask cluster: a ``dask scheduler`` and ``dask worker`` processes started here on 127.0.0.1.

The commands are Dask's own, as the README's several-hosts section runs them (``python -m dask``
is the ``dask`` command of this interpreter). Sweeps on the cluster must give the embedded
cluster's table row for row (pandas ``equals``), whether the workers see the output folder and
write their chunks, or do not (another host without a shared file system, made here with a
private mount namespace over the folder) and send their rows back; a search must give the
outcomes it gives in one process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipesim.search import search
from pipesim.sweep import read_table, run_sweep
from sweep_specs import spec_fixture, user_namespaces_work

SPEC = """\
profile: {uniform: {layers: 16, forward_ms: 1.0, backward_ms: 2.0, activation_bytes: 1000000, param_bytes: 4000000}}
bandwidth: [10GB/s, 100GB/s]
stages: [2, 4, 8]
microbatches: [4, 16, 64]
minibatches: [4]
schedule: [gpipe, 1f1b, pipedream, 2bw, pipemare]
recompute: [false, true]
"""
NUM_POINTS = 2 * 3 * 3 * 5 * 2
PYTHON = sys.executable

spec_path = spec_fixture(SPEC)


class DaskProcesses:
    """A ``dask scheduler`` and its ``dask worker`` processes on 127.0.0.1; ``close`` stops them all."""

    def __init__(self, folder: Path) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []
        scheduler_file = folder / "scheduler.json"
        self.start([PYTHON, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                    "--scheduler-file", str(scheduler_file)])
        deadline = time.monotonic() + 60
        while not scheduler_file.exists() or not scheduler_file.read_text().strip():
            assert self.processes[0].poll() is None and time.monotonic() < deadline, "the scheduler did not start"
            time.sleep(0.05)
        self.address: str = json.loads(scheduler_file.read_text())["address"]
        assert self.address.startswith("tcp://127.0.0.1:")

    def start(self, command: list[str], **kwargs: Any) -> None:
        self.processes.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                               **kwargs))

    def worker_command(self) -> list[str]:
        return [PYTHON, "-m", "dask", "worker", self.address, "--nworkers", "1", "--nthreads", "1", "--host",
                "127.0.0.1", "--no-dashboard"]

    def wait_for_workers(self, count: int) -> None:
        from distributed import Client

        with Client(self.address, timeout="30s") as client:
            client.wait_for_workers(count, timeout=90)

    def close(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
        for process in reversed(self.processes):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``dask scheduler`` and two single-threaded ``dask worker`` processes (each with its nanny)."""
    cluster = DaskProcesses(tmp_path_factory.mktemp("scheduler"))
    try:
        for _ in range(2):
            cluster.start(cluster.worker_command())
        cluster.wait_for_workers(2)
        yield cluster.address
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def embedded(spec_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The table of the sweep on the embedded cluster (every point on Dask)."""
    out = tmp_path_factory.mktemp("embedded") / "results.parquet"
    run_sweep(spec_path, out, workers=2, in_process=False)
    return read_table(out)


def test_the_rows_are_the_same_on_any_number_of_workers(spec_path: Path, embedded: Any, tmp_path: Path) -> None:
    """One process alone, 1 and 3 embedded workers: the embedded 2 workers' table (pandas ``equals``)."""
    alone = run_sweep(spec_path, tmp_path / "alone.parquet", workers=1, in_process=True)
    one = run_sweep(spec_path, tmp_path / "one.parquet", workers=1, in_process=False)
    three = run_sweep(spec_path, tmp_path / "three.parquet", workers=3, in_process=False)
    assert (alone.num_here, one.num_here, three.num_here) == (NUM_POINTS, 0, 0)
    assert read_table(tmp_path / "alone.parquet").equals(embedded)
    assert read_table(tmp_path / "one.parquet").equals(embedded)
    assert read_table(tmp_path / "three.parquet").equals(embedded)
    assert len({batch.worker for batch in three.batches}) >= 2  # more than one worker took batches


def test_a_dask_scheduler_with_two_dask_workers_gives_the_embedded_clusters_rows(
    dask_cluster: str, spec_path: Path, embedded: Any, tmp_path: Path
) -> None:
    summary = run_sweep(spec_path, tmp_path / "results.parquet", scheduler=dask_cluster)
    frame = read_table(tmp_path / "results.parquet")
    assert summary.num_run == NUM_POINTS and summary.num_here == 0 and summary.where == "on Dask"
    assert len(frame) == NUM_POINTS and frame.equals(embedded)
    # Both workers see the output folder (one host): each wrote the chunks of the batches it ran.
    assert summary.batches and all(batch.chunk for batch in summary.batches)
    assert {batch.worker for batch in summary.batches} <= set(_worker_ids(dask_cluster))
    assert sorted(point for batch in summary.batches for point in batch.points) == list(range(NUM_POINTS))


def test_the_command_line_on_a_dask_scheduler_writes_the_same_table(
    dask_cluster: str, spec_path: Path, embedded: Any, tmp_path: Path
) -> None:
    out = tmp_path / "results.csv"
    done = subprocess.run([PYTHON, "-m", "pipesim", "sweep", str(spec_path), "--out", str(out), "--scheduler",
                           dask_cluster], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"{NUM_POINTS} simulated" in done.stdout and "on Dask" in done.stdout
    assert read_table(out).equals(embedded)


def test_a_search_on_a_dask_scheduler_gives_the_outcomes_of_one_process(dask_cluster: str) -> None:
    arguments: dict[str, Any] = {"device": "a100-40gb", "num_gpus": 8, "global_batch": 16, "seq_len": 2048}
    alone = search("llama3-8b", **arguments)
    on_dask = search("llama3-8b", **arguments, scheduler=dask_cluster)
    assert on_dask == alone and any(outcome.status == "simulated" for outcome in alone)


def test_workers_that_cannot_see_the_output_send_their_rows_and_the_table_is_the_same(
    spec_path: Path, embedded: Any, tmp_path: Path
) -> None:
    """A worker whose file system lacks the output folder (another host): an empty tmpfs over it, in a
    mount namespace of the worker's own; the sweep writes the chunks of the rows it sends."""
    hidden = tmp_path / "out"
    hidden.mkdir()
    if not user_namespaces_work(hidden):
        pytest.skip("no unprivileged user and mount namespaces here (unshare -rm) to hide a folder from a worker")
    cluster = DaskProcesses(tmp_path)
    try:
        script = 'mount -t tmpfs -o size=1m tmpfs "$HIDE" && exec "$@"'
        cluster.start(["unshare", "-rm", "sh", "-c", script, "sh", *cluster.worker_command(), "--no-nanny"],
                      env={**os.environ, "HIDE": str(hidden)})
        cluster.wait_for_workers(1)
        summary = run_sweep(spec_path, hidden / "results.parquet", scheduler=cluster.address)
    finally:
        cluster.close()
    assert summary.batches and not any(batch.chunk for batch in summary.batches)
    assert read_table(hidden / "results.parquet").equals(embedded)
    assert not (hidden / "results.parquet.parts").exists()


def _worker_ids(address: str) -> list[str]:
    """``host:pid`` of each worker at ``address``, as BatchDone names them."""
    from distributed import Client

    def identity() -> str:
        import socket

        return f"{socket.gethostname()}:{os.getpid()}"

    with Client(address, timeout="30s") as client:
        return list(client.run(identity).values())


def test_a_batch_writes_its_chunk_only_under_the_token_of_the_run_writing_the_folder(spec_path: Path,
                                                                                    tmp_path: Path) -> None:
    """A worker writes where it reads the run's token in the manifest; a task left over from a stopped
    run (the folder now another run's) or a folder it cannot see leaves the write to the sweep."""
    import pyarrow.parquet as pq

    from pipesim.sweep import COLUMNS, PointRunner, Resolved, load_spec
    from pipesim.sweep.parts import finished_chunks
    from pipesim.sweep.store import ResultStore
    from pipesim.sweep.tasks import run_batch

    resolved = Resolved(load_spec(spec_path))
    points = resolved.points()[:3]
    store = ResultStore(tmp_path / "results.parquet", resolved.digest(), len(points), COLUMNS, resume=False)
    runner = PointRunner(resolved)
    for folder, writer in ((store.parts, "another run"), (tmp_path / "elsewhere.parts", store.writer)):
        stale = run_batch(runner, points, str(folder), writer)
        assert (stale.chunk, stale.write_error) == ("", "") and stale.table.num_rows == 3
    assert finished_chunks(store.parts) == []
    done = run_batch(runner, points, str(store.parts), store.writer)
    assert finished_chunks(store.parts) == [Path(done.chunk)]
    assert pq.read_table(done.chunk).equals(done.table) and done.points == (0, 1, 2) and done.cpu_s > 0
