"""Where a sweep's points run: in this process while a Dask cluster would cost more than it saves.

Starting an embedded cluster of W workers costs about ``CLUSTER_START_S`` and saves, at best,
``(1 - 1/W)`` of the serial time of the points it runs. So the sweep runs its batches in this
process, one after another, and from the third on projects the serial time of the rest from the
time the batches after the first took per unit of ``point_cost``; once the cluster would save
more than it costs, the rest goes to Dask. The rows are the same either way (a point's row does
not depend on where it ran); only the wall time differs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from pipesim.sweep.points import PointRunner
from pipesim.sweep.store import ResultStore

#: Seconds an embedded LocalCluster of 2 workers takes to start and take its first task on the
#: 2-core benchmark machine (benchmarks/RESULTS.md, "Sweeps": 1.2-2 s).
CLUSTER_START_S = 2.0

#: Rows simulated here are written as one chunk at most this often (seconds): a chunk costs a
#: Parquet write of a few ms, which would dominate a sweep of small points written batch by batch,
#: while an interruption loses at most this much work.
CHUNK_EVERY_S = 0.5

#: Called with (points done, points in the sweep, where they run now: "" before any, ``HERE`` or ``ON_DASK``).
Progress = Callable[[int, int, str], None]
HERE, ON_DASK = "here", "on Dask"


def point_cost(point: dict[str, Any]) -> int:
    """Rough work of a point: its compute ops, p * m * K (forward and backward each)."""
    return int(point["num_stages"]) * int(point["num_microbatches"]) * int(point["num_minibatches"])


def cluster_pays(spent_s: float, done_cost: int, rest_cost: int, num_workers: int) -> bool:
    """Whether a cluster of ``num_workers`` would finish the rest sooner than this process, given
    ``spent_s`` seconds for work of cost ``done_cost`` so far (projected linearly in cost)."""
    if num_workers < 2 or rest_cost <= 0:
        return False
    projected_s = spent_s / max(done_cost, 1) * rest_cost
    return projected_s * (1 - 1 / num_workers) > CLUSTER_START_S


def run_here(runner: PointRunner, batches: Sequence[list[dict[str, Any]]], store: ResultStore, *,
             num_workers: int, progress: Progress | None, total: int, chunk_every_s: float = CHUNK_EVERY_S) -> int:
    """Simulate ``batches`` in order in this process until a cluster of ``num_workers`` would pay
    for the rest (``cluster_pays``); the rows go to ``store`` in chunks, one at most every
    ``chunk_every_s`` seconds (0: one per batch, as on Dask).

    Returns:
        the number of batches run here (the rest are Dask's).

    Raises:
        SweepFailedError: a chunk could not be written (the earlier chunks are kept).
    """
    rest_cost = sum(point_cost(point) for batch in batches for point in batch)
    # The first batch pays the one-time costs (imports, numba's kernels loaded), as each Dask worker
    # would: the projection reads the batches after it.
    done_cost, spent_s, ran = 0, 0.0, 0
    pending: list[dict[str, Any]] = []
    written = time.perf_counter()
    try:
        for batch in batches:
            if ran > 1 and cluster_pays(spent_s, done_cost, rest_cost, num_workers):
                break
            started = time.perf_counter()
            pending += runner.run_batch(batch)
            cost = sum(point_cost(point) for point in batch)
            if ran:
                spent_s, done_cost = spent_s + time.perf_counter() - started, done_cost + cost
            rest_cost, ran = rest_cost - cost, ran + 1
            if time.perf_counter() - written >= chunk_every_s:
                _flush(store, pending, progress, total)
                written = time.perf_counter()
    except KeyboardInterrupt:
        _flush(store, pending, progress, total)  # the finished points are kept
        raise
    _flush(store, pending, progress, total)
    return ran


def _flush(store: ResultStore, pending: list[dict[str, Any]], progress: Progress | None, total: int) -> None:
    """Write ``pending`` as one chunk (then empty it) and report progress."""
    if not pending:
        return
    store.write_chunk(pending)
    pending.clear()
    if progress:
        progress(len(store.done), total, HERE)
