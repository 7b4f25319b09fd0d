"""Where a sweep's points run: in this process until a Dask cluster is ready, or for good where one would not pay.

Starting an embedded cluster of W workers costs about ``CLUSTER_START_S`` and saves, at best,
``(1 - 1/W)`` of the serial time of the points it runs. A sweep whose predicted work
(``batches.point_cost``) is at least ``CLUSTER_FROM_OPS`` starts its cluster at once, in the
background (``dask_cluster.DaskCluster``); a smaller one runs its points here, one after another, and
projects the serial time of the rest from the points so far (the first one, which pays the
one-time imports and kernel loads, not counted): per point and per unit of cost (medians), the
larger of the two, since small points cost more per unit. Once a cluster would save more than it
costs, it starts in the background. Either way points go on running here, cheapest first, until
the cluster is ready, and the rest go to Dask. The rows are the same wherever a point ran.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any, Protocol

from pipesim.errors import interrupted
from pipesim.sweep.batches import point_cost
from pipesim.sweep.dask_cluster import DaskCluster
from pipesim.sweep.points import PointRunner
from pipesim.sweep.store import ResultStore

#: Seconds an embedded LocalCluster of 2 workers takes to start and take its first task on the
#: 2-core benchmark machine (benchmarks/RESULTS.md, "Sweeps": 1.2-3 s).
CLUSTER_START_S = 2.0

#: Predicted work (ops and each point's overhead, ``batches.point_cost``) from which a sweep starts its
#: embedded cluster at once: about 5 s of one core of the 2-core benchmark machine (0.1 us per op,
#: benchmarks/RESULTS.md, "Sweeps"), of which 2 workers save more than ``CLUSTER_START_S``.
CLUSTER_FROM_OPS = 50_000_000

#: Rows simulated here are written as one chunk at most this often (seconds): a chunk costs a
#: Parquet write of a few ms, which would dominate a sweep of small points written point by point,
#: while an interruption loses at most this much work.
CHUNK_EVERY_S = 0.5

#: Points measured (after the first) before the first projection; it is made again at twice as many.
MEASURED_POINTS = 8

#: Where points run, as progress says it ("" before any run).
HERE, ON_DASK = "here", "on Dask"


class Progress(Protocol):
    """Called with the points done, the points in the sweep, where they run now ("", ``HERE`` or
    ``ON_DASK``) and the share of the work done (``WorkDone``)."""

    def __call__(self, done: int, total: int, where: str, work: float | None = None) -> None: ...  # noqa: D102


class WorkDone:
    """How much of a sweep's work is done: each point weighs its predicted cost (``point_cost``).
    A sweep's points differ in size by orders of magnitude and do not run in order of size, so
    time left follows this share, not the count of points."""

    def __init__(self, points: Sequence[dict[str, Any]]) -> None:
        self.cost = {point["point"]: point_cost(point) for point in points}
        self.total = sum(self.cost.values())
        self.done = 0

    def add(self, rows: Sequence[dict[str, Any]]) -> float:
        """Count the points of ``rows`` as done; the share of the work done."""
        self.done += sum(self.cost.get(row["point"], 0) for row in rows)
        return self.share()

    def share(self) -> float:
        """The share of the work done, 0 to 1 (1 when there was nothing to do)."""
        return self.done / self.total if self.total else 1.0


def cluster_at_once(points: Sequence[dict[str, Any]]) -> bool:
    """Whether the predicted work of ``points`` is enough to start a cluster before measuring any."""
    return sum(point_cost(point) for point in points) >= CLUSTER_FROM_OPS


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
             cluster: DaskCluster | None, num_workers: int, progress: Progress | None, total: int, work: WorkDone,
             batch_size: int | None = None) -> tuple[int, int]:
    """Simulate ``points`` in order in this process until ``cluster`` is ready; start it once a
    cluster of ``num_workers`` would pay for the rest (``cluster_pays``) if it was not started
    before. Without a cluster, every point. The rows go to ``store`` in chunks, of ``batch_size``
    points when given, else one at most every ``CHUNK_EVERY_S`` seconds.

    Returns:
        the number of points run here (the rest are the cluster's) and of chunks written.

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
            if cluster is not None and cluster.is_started:
                if cluster.is_ready():
                    break
            elif cluster is not None and len(measured) >= check_at:  # at 8, 16, 32, ... points measured
                if cluster_pays(measured, len(points) - here, rest_cost, num_workers):
                    cluster.start()
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
