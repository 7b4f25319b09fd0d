"""The torch harness: profile real models, run any schedule for real, and check predictions.

This package is the only place pipesim imports torch, and this module does not: the CLI calls
``require_torch()`` before importing the submodules, so a missing torch is one line, not a trace.
"""

from __future__ import annotations

import importlib.util

from pipesim.errors import PipesimError

INSTALL_HINT = "pip install torch==2.13.0, then pip install -e .[harness]"


class TorchMissingError(PipesimError):
    """torch is not installed; the message says how to install it."""


class RunFailedError(PipesimError):
    """A pipelined run did not finish: a rank raised, hung, or died.

    Attributes:
        rank: the rank blamed (-1 when no single rank is).
        op: the op it was at, in the "1F0" text form ("" when unknown).
        reason: what happened, in one line.
        trace_path: where the partial trace was written, if anywhere.
    """

    def __init__(self, rank: int, op: str, reason: str, trace_path: str | None = None) -> None:
        self.rank = rank
        self.op = op
        self.reason = reason
        self.trace_path = trace_path
        where = f"rank {rank} at {op}: " if rank >= 0 and op else f"rank {rank}: " if rank >= 0 else ""
        kept = f" (partial trace kept in {trace_path})" if trace_path else ""
        super().__init__(f"run failed: {where}{reason}{kept}")


def require_torch() -> None:
    """Raise TorchMissingError unless torch can be imported (without importing it).

    Raises:
        TorchMissingError: torch is not installed.
    """
    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise TorchMissingError(f"the harness needs torch, which is not installed: {INSTALL_HINT}")
