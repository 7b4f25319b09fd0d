"""Running a sweep: points here until its Dask cluster is ready, then on it in batches, heaviest first."""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipesim.errors import ConfigError
from pipesim.spec.provenance import command_line, file_identity
from pipesim.sweep.batches import plan_batches, point_cost
from pipesim.sweep.dask_cluster import DaskCluster
from pipesim.sweep.collect import Stopped, submit_and_collect
from pipesim.sweep.local import HERE, Progress, WorkDone, cluster_at_once, run_here
from pipesim.sweep.points import COLUMNS, SHARED_COSTS, SHARED_WORK, PointRunner, shared_work_order, sweep_kernels
from pipesim.sweep.spec import Resolved, SweepSpec, load_spec
from pipesim.sweep.parts import has_chunks
from pipesim.sweep.store import ResultStore, SweepFailedError, finished_digest, read_table, resume_hint
from pipesim.sweep.tasks import BatchDone, warm_points, warm_up

WORKER_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class SweepSummary:
    """What a sweep did.

    Attributes:
        out: the table written; num_points: points in the sweep; num_run: points simulated now;
        num_resumed: points taken from an interrupted run; num_errors: rows with an error;
        num_batches: chunks written here plus Dask tasks; wall_s: seconds, end to end;
        startup_s: seconds from starting the cluster (or connecting to it) to its workers being
            ready, while points ran here (0 without one);
        num_here: points simulated in this process (``pipesim.sweep.local``), the rest on Dask.
        phases: wall seconds of each phase in this process, from the start: ``expand`` (spec,
            points, result store), ``here`` (points run here), ``cluster`` (start to ready, beside
            ``here``), ``dask`` (first batch submitted to last recorded), ``merge`` (the table),
            ``close`` (the cluster, beside ``merge``), ``close wait`` (for the close, after the merge).
        batches: each Dask batch's timing (rows left out), in the order they finished.
        started_epoch_s: ``time.time()`` at the start, to place the batches' times.
        dropped: per chunk a resume found damaged (or repeated) and removed, a line naming it and
            why; its points were simulated again.
    """

    out: Path
    num_points: int
    num_run: int
    num_resumed: int
    num_errors: int
    num_batches: int
    wall_s: float
    startup_s: float = 0.0
    num_here: int = 0
    phases: dict[str, float] = field(default_factory=dict)
    batches: tuple[BatchDone, ...] = ()
    started_epoch_s: float = 0.0
    dropped: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        """Where the points ran: "in this process", "on Dask" or "in this process, then on Dask"."""
        if self.num_here == self.num_run:
            return "in this process"
        return "on Dask" if self.num_here == 0 else "in this process, then on Dask"

    @property
    def points_per_s(self) -> float:
        """Points simulated now per second of the whole run (cluster start and writes included)."""
        return self.num_run / self.wall_s if self.wall_s > 0 else 0.0


