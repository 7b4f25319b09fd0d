"""Running a sweep: points in cost-balanced batches, here or on Dask, rows streamed to chunks as batches finish."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipesim import allocator
from pipesim.errors import ConfigError
from pipesim.spec.provenance import command_line, file_identity
from pipesim.sweep.cluster import CONNECT_TIMEOUT_S, CtrlCHeld, check_answers
from pipesim.sweep.local import HERE, ON_DASK, Progress, WorkDone, point_cost, run_here
from pipesim.sweep.parts import has_chunks
from pipesim.sweep.points import COLUMNS, PointRunner, shared_work_order, sweep_kernels
from pipesim.sweep.spec import Resolved, SweepSpec, load_spec
from pipesim.sweep.store import ResultStore, SweepFailedError, finished_digest, read_table, resume_hint

BATCHES_PER_WORKER = 32
WORKER_TIMEOUT_S = 120.0
POLL_S = 0.02


@dataclass(frozen=True)
class SweepSummary:
    """What a sweep did.

    Attributes:
        out: the table written; num_points: points in the sweep; num_run: points simulated now;
        num_resumed: points taken from an interrupted run; num_errors: rows with an error;
        num_batches: chunks written here plus Dask tasks; wall_s: seconds, end to end;
        startup_s: of which starting the cluster or connecting to it (0 without one);
        num_here: points simulated in this process (``pipesim.sweep.local``), the rest on Dask.
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
    """A Dask client: to ``scheduler`` when given (``cluster.check_answers`` first), else to an
    embedded LocalCluster of ``workers`` single-threaded processes listening on 127.0.0.1 (closed
    on exit; Ctrl-C held back while it starts, ``cluster.CtrlCHeld``). Dask's own loggers are set
    to CRITICAL.

    Raises:
        ConfigError: the scheduler cannot be reached, or ``workers < 1``.
    """
    import dask.config
    from distributed import Client, LocalCluster  # sets its loggers' levels on import, so quiet them after

    # Dask's and tornado's own logs of a lost worker or scheduler would break the commands' one-line
    # messages; distributed sets its loggers' levels on import, so they are quieted after it.
    for name in [*logging.root.manager.loggerDict, "distributed", "tornado"]:
        if name.split(".")[0] in ("distributed", "tornado"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    if scheduler is not None:
        check_answers(scheduler, CONNECT_TIMEOUT_S)
        try:
            client = Client(scheduler, timeout=CONNECT_TIMEOUT_S)  # type: ignore[no-untyped-call]
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
    # Dask starts its worker processes with glibc's MALLOC_TRIM_THRESHOLD_ at 64 KiB, so the numpy
    # columns a point frees would go back to the OS and be faulted in again by the next point
    # (benchmarks/RESULTS.md, sweeps): workers start with pipesim's thresholds (pipesim.allocator).
    environ = {**dask.config.get("distributed.nanny.pre-spawn-environ", default={}), **allocator.ENVIRONMENT}
    with dask.config.set({"distributed.nanny.pre-spawn-environ": environ}), CtrlCHeld() as held:
        cluster = LocalCluster(  # type: ignore[no-untyped-call]
            # The scheduler always serves HTTP; without an address it takes :8787 and warns on stderr when
            # another cluster holds that port, so let the OS choose one.
            n_workers=count, threads_per_worker=1, processes=True, host="127.0.0.1",
            # CRITICAL: a worker's ERROR lines (a heartbeat missed while the cluster shuts down after a failed
            # write, on a loaded machine) would follow the one-line message; failures are reported by the runner.
            dashboard_address="127.0.0.1:0", silence_logs=logging.CRITICAL,
        )
        try:
            client = Client(cluster)  # type: ignore[no-untyped-call]
            try:
                held.release()  # a Ctrl-C held back while the cluster started is raised here
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
        batch_size: points per Dask task (default: about BATCHES_PER_WORKER tasks per worker).
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

    started = time.perf_counter()
    spec_file = spec_path = None
    if isinstance(spec, str | Path):
        base_dir = base_dir or Path(spec).resolve().parent
        spec_file, spec_path = file_identity(spec), str(spec)
        spec = load_spec(spec)
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
    # The command as far as it decides the rows: --workers, --scheduler or --resume do not, and a resumed
    # table must be byte for byte the uninterrupted one.
    command = command_line(["sweep", spec_file["name"]]) if spec_file else None
    run = {"command": command, "pipesim_version": __version__, "spec": spec_file, "digest": digest, **resolved.inputs}
    store = ResultStore(target, digest, len(points), COLUMNS, resume=resume, run=run)
    try:
        return _run_points(store, resolved, points, target, started, workers=workers, scheduler=scheduler,
                           batch_size=batch_size, progress=progress, worker_timeout_s=worker_timeout_s,
                           in_process=in_process, warn=warn)
    finally:
        store.close()


def _run_points(store: ResultStore, resolved: Resolved, points: list[dict[str, Any]], target: Path, started: float,
                *, workers: int | None, scheduler: str | None, batch_size: int | None, progress: Progress | None,
                worker_timeout_s: float, in_process: bool | None, warn: Callable[[str], None]) -> SweepSummary:
    """The points ``store`` does not hold yet, run and written (``run_sweep``, its store locked)."""
    resumed = len(store.done)
    for line in store.dropped:
        warn(f"{line}; removed, its points run again")
    # Points that share a schedule's shape run one after another (rows are sorted by point when merged).
    todo = shared_work_order([point for point in points if point["point"] not in store.done])
    work = WorkDone(todo)
    if progress:
        progress(len(store.done), len(points), "", work.share())
    batches: list[list[dict[str, Any]]] = []
    startup, num_here, chunks = 0.0, 0, 0
    if todo:
        num_workers = workers if workers is not None else (os.cpu_count() or 1)
        if scheduler is None and num_workers < 1:
            raise ConfigError("workers", num_workers, "must be >= 1")
        runner = PointRunner(resolved, sweep_kernels(todo, num_workers))
        # An existing cluster (--scheduler) takes every point; an embedded one only where it pays.
        num_here, chunks = (0, 0) if scheduler is not None or in_process is False else run_here(
            runner, todo, store, num_workers=1 if in_process else num_workers, progress=progress, total=len(points),
            work=work, batch_size=batch_size)
        rest = todo[num_here:]
        if batch_size is not None:
            batches = [rest[i : i + batch_size] for i in range(0, len(rest), batch_size)]
        else:
            batches = make_batches(rest, BATCHES_PER_WORKER * num_workers)
        if batches:
            connecting = time.perf_counter()
            with dask_client(workers=workers, scheduler=scheduler) as client:
                startup = time.perf_counter() - connecting
                _submit_and_collect(client, runner, batches, store, progress, len(points), work, worker_timeout_s)
    frame = store.finish()
    return SweepSummary(
        out=target, num_points=len(points), num_run=len(todo), num_resumed=resumed,
        num_errors=int((frame["error"].fillna("") != "").sum()), num_batches=chunks + len(batches),
        wall_s=time.perf_counter() - started, startup_s=startup, num_here=num_here, dropped=tuple(store.dropped),
    )


def _submit_and_collect(client: Any, runner: PointRunner, batches: list[list[dict[str, Any]]], store: ResultStore,
                        progress: Progress | None, total: int, work: WorkDone, worker_timeout_s: float) -> None:
    """Submit every batch and write each one's chunk as it finishes.

    Raises:
        SweepFailedError: the scheduler was lost, the cluster had no worker for ``worker_timeout_s``,
            or a batch killed the workers that ran it (Dask's KilledWorker).
    """
    from distributed import as_completed

    address = str(client.scheduler.address)
    watch = _WorkerWatch(client, address, store, worker_timeout_s)
    futures: list[Any] = []
    try:
        watch.wait_for_a_worker()
        if progress:
            progress(len(store.done), total, ON_DASK, work.share())
        try:
            # A task rather than scattered data: if every worker holding it dies, Dask recomputes it.
            shared = client.submit(_identity, runner, pure=False)
            # Batches submitted together share a Dask generation, within which the scheduler picks by its own
            # order; falling priorities keep them in the shared-work order they were made in.
            futures = [client.submit(run_batch, shared, batch, pure=False, priority=len(batches) - index)
                       for index, batch in enumerate(batches)]
        except (OSError, TimeoutError) as exc:
            raise watch.lost(exc) from exc
        # Results are gathered in the background: a finished batch whose worker died before its rows
        # were fetched is recomputed by Dask while this loop keeps watching the cluster.
        completed = as_completed(futures, with_results=True, raise_errors=False)  # type: ignore[no-untyped-call]
        while not completed.is_empty():  # type: ignore[no-untyped-call]
            ready = completed.next_batch(block=False)  # type: ignore[no-untyped-call]
            if not ready:
                watch.check()
                time.sleep(POLL_S)
                continue
            for future, result in ready:
                rows = _rows(result, watch, lambda: _span(future, futures, batches))
                store.write_chunk(rows)
                share = work.add(rows)
                future.release()
                if progress:
                    progress(len(store.done), total, ON_DASK, share)
    except BaseException:
        if futures and client.status == "running":
            with suppress(Exception):
                client.cancel(futures)
        raise


def _rows(result: Any, watch: _WorkerWatch, span: Callable[[], str]) -> list[dict[str, Any]]:
    """A batch's rows from ``as_completed(with_results=True, raise_errors=False)``.

    Raises:
        SweepFailedError: the batch was cancelled (the scheduler lost) or killed its workers.
    """
    from distributed import KilledWorker

    # An error comes as (type, exception, traceback), a cancellation as the exception, rows as a list
    # (the future's status may have moved on since, if its worker died after the rows were fetched).
    error = result[1] if isinstance(result, tuple) else result
    if not isinstance(error, BaseException):
        return list(result)
    if isinstance(error, KilledWorker):
        raise SweepFailedError(f"the batch of points {span()} killed every Dask worker that ran it (KilledWorker at "
                               f"{watch.address}); {watch.hint()}") from error
    if isinstance(error, CancelledError):
        reason = str(getattr(error, "reason", ""))
        if watch.client.status != "running" or reason == "scheduler-connection-lost":
            raise watch.lost(error) from error
        raise SweepFailedError(f"Dask cancelled the batch of points {span()} ({reason or error}) at {watch.address}; "
                               f"{watch.hint()}") from error
    if isinstance(error, OSError | TimeoutError):
        raise watch.lost(error) from error
    raise error  # a bug in a task (points' own errors are rows), shown as it is


def _identity(value: Any) -> Any:
    """The task that holds the PointRunner on the cluster."""
    return value


def _span(future: Any, futures: list[Any], batches: list[list[dict[str, Any]]]) -> str:
    """The points of the batch a future ran, as "FIRST..LAST"."""
    batch = batches[futures.index(future)]
    return f"{batch[0]['point']}..{batch[-1]['point']}"


class _WorkerWatch:
    """Notices, while results are awaited, a lost scheduler or a cluster left without workers."""

    def __init__(self, client: Any, address: str, store: ResultStore, timeout_s: float) -> None:
        self.client = client
        self.address = address
        self.store = store
        self.timeout_s = timeout_s
        self.checked = time.monotonic()
        self.workers_seen = time.monotonic()

    def wait_for_a_worker(self) -> None:
        """Return once the cluster has a worker.

        Raises:
            SweepFailedError: none came within the timeout, or the scheduler is gone.
        """
        try:
            self.client.wait_for_workers(1, timeout=self.timeout_s)
        except TimeoutError as exc:
            raise self.no_workers() from exc
        except OSError as exc:
            raise self.lost(exc) from exc

    def check(self) -> None:
        """At most once a second: the client still connected, and a worker seen within the timeout.

        Raises:
            SweepFailedError: the scheduler is gone, or no worker for ``timeout_s``.
        """
        now = time.monotonic()
        if now - self.checked < 1.0:
            return
        self.checked = now
        if self.client.status != "running":
            raise self.lost(None)
        try:
            workers = len(self.client.nthreads())
        except (OSError, TimeoutError) as exc:
            raise self.lost(exc) from exc
        if workers:
            self.workers_seen = now
        elif now - self.workers_seen > self.timeout_s:
            raise self.no_workers()

    def hint(self) -> str:
        """What is kept and how to go on."""
        return resume_hint(self.store.parts, len(self.store.done))

    def lost(self, exc: BaseException | None) -> SweepFailedError:
        """The error for a scheduler that can no longer be reached."""
        why = f" ({type(exc).__name__})" if exc is not None else ""
        return SweepFailedError(f"lost the Dask scheduler at {self.address}{why}; "
                                f"{self.hint()}")

    def no_workers(self) -> SweepFailedError:
        """The error for a cluster without workers."""
        return SweepFailedError(f"the Dask scheduler at {self.address} has had no workers for {self.timeout_s:g} s; "
                                f"{self.hint()}")
