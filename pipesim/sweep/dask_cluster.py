"""The Dask cluster of a sweep or a search: embedded or at a scheduler's address, started in the background.

Starting an embedded cluster takes time: on Linux its workers are forked from multiprocessing's
fork server, which has imported Dask, pipesim and numba's kernels once (``worker_preload``) and
is stopped when the last such cluster closes; elsewhere, or where another part of the program
runs a fork server already, each spawned worker imports them itself, seconds of CPU for a dozen
workers.
``DaskCluster.start`` does it in a thread, while the caller goes on with its own work (expanding
the spec, opening the result store, simulating points here), and warms every worker that is there
by then: the object the tasks share (a ``PointRunner``) is unpickled on it and a few small points
load the kernels its schedules use, so that the first batches start on workers that are ready. While an embedded cluster starts, a Ctrl-C is held back
(``cluster.CtrlCHeld``): the caller's thread raises it once the start has ended, when it next looks
(``is_ready``, ``client``, ``close``), and the workers never see it.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

from pipesim import allocator
from pipesim.errors import ConfigError
from pipesim.sweep.cluster import CONNECT_TIMEOUT_S, CtrlCHeld, check_answers


@contextmanager
def dask_client(*, workers: int | None, scheduler: str | None) -> Iterator[Any]:
    """A Dask client: to ``scheduler`` when given (``cluster.check_answers`` first), else to an
    embedded LocalCluster of ``workers`` single-threaded processes listening on 127.0.0.1 (closed
    on exit). Dask's own loggers are set to CRITICAL.

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
    # Each worker's sampling profiler (for a dashboard no sweep reads) takes the GIL every 10 ms to walk
    # the task thread's stack: work beside every point that nothing uses, so it is off (benchmarks/
    # RESULTS.md, "Two Dask workers against plain processes").
    settings = {"distributed.nanny.pre-spawn-environ": environ, "distributed.worker.profile.enabled": False}
    with fork_server_kept() as forked:
        if forked:
            settings["distributed.worker.multiprocessing-method"] = FORK_SERVER
        with dask.config.set(settings):
            cluster = LocalCluster(  # type: ignore[no-untyped-call]
                # The scheduler always serves HTTP; without an address it takes :8787 and warns on stderr when
                # another cluster holds that port, so let the OS choose one.
                n_workers=count, threads_per_worker=1, processes=True, host="127.0.0.1",
                # CRITICAL: a worker's ERROR lines (a heartbeat missed while the cluster shuts down after a failed
                # write, on a loaded machine) would follow the one-line message; failures are reported by the runner.
                dashboard_address="127.0.0.1:0", silence_logs=logging.CRITICAL,
            )
        if forked:
            _note_fork_server()
        try:
            client = Client(cluster)  # type: ignore[no-untyped-call]
            try:
                yield client
            finally:
                client.close()  # type: ignore[no-untyped-call]
        finally:
            cluster.close()


#: How an embedded cluster's nannies start their workers on Linux (where it was measured; macOS forks
#: badly once some system frameworks are loaded, so elsewhere they are spawned).
FORK_SERVER = "forkserver"
#: What the fork server imports before it forks the first worker.
WORKER_PRELOAD = "pipesim.sweep.worker_preload"


# The fork server is multiprocessing's, one per process; the embedded clusters of this process that
# fork their workers from it share it while any is open, and the last to close stops it (and puts
# back the preload list it found), so that nothing forked later in the user's process comes from
# a server holding the sweep's modules, environment and blocked Ctrl-C.
_fork_server_lock = threading.Lock()
_fork_server_users = 0
_fork_server_pid: int | None = None  # the server this module's clusters started
_fork_server_found: list[str] = []  # the preload list before theirs


