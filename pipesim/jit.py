"""Optional compilation with numba: ``jit`` compiles a numeric kernel when numba is present."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

# PIPESIM_NO_JIT=1 runs every kernel as plain Python (the reference; slower but always available).
_DISABLED = os.environ.get("PIPESIM_NO_JIT", "") not in ("", "0")


def _load_numba() -> Any | None:
    if _DISABLED:
        return None
    try:
        return importlib.import_module("numba")
    except ImportError:
        return None


_NUMBA = _load_numba()

#: True when kernels decorated with ``jit`` are compiled (numba installed and not disabled).
ENABLED: bool = _NUMBA is not None


def jit(function: F) -> F:
    """Compile ``function`` in numba's nopython mode (cached on disk), or return it unchanged.

    Kernels must therefore be written in the subset of Python and numpy that numba compiles,
    and give the same results either way: no fastmath, the same floating-point operations in
    the same order, so compiled and plain runs are bit-identical.
    """
    if _NUMBA is None:
        return function
    compiled: F = _NUMBA.njit(cache=True, nogil=True)(function)
    return compiled


def backend() -> str:
    """``"numba <version>"`` when kernels are compiled, else ``"python"`` (recorded in benchmarks)."""
    if _NUMBA is None:
        return "python"
    return f"numba {_NUMBA.__version__}"
