"""Reaching Dask safely: a bounded handshake with an external scheduler, Ctrl-C held while a cluster starts.

Dask's client reads a scheduler's handshake with no timeout, so a port that accepts connections
but never answers would hang a sweep whatever its timeouts: ``check_answers`` opens one
connection within a deadline first. A terminal's Ctrl-C reaches every process of the foreground
group, the embedded cluster's workers too, which would die mid-start with a traceback each (29 to
126 lines around the sweep's one line): ``CtrlCHeld`` starts them with SIGINT blocked (a signal
mask, which a new program inherits and Dask's workers never change) and records a Ctrl-C in this
process, to raise it once the cluster is up and can be closed in order.
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
    """While held, SIGINT is blocked in this thread, in the threads it starts and in the processes
    those start (for their whole life: the parent closes them), and a Ctrl-C that reaches this
    process is recorded; ``release`` (or the end of the ``with`` block) restores the handler and
    raises KeyboardInterrupt for a recorded Ctrl-C.

    The record is a Python handler, not SIG_IGN: a thread that does not block SIGINT (one a
    library started earlier, such as a BLAS pool at numpy's import) may take the signal, and with
    SIG_IGN it would be dropped there; with a handler the main thread runs it whichever thread took
    it. multiprocessing unblocks SIGINT in the thread that first starts its resource tracker, so
    the tracker is started before. Only in the main thread of a POSIX process; elsewhere it does
    nothing.
    """

    def __init__(self) -> None:
        self.mask: set[int] | None = None
        self.handler: Any = None
        self.pressed = False

    def __enter__(self) -> CtrlCHeld:
        if hasattr(signal, "pthread_sigmask") and threading.current_thread() is threading.main_thread():
            from multiprocessing import resource_tracker

            resource_tracker.ensure_running()
            self.handler = signal.signal(signal.SIGINT, self._record)
            self.mask = {int(sig) for sig in signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})}
        return self

    def _record(self, signum: int, frame: Any) -> None:
        self.pressed = True

    def release(self) -> None:
        """SIGINT unblocked (a pending Ctrl-C is recorded then), the handler back, and
        KeyboardInterrupt raised here for a Ctrl-C recorded while held."""
        if self.mask is not None:
            mask, self.mask = self.mask, None
            try:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            finally:
                signal.signal(signal.SIGINT, self.handler)
            if self.pressed:
                self.pressed = False
                if callable(self.handler):
                    self.handler(signal.SIGINT, None)
                elif self.handler == signal.SIG_DFL:
                    raise KeyboardInterrupt

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