def make_batches(points: Sequence[dict[str, Any]], num_workers: int) -> list[list[dict[str, Any]]]:
    """``points`` (in shared-work order) in batches for ``num_workers`` workers, heaviest first
    (``batches.plan_batches``): points that share stage costs (``SHARED_COSTS``) form a family,
    those that share a schedule's order (``SHARED_WORK``) a group."""
    families: list[list[list[dict[str, Any]]]] = []
    family_key = group_key = None
    for point in points:
        key = tuple(point[axis] for axis in SHARED_WORK)
        if families and key == group_key:
            families[-1][-1].append(point)
            continue
        outer = tuple(point[axis] for axis in SHARED_COSTS)
        if families and outer == family_key:
            families[-1].append([point])
        else:
            families.append([[point]])
        family_key, group_key = outer, key
    return plan_batches(families, point_cost, num_workers)


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
    worker_timeout_s: float = WORKER_TIMEOUT_S,
    in_process: bool | None = None,
    warn: Callable[[str], None] = lambda line: None,
) -> SweepSummary:
    """Simulate every point of a sweep and write one row per point to ``out``: on the cluster at
    ``scheduler``, else in this process for as long as an embedded cluster of ``workers`` would
    cost more than it saves and on that cluster for the rest (``pipesim.sweep.local``).

    Args:
        spec: a SweepSpec or the path of a YAML spec (relative profile paths resolve against
            its folder, or ``base_dir``).
        out: the table, ``.parquet`` or ``.csv``; rows sorted by point.
        workers: processes of the embedded cluster (default: the number of CPUs).
        scheduler: address of an existing Dask scheduler, e.g. ``tcp://127.0.0.1:8786``.
        resume: continue an interrupted sweep from the chunks in ``OUT.parts/``.
        batch_size: points per Dask task (default: sized by predicted work, ``batches.plan_batches``).
        progress: called with (points done, total, where they run, share of the work done:
            ``local.WorkDone``) at the start and as chunks are written.
        worker_timeout_s: how long the cluster may have no worker before the sweep gives up.
        in_process: None chooses where points run (above); False sends every point to Dask, True
            runs every point in this process.
        warn: called with a line for each chunk of an interrupted run that ``resume`` found
            damaged and removed (also in ``SweepSummary.dropped``).

    Raises:
        ConfigError: a bad spec, another sweep writing ``out``, existing chunks without ``resume``,
            or no scheduler.
        SweepFailedError: the scheduler was lost, no worker came for ``worker_timeout_s``, a batch
            killed its workers, or the disk refused a write; finished points stay in ``OUT.parts/``.
    """
    from pipesim import __version__

    started, epoch = time.perf_counter(), time.time()
    spec_file = spec_path = None
    if isinstance(spec, str | Path):
        base_dir = base_dir or Path(spec).resolve().parent
        spec_path = str(spec)
        loaded = load_spec(spec)  # first: it names a missing or unreadable file in one line
        spec_file, spec = file_identity(spec), loaded
    if batch_size is not None and batch_size < 1:
        raise ConfigError("batch_size", batch_size, "must be >= 1")
    target = Path(out)
    try:
        resolved = Resolved(spec, base_dir=base_dir)
    except ConfigError as exc:  # a field of the spec file itself (a file it names carries its own name)
        if exc.source is not None or spec_path is None:
            raise
        raise ConfigError(exc.field, exc.value, exc.rule, source=spec_path) from None
    points = resolved.points()
    digest = resolved.digest()
    if resume and not has_chunks(Path(f"{target}.parts")) and finished_digest(target) == digest:
        frame = read_table(target)
        if progress:
            progress(len(points), len(points), HERE, 1.0)
        return SweepSummary(target, len(points), 0, len(points), int((frame["error"].fillna("") != "").sum()), 0,
                            time.perf_counter() - started)
    num_workers = workers if workers is not None else (os.cpu_count() or 1)
    if scheduler is None and num_workers < 1:
        raise ConfigError("workers", num_workers, "must be >= 1")
    # Points that share a schedule's shape run one after another (rows are sorted by point when merged).
    ordered = shared_work_order(points)
    runner = cluster = None
    if not resume and not has_chunks(Path(f"{target}.parts")):
        # Every point is to run: the cluster may start while the result store opens.
        runner, cluster = _runner_and_cluster(resolved, points, num_workers, workers, scheduler, in_process)
    phases: dict[str, float] = {}
    num_here, chunks, finished = 0, 0, []
    closing: threading.Thread | None = None
    store: ResultStore | None = None
    try:
        # The command as far as it decides the rows: --workers, --scheduler or --resume do not, and a resumed
        # table must be byte for byte the uninterrupted one.
        command = command_line(["sweep", spec_file["name"]]) if spec_file else None
        run = {"command": command, "pipesim_version": __version__, "spec": spec_file, "digest": digest,
               **resolved.inputs}
        store = ResultStore(target, digest, len(points), COLUMNS, resume=resume, run=run)
        resumed = len(store.done)
        for line in store.dropped:
            warn(f"{line}; removed, its points run again")
        todo = [point for point in ordered if point["point"] not in store.done]
        work = WorkDone(todo)
        if progress:
            progress(len(store.done), len(points), "", work.share())
        if runner is None and todo:
            runner, cluster = _runner_and_cluster(resolved, todo, num_workers, workers, scheduler, in_process)
        phases["expand"] = time.perf_counter() - started
        if todo:
            assert runner is not None
            if scheduler is None and in_process is not False:
                mark = time.perf_counter()
                num_here, chunks = run_here(runner, todo, store, cluster=cluster, num_workers=num_workers,
                                            progress=progress, total=len(points), work=work, batch_size=batch_size)
                phases["here"] = time.perf_counter() - mark
            rest = todo[num_here:]
            if rest:
                assert cluster is not None, "points left over without a cluster"
                client = cluster.client()
                mark = time.perf_counter()
                if batch_size is not None:
                    batches = [rest[i : i + batch_size] for i in range(0, len(rest), batch_size)]
                    batches.sort(key=lambda batch: -sum(point_cost(point) for point in batch))  # heaviest first
                else:
                    batches = make_batches(rest, max(1, sum(client.nthreads().values())))
                finished = submit_and_collect(client, cluster.shared, batches, store, progress, len(points), work,
                                              worker_timeout_s)
                phases["dask"] = time.perf_counter() - mark
        if cluster is not None and cluster.is_started:
            cluster.wait()  # a Ctrl-C held while it started stops the sweep before its table is written
    except Stopped as stop:  # what is kept is counted once the workers that may still write are stopped
        _close(cluster, phases)
        assert store is not None
        hint = resume_hint(store.parts, store.recount())
        store.close()
        raise SweepFailedError(f"{stop.what}; {hint}") from stop.__cause__
    except BaseException:
        _close(cluster, phases)
        if store is not None:
            store.close()
        raise
    if cluster is not None and cluster.is_started:
        phases["cluster"] = _ready_s(cluster)
        # The cluster closes while the table is merged.
        closing = threading.Thread(target=_close, args=(cluster, phases), name="pipesim-cluster-close")
        closing.start()
    mark = time.perf_counter()
    try:
        frame = store.finish()
        phases["merge"] = time.perf_counter() - mark
    finally:
        store.close()
        if closing is not None:
            closing.join()
    phases["close wait"] = time.perf_counter() - mark - phases.get("merge", 0.0)
    return SweepSummary(
        out=target, num_points=len(points), num_run=len(todo), num_resumed=resumed,
        num_errors=int((frame["error"].fillna("") != "").sum()), num_batches=chunks + len(finished),
        wall_s=time.perf_counter() - started, startup_s=phases.get("cluster", 0.0), num_here=num_here,
        phases=phases, batches=tuple(finished), started_epoch_s=epoch, dropped=tuple(store.dropped),
    )


