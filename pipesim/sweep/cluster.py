"""Reaching Dask safely: a bounded handshake with an external scheduler, Ctrl-C held while a cluster starts.

Dask's client reads a scheduler's handshake with no timeout, so a port that accepts connections
but never answers would hang a sweep whatever its timeouts: ``check_answers`` opens one
connection within a deadline first. A terminal's Ctrl-C reaches every process of the foreground
group, the embedded cluster's workers too, which would die mid-start with a traceback each (29 to
126 lines around the sweep's one line): ``CtrlCHeld`` starts them with SIGINT ignored (the one
disposition a new program inherits) and holds a Ctrl-C in this process back, blocked, until the
cluster is up and can be closed in order.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

from pipesim.errors import ConfigError

# Seconds to reach a scheduler and exchange Dask's handshake.
CONNECT_TIMEOUT_S = 10.0


def check_answers(scheduler: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Open one Dask connection to ``scheduler`` and close it, all within ``timeout_s``.

    Raises:
        ConfigError: no answer in time, or no connection.
    """
    from distributed.comm.core import connect
    from distributed.security import Security

    async def probe() -> None:
        arguments = Security().get_connection_args("client")  # type: ignore[no-untyped-call]
        comm = await connect(scheduler, timeout=timeout_s, **arguments)  # type: ignore[no-untyped-call]
        await comm.close()

    try:
        asyncio.run(asyncio.wait_for(probe(), timeout_s))
    except TimeoutError:
        raise ConfigError("scheduler", scheduler, f"did not answer within {timeout_s:g} s (a port that takes "
                          "connections but is not a Dask scheduler?)") from None
    except (OSError, ValueError) as exc:
        raise ConfigError("scheduler", scheduler, f"cannot connect: {exc}") from None


class CtrlCHeld:
    """While held, SIGINT is blocked in this thread (and in the threads it starts) and ignored by
    the processes started meanwhile, for their whole life (the parent closes them); ``release``
    (or the end of the ``with`` block) restores the handler, and a Ctrl-C that came meanwhile
    raises KeyboardInterrupt then.

    Linux keeps a blocked signal pending even while its action is to ignore it; a thread that does
    not block SIGINT (one a library started earlier, such as a BLAS pool at numpy's import) may
    take it instead, and then it is dropped: the next Ctrl-C acts, and no process prints a
    traceback either way. multiprocessing unblocks SIGINT in the thread that first starts its
    resource tracker, so the tracker is started before. Only in the main thread of a POSIX
    process; elsewhere it does nothing.
    """

    def __init__(self) -> None:
        self.mask: set[int] | None = None
        self.handler: Any = None

    def __enter__(self) -> CtrlCHeld:
        if hasattr(signal, "pthread_sigmask") and threading.current_thread() is threading.main_thread():
            from multiprocessing import resource_tracker

            resource_tracker.ensure_running()
            self.mask = {int(sig) for sig in signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})}
            self.handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
        return self

    def release(self) -> None:
        """The handler back, then SIGINT unblocked: a pending Ctrl-C raises KeyboardInterrupt here."""
        if self.mask is not None:
            mask, self.mask = self.mask, None
            signal.signal(signal.SIGINT, self.handler)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.release()


@contextmanager
def blocked_in_thread() -> Iterator[None]:
    """SIGINT blocked in this thread while the block runs, so that a thread started in it (a
    progress bar's refresher) never takes a Ctrl-C: the kernel gives it to the main thread, or
    holds it while ``CtrlCHeld`` blocks it there."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