@contextmanager
def fork_server_kept() -> Iterator[bool]:
    """A share of the embedded clusters' fork server for the block, and whether workers started in
    it fork from that server: an embedded cluster holds one while it is open, and a search holds one
    across its rounds (each starts a cluster), so that the server stops at the block's end, not at
    each cluster's close."""
    import dask.config

    kept = _forks_workers(dask.config.get("distributed.worker.multiprocessing-method")) and _claim_fork_server()
    try:
        yield kept
    finally:
        if kept:
            _release_fork_server()


def _forks_workers(method: str) -> bool:
    """Whether an embedded cluster forks its workers: on Linux, where Dask's start method is its
    default (``spawn``; one the user set in Dask's config is kept) and the platform has a fork server."""
    return (sys.platform.startswith("linux") and method == "spawn"
            and FORK_SERVER in multiprocessing.get_all_start_methods())


def _fork_server() -> Any:
    """multiprocessing's fork server object, or None where its internals are not those relied on."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    needed = ("_forkserver_pid", "_preload_modules", "_stop", "set_forkserver_preload")
    return server if server is not None and all(hasattr(server, name) for name in needed) else None


def _claim_fork_server() -> bool:
    """Take a share of a fork server that imports ``WORKER_PRELOAD`` when it starts (with the
    first worker, after the nanny has set the workers' environment, which the server and the
    workers it forks then share). False, and the workers are spawned, where a fork server started
    elsewhere in this process is running (its workers would lack the preload and take Ctrl-C) or
    multiprocessing's internals differ. Dask sets the server's list on its first use of the
    fork server's context, so it is asked for that context first."""
    global _fork_server_users, _fork_server_found
    server = _fork_server()
    if server is None:
        return False
    with _fork_server_lock:
        running = server._forkserver_pid
        if running is not None and running != _fork_server_pid:
            return False
        if _fork_server_users == 0:
            import dask.config
            from distributed.utils import get_mp_context

            _fork_server_found = list(server._preload_modules)  # the program's, before Dask's first use sets its own
            with dask.config.set({"distributed.worker.multiprocessing-method": FORK_SERVER}):
                get_mp_context()  # type: ignore[no-untyped-call]
            server.set_forkserver_preload([WORKER_PRELOAD])
        _fork_server_users += 1
        return True


def _note_fork_server() -> None:
    """Record the fork server the claiming cluster's workers were forked from as this module's."""
    global _fork_server_pid
    server = _fork_server()
    with _fork_server_lock:
        if server is not None and _fork_server_pid is None:
            _fork_server_pid = server._forkserver_pid


def _release_fork_server() -> None:
    """Give back a share of the fork server; the last one stops it (its workers are closed by then,
    and SIGTERM ends it even where a straggler still holds its pipe) and restores the preload list."""
    global _fork_server_users, _fork_server_pid
    server = _fork_server()
    with _fork_server_lock:
        _fork_server_users -= 1
        if _fork_server_users or server is None:
            return
        # Ours: the one noted, or one started while the clusters held it but not noted (a cluster whose
        # start failed after its first worker), since none was running when the first claimed it.
        noted, _fork_server_pid = _fork_server_pid, None
        running = server._forkserver_pid
        try:
            if running is not None and noted in (None, running):
                with contextlib.suppress(OSError):  # it had ended already
                    os.kill(running, signal.SIGTERM)
                with contextlib.suppress(OSError):  # reaped elsewhere (SIGCHLD ignored by the program)
                    server._stop()
        finally:
            server.set_forkserver_preload(_fork_server_found)


