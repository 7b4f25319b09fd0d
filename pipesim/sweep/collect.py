"""A sweep's batches on Dask: submitted heaviest first, their chunks recorded as they finish, the cluster watched."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError
from contextlib import suppress
from typing import Any

from pipesim.sweep.local import ON_DASK, Progress, WorkDone
from pipesim.sweep.parts import chunk_path, write_chunk, write_reason
from pipesim.sweep.store import ResultStore
from pipesim.sweep.tasks import BatchDone, run_batch

POLL_S = 0.02


class Stopped(Exception):
    """The sweep cannot go on (a lost scheduler or workers, a refused write): ``what`` says why, in
    words that the caller completes with what is kept once the cluster is closed (``resume_hint``)."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


def submit_and_collect(client: Any, shared: Any, batches: Sequence[Sequence[dict[str, Any]]], store: ResultStore,
                       progress: Progress | None, total: int, work: WorkDone,
                       worker_timeout_s: float) -> list[BatchDone]:
    """Submit every batch, heaviest first (``batches`` in that order), and record each one's chunk
    as it finishes: written by its worker, or here from the rows it sent. The batches' timings
    (without rows), in the order they finished.

    Raises:
        Stopped: the scheduler was lost, the cluster had no worker for ``worker_timeout_s``, a
            batch killed the workers that ran it (Dask's KilledWorker), or a chunk could not be
            written.
    """
    from distributed import as_completed

    address = str(client.scheduler.address)
    watch = WorkerWatch(client, address, worker_timeout_s)
    futures: list[Any] = []
    finished: list[BatchDone] = []
    try:
        watch.wait_for_a_worker()
        if progress:
            progress(len(store.done), total, ON_DASK, work.share())
        try:
            # Batches submitted together share a Dask generation, within which the scheduler picks by its own
            # order; falling priorities make it take them heaviest first, as planned.
            parts = str(store.parts.absolute())  # as a worker started in another folder finds it
            futures = [client.submit(run_batch, shared, batch, parts, store.writer, pure=False,
                                     priority=len(batches) - index)
                       for index, batch in enumerate(batches)]
        except (OSError, TimeoutError) as exc:
            raise watch.lost(exc) from exc
        # Results are gathered in the background: a finished batch whose worker died before its report
        # was fetched is recomputed by Dask while this loop keeps watching the cluster.
        completed = as_completed(futures, with_results=True, raise_errors=False)  # type: ignore[no-untyped-call]
        while not completed.is_empty():  # type: ignore[no-untyped-call]
            ready = completed.next_batch(block=False)  # type: ignore[no-untyped-call]
            if not ready:
                watch.check()
                time.sleep(POLL_S)
                continue
            for future, result in ready:
                done = _done(result, watch, lambda: _span(future, futures, batches))
                if done.write_error:
                    raise Stopped(f"cannot write {done.chunk}: {done.write_error}")
                if not done.chunk:  # a worker that does not see the folder: written here
                    try:
                        write_chunk(store.parts, done.table)
                    except OSError as exc:
                        raise Stopped(f"cannot write {chunk_path(store.parts, done.points)}: "
                                      f"{write_reason(exc)}") from exc
                store.add_written(done.points, done.table)
                share = work.add([{"point": point} for point in done.points])
                finished.append(dataclasses.replace(done, table=None))
                future.release()
                if progress:
                    progress(len(store.done), total, ON_DASK, share)
    except BaseException:
        if futures and client.status == "running":
            with suppress(Exception):
                client.cancel(futures)
        raise
    return finished


def _done(result: Any, watch: WorkerWatch, span: Callable[[], str]) -> BatchDone:
    """A batch's report from ``as_completed(with_results=True, raise_errors=False)``.

    Raises:
        Stopped: the batch was cancelled (the scheduler lost) or killed its workers.
    """
    from distributed import KilledWorker

    # An error comes as (type, exception, traceback), a cancellation as the exception, a report as a
    # BatchDone (the future's status may have moved on since, if its worker died after it was fetched).
    if isinstance(result, BatchDone):
        return result
    error = result[1] if isinstance(result, tuple) else result
    if isinstance(error, KilledWorker):
        raise Stopped(f"the batch of points {span()} killed every Dask worker that ran it (KilledWorker at "
                      f"{watch.address})") from error
    if isinstance(error, CancelledError):
        reason = str(getattr(error, "reason", ""))
        if watch.client.status != "running" or reason == "scheduler-connection-lost":
            raise watch.lost(error) from error
        raise Stopped(f"Dask cancelled the batch of points {span()} ({reason or error}) at {watch.address}") from error
    if isinstance(error, OSError | TimeoutError):
        raise watch.lost(error) from error
    if isinstance(error, BaseException):
        raise error  # a bug in a task (points' own errors are rows), shown as it is
    raise TypeError(f"a batch's task returned {type(result).__name__}, not a BatchDone")


def _span(future: Any, futures: list[Any], batches: Sequence[Sequence[dict[str, Any]]]) -> str:
    """The points of the batch a future ran, as "FIRST..LAST" (in the order run)."""
    batch = batches[futures.index(future)]
    return f"{batch[0]['point']}..{batch[-1]['point']}"


class WorkerWatch:
    """Notices, while results are awaited, a lost scheduler or a cluster left without workers."""

    def __init__(self, client: Any, address: str, timeout_s: float) -> None:
        self.client = client
        self.address = address
        self.timeout_s = timeout_s
        self.checked = time.monotonic()
        self.workers_seen = time.monotonic()

    def wait_for_a_worker(self) -> None:
        """Return once the cluster has a worker.

        Raises:
            Stopped: none came within the timeout, or the scheduler is gone.
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
            Stopped: the scheduler is gone, or no worker for ``timeout_s``.
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

    def lost(self, exc: BaseException | None) -> Stopped:
        """The error for a scheduler that can no longer be reached."""
        why = f" ({type(exc).__name__})" if exc is not None else ""
        return Stopped(f"lost the Dask scheduler at {self.address}{why}")

    def no_workers(self) -> Stopped:
        """The error for a cluster without workers."""
        return Stopped(f"the Dask scheduler at {self.address} has had no workers for {self.timeout_s:g} s")
