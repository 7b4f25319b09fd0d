"""Processes the harness starts die with their parent: nothing outlives the command that started it."""

from __future__ import annotations

import contextlib
import signal


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent exits (no-op elsewhere)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
