"""Running a sweep on Dask: points in cost-balanced batches, rows streamed to chunks as batches finish."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipesim.errors import ConfigError
from pipesim.sweep.points import COLUMNS, PointRunner
from pipesim.sweep.spec import Resolved, SweepSpec, load_spec
from pipesim.sweep.store import ResultStore, finished_digest, read_table

Progress = Callable[[int, int], None]
BATCHES_PER_WORKER = 32


@dataclass(frozen=True)
class SweepSummary:
    """What a sweep did.

    Attributes:
        out: the table written; num_points: points in the sweep; num_run: points simulated now;
        num_resumed: points taken from an interrupted run; num_errors: rows with an error;
        num_batches: Dask tasks submitted; wall_s: seconds, end to end; startup_s: of which
        starting the cluster or connecting to it.
    """

    out: Path
    num_points: int
    num_run: int
    num_resumed: int
    num_errors: int
    num_batches: int
    wall_s: float
    startup_s: float = 0.0


def point_cost(point: dict[str, Any]) -> int:
    """Rough work of a point: its compute ops, p * m * K (forward and backward each)."""
    return int(point["num_stages"]) * int(point["num_microbatches"]) * int(point["num_minibatches"])


def make_batches(points: Sequence[dict[str, Any]], num_batches: int) -> list[list[dict[str, Any]]]:
    """Split ``points`` (kept in order) into at most ``num_batches`` runs of about equal cost."""
    if not points:
        return []
    total = sum(point_cost(point) for point in points)
    target = total / max(1, min(num_batches, len(points)))
    batches: list[list[dict[str, Any]]] = [[]]
    cost = 0.0
    for point in points:
        if batches[-1] and cost >= target:
            batches.append([])
            cost = 0.0
        batches[-1].append(point)
        cost += point_cost(point)
    return batches


def run_batch(runner: PointRunner, points: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Dask task: simulate a batch of points on a worker."""
    return runner.run_batch(points)


@contextmanager
def dask_client(*, workers: int | None, scheduler: str | None) -> Iterator[Any]:
    """A Dask client: to ``scheduler`` when given, else to an embedded LocalCluster of ``workers``
    single-threaded processes listening on 127.0.0.1 (closed on exit).

    Raises:
        ConfigError: the scheduler cannot be reached, or ``workers < 1``.
    """
    from distributed import Client, LocalCluster

    if scheduler is not None:
        try:
            client = Client(scheduler, timeout="10s")  # type: ignore[no-untyped-call]
        except (OSError, TimeoutError, ValueError) as exc:
            raise ConfigError("scheduler", scheduler, f"cannot connect: {exc}") from None
        try:
            yield client
        finally:
            client.close()  # type: ignore[no-untyped-call]
        return
    count = workers if workers is not None else (os.cpu_count() or 1)
    if count < 1:
        raise ConfigError("workers", count, "must be >= 1")
    cluster = LocalCluster(  # type: ignore[no-untyped-call]
        n_workers=count, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None,
        silence_logs=logging.ERROR,
    )
    try:
        client = Client(cluster)  # type: ignore[no-untyped-call]
        try:
            yield client
        finally:
            client.close()  # type: ignore[no-untyped-call]
    finally:
        cluster.close()


def run_sweep(
    spec: SweepSpec | str | Path,
    out: str | Path,
    *,
    workers: int | None = None,
    scheduler: str | None = None,
    resume: bool = False,
    batch_size: int | None = None,
    progress: Progress | None = None,
    base_dir: Path | None = None,
) -> SweepSummary:
    """Simulate every point of a sweep on Dask and write one row per point to ``out``.

    Args:
        spec: a SweepSpec or the path of a YAML spec (relative profile paths resolve against
            its folder, or ``base_dir``).
        out: the table, ``.parquet`` or ``.csv``; rows sorted by point.
        workers: processes of the embedded cluster (default: the number of CPUs).
        scheduler: address of an existing Dask scheduler, e.g. ``tcp://127.0.0.1:8786``.
        resume: continue an interrupted sweep from the chunks in ``OUT.parts/``.
        batch_size: points per Dask task (default: about BATCHES_PER_WORKER tasks per worker).
        progress: called with (points done, total) at the start and after each batch.

    Raises:
        ConfigError: a bad spec, existing chunks without ``resume``, or no scheduler.
    """
    started = time.perf_counter()
    if isinstance(spec, str | Path):
        base_dir = base_dir or Path(spec).resolve().parent
        spec = load_spec(spec)
    if batch_size is not None and batch_size < 1:
        raise ConfigError("batch_size", batch_size, "must be >= 1")
    target = Path(out)
    resolved = Resolved(spec, base_dir=base_dir)
    points = resolved.points()
    digest = resolved.digest()
    if resume and not Path(f"{target}.parts").exists() and finished_digest(target) == digest:
        frame = read_table(target)
        if progress:
            progress(len(points), len(points))
        return SweepSummary(target, len(points), 0, len(points), int((frame["error"] != "").sum()), 0,
                            time.perf_counter() - started)
    store = ResultStore(target, digest, len(points), COLUMNS, resume=resume)
    resumed = len(store.done)
    todo = [point for point in points if point["point"] not in store.done]
    if progress:
        progress(len(store.done), len(points))
    batches: list[list[dict[str, Any]]] = []
    startup = 0.0
    if todo:
        connecting = time.perf_counter()
        with dask_client(workers=workers, scheduler=scheduler) as client:
            startup = time.perf_counter() - connecting
            num_workers = max(1, sum(client.nthreads().values()))
            if batch_size is not None:
                batches = [todo[i : i + batch_size] for i in range(0, len(todo), batch_size)]
            else:
                batches = make_batches(todo, BATCHES_PER_WORKER * num_workers)
            _submit_and_collect(client, PointRunner(resolved), batches, store, progress, len(points))
    frame = store.finish()
    return SweepSummary(
        out=target, num_points=len(points), num_run=len(todo), num_resumed=resumed,
        num_errors=int((frame["error"] != "").sum()), num_batches=len(batches), wall_s=time.perf_counter() - started,
        startup_s=startup,
    )


def _submit_and_collect(client: Any, runner: PointRunner, batches: list[list[dict[str, Any]]], store: ResultStore,
                        progress: Progress | None, total: int) -> None:
    from distributed import as_completed

    shared = client.scatter(runner, broadcast=True)
    futures = [client.submit(run_batch, shared, batch, pure=False) for batch in batches]
    try:
        for future in as_completed(futures):  # type: ignore[no-untyped-call]
            store.write_chunk(future.result())
            future.release()
            if progress:
                progress(len(store.done), total)
    except BaseException:
        client.cancel(futures)
        raise