def _runner_and_cluster(resolved: Resolved, points: list[dict[str, Any]], num_workers: int, workers: int | None,
                        scheduler: str | None, in_process: bool | None) -> tuple[PointRunner, DaskCluster | None]:
    """The runner of ``points`` (in shared-work order) and, where they may go to Dask, their cluster:
    started now when it takes every point (``--scheduler``, ``in_process=False``) or when their
    predicted work pays for an embedded one (``local.cluster_at_once``); else ``run_here`` starts it
    if the points it runs say it would pay."""
    runner = PointRunner(resolved, sweep_kernels(points, num_workers))
    if scheduler is None and (in_process is True or (num_workers < 2 and in_process is None)):
        return runner, None
    cluster = DaskCluster(workers=workers, scheduler=scheduler, shared=runner,
                      warm=functools.partial(warm_up, points=warm_points(points, point_cost)))
    if scheduler is not None or in_process is False or cluster_at_once(points):
        cluster.start()
    return runner, cluster


def _ready_s(cluster: DaskCluster) -> float:
    """Seconds from the cluster's start to its workers being ready."""
    if cluster.started_s is None or cluster.ready_s is None:
        return 0.0
    return cluster.ready_s - cluster.started_s


def _close(cluster: DaskCluster | None, phases: dict[str, float]) -> None:
    """Close ``cluster`` (if any) and note how long it took."""
    if cluster is None or not cluster.is_started:
        return
    mark = time.perf_counter()
    cluster.close()
    phases["close"] = time.perf_counter() - mark
