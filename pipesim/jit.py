"""Optional compilation with numba: ``jit`` compiles a numeric kernel when numba is present."""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Callable
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])

# PIPESIM_NO_JIT=1 runs every kernel as plain Python (the reference; slower but always available).
_DISABLED = os.environ.get("PIPESIM_NO_JIT", "") not in ("", "0")

#: True when kernels decorated with ``jit`` are compiled (numba installed and not disabled).
#: numba itself is imported only when a kernel is first called (it costs ~0.3 s and ~125 MiB).
ENABLED: bool = not _DISABLED and importlib.util.find_spec("numba") is not None


class _LazyKernel:
    """A kernel compiled by numba on its first call; ``py_func`` is the plain Python function."""

    def __init__(self, function: Callable[..., Any]) -> None:
        functools.update_wrapper(self, function)
        self.py_func = function
        self._compiled: Callable[..., Any] | None = None

    def __call__(self, *args: Any) -> Any:
        return self.dispatcher()(*args)

    def dispatcher(self) -> Callable[..., Any]:
        """numba's compiled function (made on the first request): call it directly in hot loops,
        where this wrapper's own call costs about a microsecond."""
        if self._compiled is None:
            numba = importlib.import_module("numba")
            self._compiled = numba.njit(cache=True, nogil=True)(self.py_func)
        return self._compiled


def jit(function: F) -> F:
    """Compile ``function`` in numba's nopython mode (cached on disk), or return it unchanged.

    Kernels must therefore be written in the subset of Python and numpy that numba compiles,
    and give the same results either way: no fastmath, the same floating-point operations in
    the same order, so compiled and plain runs are bit-identical. Kernels are called from
    Python only (not from one another): the compiled function is made on the first call.
    """
    if not ENABLED:
        return function
    return cast(F, _LazyKernel(function))


def compiled(kernel: F) -> F:
    """The function to call for ``kernel`` in a hot loop: numba's dispatcher when kernels are
    compiled (skipping the lazy wrapper), else ``kernel`` itself."""
    if isinstance(kernel, _LazyKernel):
        return cast(F, kernel.dispatcher())
    return kernel


def backend() -> str:
    """``"numba <version>"`` when kernels are compiled, else ``"python"`` (recorded in benchmarks)."""
    if not ENABLED:
        return "python"
    return f"numba {importlib.metadata.version('numba')}"