class DaskCluster:
    """A Dask client started in a background thread (``start``), with the object its tasks share.

    Args:
        workers, scheduler: as ``dask_client``.
        shared: sent once to the cluster, as a task (if every worker holding it dies, Dask
            recomputes it); tasks take ``self.shared`` as an argument.
        warm: called on each worker present once the client is up, with the shared object, to
            load what its tasks will need.

    Attributes:
        started_s, ready_s: ``time.perf_counter()`` when ``start`` was called and when the
            client was up and its workers warm (None until then).
        connected_s: when the client was up (before the warm-up).
    """

    def __init__(self, *, workers: int | None, scheduler: str | None, shared: Any,
                 warm: Callable[[Any], Any] | None = None) -> None:
        self.workers = workers
        self.scheduler = scheduler
        self.shared_value = shared
        self.warm = warm
        self.started_s: float | None = None
        self.connected_s: float | None = None
        self.ready_s: float | None = None
        self._stack = ExitStack()
        self._client: Any = None
        self._shared: Any = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._held: CtrlCHeld | None = None

    @property
    def is_started(self) -> bool:
        """Whether ``start`` was called."""
        return self._thread is not None

    def start(self) -> None:
        """Start the cluster (or connect) and warm its workers in a background thread; an embedded
        cluster's workers start with Ctrl-C held back (``CtrlCHeld``, from the caller's thread)."""
        if self._thread is None:
            self.started_s = time.perf_counter()
            if self.scheduler is None:
                self._held = CtrlCHeld().__enter__()
            self._thread = threading.Thread(target=self._start, name="pipesim-cluster-start", daemon=True)
            self._thread.start()

    def is_ready(self) -> bool:
        """Whether the start has ended (with a client, or an error that ``client`` raises).

        Raises:
            KeyboardInterrupt: a Ctrl-C came while the cluster started.
        """
        if not self._done.is_set():
            return False
        self._release()
        return True

    def wait(self) -> None:
        """Wait for the start to end (an error it met is left to ``client``).

        Raises:
            KeyboardInterrupt: a Ctrl-C came while the cluster started.
        """
        self._done.wait()
        self._release()

    def client(self) -> Any:
        """The client, once started (``start`` is called if it was not).

        Raises:
            ConfigError: the scheduler cannot be reached; what else the start raised.
            KeyboardInterrupt: a Ctrl-C came while the cluster started.
        """
        self.start()
        self._done.wait()
        self._release()
        if self._error is not None:
            raise self._error
        return self._client

    @property
    def shared(self) -> Any:
        """The future of the shared object (after ``client``)."""
        return self._shared

    def close(self) -> None:
        """Close the client and the embedded cluster (after the start has ended); from the thread
        that started it, raise a Ctrl-C held back meanwhile (KeyboardInterrupt)."""
        if self._thread is not None:
            self._done.wait()
        try:
            self._stack.close()
        finally:
            self._release()

    def _release(self) -> None:
        """Give a Ctrl-C held back while the cluster started to the thread that started it (only
        there: signal handlers belong to the main thread)."""
        if self._held is not None and self._done.is_set() and threading.current_thread() is threading.main_thread():
            held, self._held = self._held, None
            held.release()

    def _start(self) -> None:
        try:
            client = self._stack.enter_context(dask_client(workers=self.workers, scheduler=self.scheduler))
            self.connected_s = time.perf_counter()
            self._shared = client.submit(_identity, self.shared_value, pure=False)
            if self.warm is not None:
                warm_workers(client, self._shared, self.warm)
            self._client = client
            self.ready_s = time.perf_counter()
        except BaseException as error:  # noqa: BLE001 - raised again in the caller's thread by client()
            self._error = error
        finally:
            self._done.set()


def warm_workers(client: Any, shared: Any, warm: Callable[[Any], Any]) -> None:
    """Run ``warm(shared)`` once on each worker the cluster has now, and wait for them. A failed
    warm-up is left for the tasks to meet again and report (a warm-up only saves time)."""
    from distributed import wait

    addresses: Sequence[str] = list(client.scheduler_info().get("workers", {}))
    futures = [client.submit(warm, shared, workers=[address], allow_other_workers=False, pure=False)
               for address in addresses]
    wait(futures)  # type: ignore[no-untyped-call]
    for future in futures:
        future.release()


def _identity(value: Any) -> Any:
    """The task that holds the shared object on the cluster."""
    return value
