"""Where a sweep's points run: in this process while a Dask cluster would cost more than it saves.

Starting an embedded cluster of W workers costs about ``CLUSTER_START_S`` and saves, at best,
``(1 - 1/W)`` of the serial time of the points it runs. So the sweep runs its points in this
process, one after another, and projects the serial time of the rest from the points so far (the
first one, which pays the one-time imports and kernel loads, not counted): per point and per unit
of ``point_cost`` (medians), the larger of the two, since small points cost more per unit.
Once the cluster would save more than it costs, the rest goes to Dask. The rows are the same
either way (a point's row does not depend on where it ran); only the wall time differs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any, Protocol

from pipesim.errors import interrupted
from pipesim.sweep.points import PointRunner
from pipesim.sweep.store import ResultStore

#: Seconds an embedded LocalCluster of 2 workers takes to start and take its first task on the
#: 2-core benchmark machine (benchmarks/RESULTS.md, "Sweeps": 1.2-3 s).
CLUSTER_START_S = 2.0

#: Rows simulated here are written as one chunk at most this often (seconds): a chunk costs a
#: Parquet write of a few ms, which would dominate a sweep of small points written point by point,
#: while an interruption loses at most this much work.
CHUNK_EVERY_S = 0.5

#: Points measured (after the first) before the first projection; it is made again at twice as many.
MEASURED_POINTS = 8

#: Where points run, as progress says it ("" before any run).
HERE, ON_DASK = "here", "on Dask"
#: A point's own cost beyond its ops, in units of ``point_cost`` (planning, lowering, the metrics'
#: calls): fitted to the 10,080-point benchmark sweep's progress (benchmarks/RESULTS.md, sweeps).
POINT_OVERHEAD_COST = 10_000


class Progress(Protocol):
    """Called with the points done, the points in the sweep, where they run now ("", ``HERE`` or
    ``ON_DASK``) and the share of the work done (``WorkDone``)."""

    def __call__(self, done: int, total: int, where: str, work: float | None = None) -> None: ...  # noqa: D102


class WorkDone:
    """How much of a sweep's work is done: each point weighs its ``point_cost`` plus
    ``POINT_OVERHEAD_COST``. A sweep's points differ in size by orders of magnitude and run in
    shared-work order, so time left follows this share, not the count of points."""

    def __init__(self, points: Sequence[dict[str, Any]]) -> None:
        self.cost = {point["point"]: point_cost(point) + POINT_OVERHEAD_COST for point in points}
        self.total = sum(self.cost.values())
        self.done = 0

    def add(self, rows: Sequence[dict[str, Any]]) -> float:
        """Count the points of ``rows`` as done; the share of the work done."""
        self.done += sum(self.cost.get(row["point"], 0) for row in rows)
        return self.share()

    def share(self) -> float:
        """The share of the work done, 0 to 1 (1 when there was nothing to do)."""
        return self.done / self.total if self.total else 1.0


def point_cost(point: dict[str, Any]) -> int:
    """Rough work of a point: its compute ops, p * m * K (forward and backward each)."""
    return int(point["num_stages"]) * int(point["num_microbatches"]) * int(point["num_minibatches"])


def cluster_pays(measured: Sequence[tuple[float, int]], rest_points: int, rest_cost: int, num_workers: int) -> bool:
    """Whether a cluster of ``num_workers`` would finish the rest (``rest_points`` of cost ``rest_cost``)
    sooner than this process, from the (seconds, cost) of points measured here: the median seconds per
    point and per unit of cost (a median, so that one point that loaded a kernel does not decide)."""
    if num_workers < 2 or rest_points <= 0 or not measured:
        return False
    per_point = statistics.median(seconds for seconds, _ in measured)
    per_cost = statistics.median(seconds / max(cost, 1) for seconds, cost in measured)
    projected_s = max(per_point * rest_points, per_cost * rest_cost)
    return projected_s * (1 - 1 / num_workers) > CLUSTER_START_S


def run_here(runner: PointRunner, points: Sequence[dict[str, Any]], store: ResultStore, *,
             num_workers: int, progress: Progress | None, total: int, work: WorkDone,
             batch_size: int | None = None) -> tuple[int, int]:
    """Simulate ``points`` in order in this process until a cluster of ``num_workers`` would pay
    for the rest (``cluster_pays``); the rows go to ``store`` in chunks, of ``batch_size`` points
    when given, else one at most every ``CHUNK_EVERY_S`` seconds.

    Returns:
        the number of points run here (the rest are Dask's) and of chunks written.

    Raises:
        SweepFailedError: a chunk could not be written (the earlier chunks are kept).
    """
    rest_cost = sum(point_cost(point) for point in points)
    measured: list[tuple[float, int]] = []
    check_at, chunks, here = MEASURED_POINTS, 0, 0
    pending: list[dict[str, Any]] = []
    written = time.perf_counter()
    try:
        for point in points:
            if len(measured) >= check_at:  # at 8, 16, 32, ... points measured
                if cluster_pays(measured, len(points) - here, rest_cost, num_workers):
                    break
                check_at *= 2
            started = time.perf_counter()
            pending.append(runner.run(point))
            cost = point_cost(point)
            if here:
                measured.append((time.perf_counter() - started, cost))
            rest_cost, here = rest_cost - cost, here + 1
            full = len(pending) >= batch_size if batch_size else time.perf_counter() - written >= CHUNK_EVERY_S
            if full:
                chunks += _flush(store, pending, progress, total, work)
                written = time.perf_counter()
    except BaseException as error:  # noqa: BLE001 - Ctrl-C may surface as another error (errors.interrupted)
        if not interrupted(error):
            raise
        _flush(store, pending, progress, total, work)  # the finished points are kept
        raise KeyboardInterrupt from error
    chunks += _flush(store, pending, progress, total, work)
    return here, chunks


def _flush(store: ResultStore, pending: list[dict[str, Any]], progress: Progress | None, total: int,
           work: WorkDone) -> int:
    """Write ``pending`` as one chunk (then empty it) and report progress; the chunks written (0 or 1)."""
    if not pending:
        return 0
    store.write_chunk(pending)
    share = work.add(pending)
    pending.clear()
    if progress:
        progress(len(store.done), total, HERE, share)
    return 1
