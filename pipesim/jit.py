"""Optional compilation with numba, and the one policy that decides when compiled kernels run.

A kernel is written once, in the subset of Python and numpy that numba compiles. ``jit``
wraps it: ``kernel.py_func`` is the plain-Python function, ``compiled(kernel)`` numba's
(made on first use). Which of the two a run uses is ``use_compiled(num_ops)``: an explicit
setting, or the run's own size, never what the process ran before. Both give the same bits.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import time
import types
from collections.abc import Callable
from typing import Any, Literal, TypeVar, cast, overload

F = TypeVar("F", bound=Callable[..., Any])
JitSetting = Literal["auto", "always", "never"]
JIT_SETTINGS: tuple[JitSetting, ...] = ("auto", "always", "never")

#: True when numba is installed (it is imported only when a compiled kernel is first asked for:
#: its start-up costs ~0.3 s and ~100 MiB).
AVAILABLE: bool = importlib.util.find_spec("numba") is not None

#: With ``auto``, runs of at least this many ops use the compiled kernels. Below it the
#: plain-Python kernels finish before numba has started (benchmarks/RESULTS.md, "Kernel policy").
COMPILED_FROM_OPS = 50_000


def setting_from_environment() -> JitSetting:
    """``PIPESIM_JIT`` (auto, always or never; default auto); ``PIPESIM_NO_JIT=1`` means never."""
    if os.environ.get("PIPESIM_NO_JIT", "") not in ("", "0"):
        return "never"
    value = os.environ.get("PIPESIM_JIT", "auto").strip().lower() or "auto"
    if value not in JIT_SETTINGS:
        from pipesim.errors import ConfigError  # noqa: PLC0415 - errors imports nothing back
        raise ConfigError("PIPESIM_JIT", value, "must be one of auto, always, never")
    return "always" if value == "always" else "never" if value == "never" else "auto"


def use_compiled(num_ops: int, setting: JitSetting | None = None) -> bool:
    """Whether a run of ``num_ops`` ops uses numba's kernels.

    Args:
        setting: ``"always"`` (when numba is installed), ``"never"``, or ``"auto"``: from
            ``COMPILED_FROM_OPS`` ops on. None reads ``setting_from_environment()``.
    """
    chosen = setting_from_environment() if setting is None else setting
    if chosen not in JIT_SETTINGS:
        from pipesim.errors import ConfigError  # noqa: PLC0415
        raise ConfigError("kernels", chosen, "must be one of auto, always, never")
    if not AVAILABLE or chosen == "never":
        return False
    return chosen == "always" or num_ops >= COMPILED_FROM_OPS


_startup = [0.0]


def startup_s() -> float:
    """Seconds this process has spent starting numba: importing it and loading (or compiling)
    each kernel's machine code for the argument types it was first called with. A one-time
    cost per process, which ``simulate`` reports apart from the engine's own time."""
    return _startup[0]


class Kernel:
    """A kernel written once: ``py_func`` runs it as Python, ``dispatcher()`` compiles it with numba.

    A kernel may call other kernels by their module-level names: its plain form calls their
    plain forms and its compiled form their compiled forms; a kernel made with ``inline=True``
    is inlined into its compiled callers (numba's ``inline="always"``: no call per use, for a
    kernel called once per op or so), and still has a dispatcher of its own.
    """

    def __init__(self, function: Callable[..., Any], inline: bool = False) -> None:
        self.__name__ = function.__name__
        self.__qualname__ = function.__qualname__
        self.__doc__ = function.__doc__
        self.__module__ = function.__module__
        self.__wrapped__ = function
        self._plain: Callable[..., Any] | None = None
        self._compiled: Callable[..., Any] | None = None
        self._inlined: Callable[..., Any] | None = None
        self.inline = inline
        self._loaded = False

    def __call__(self, *args: Any) -> Any:
        """Run the plain-Python form (callers choose the compiled one with ``pick``)."""
        return self.py_func(*args)

    @property
    def py_func(self) -> Callable[..., Any]:
        """The plain-Python function, calling the plain forms of the kernels it uses."""
        if self._plain is None:
            self._plain = self._with_callees(lambda kernel: kernel.py_func)
        return self._plain

    def dispatcher(self) -> Callable[..., Any]:
        """numba's compiled function (compiled, or loaded from numba's disk cache, on first use)."""
        if self._compiled is None:
            started = time.perf_counter()
            numba = importlib.import_module("numba")
            self._compiled = numba.njit(cache=True, nogil=True)(self._with_callees(_compiled_form))
            _startup[0] += time.perf_counter() - started
        return self._compiled

    def inlined(self) -> Callable[..., Any]:
        """The form compiled callers inline (never compiled on its own)."""
        if self._inlined is None:
            numba = importlib.import_module("numba")
            self._inlined = numba.njit(inline="always", nogil=True)(self._with_callees(_compiled_form))
        return self._inlined

    def _load_then_call(self, *args: Any) -> Any:
        """The first compiled call: load (or compile) the machine code for these argument types,
        counted in ``startup_s`` (``entry_point``), then run it."""
        return self.entry_point(*args)(*args)

    def entry_point(self, *args: Any) -> Callable[..., Any]:
        """The compiled machine code's own entry for the types of ``args`` (loaded or compiled
        now, counted in ``startup_s``): a call skips the dispatcher's matching of argument types,
        a few hundred ns that a kernel called once per event would pay each time. Every call
        must pass arguments of these types."""
        dispatcher: Any = self.dispatcher()
        started = time.perf_counter()
        entry: Callable[..., Any] = dispatcher.compile(tuple(dispatcher.typeof_pyval(arg) for arg in args))
        if not self._loaded:
            _startup[0] += time.perf_counter() - started
            self._loaded = True
        return entry

    def _with_callees(self, form: Callable[[Kernel], Callable[..., Any]]) -> Callable[..., Any]:
        function = self.__wrapped__
        assert isinstance(function, types.FunctionType)
        callees = {name: form(value) for name, value in function.__globals__.items()
                   if isinstance(value, Kernel) and name in function.__code__.co_names}
        if not callees:
            return function
        rebound = types.FunctionType(function.__code__, {**function.__globals__, **callees}, function.__name__,
                                     function.__defaults__, function.__closure__)
        rebound.__qualname__ = function.__qualname__
        rebound.__module__ = function.__module__
        return rebound


def _compiled_form(kernel: Kernel) -> Callable[..., Any]:
    """What a compiled kernel calls for ``kernel``: its inlined form or its dispatcher."""
    return kernel.inlined() if kernel.inline else kernel.dispatcher()


@overload
def jit(function: F) -> F: ...


@overload
def jit(*, inline: bool = False) -> Callable[[F], F]: ...


def jit(function: F | None = None, *, inline: bool = False) -> F | Callable[[F], F]:
    """Mark ``function`` as a kernel (see ``Kernel``): ``@jit`` or ``@jit(inline=True)``.

    Kernels give the same results either way: no fastmath, the same floating-point operations
    in the same order, so compiled and plain runs are bit-identical.
    """
    def mark(wrapped: F) -> F:
        return cast(F, Kernel(wrapped, inline))

    return mark if function is None else mark(function)


def pick(kernel: F, compiled: bool) -> F:
    """The function to call for ``kernel``: numba's dispatcher when ``compiled`` (and numba is
    installed), else the plain-Python function."""
    if not isinstance(kernel, Kernel):
        return kernel
    if not (compiled and AVAILABLE):
        return cast(F, kernel.py_func)
    return cast(F, kernel.dispatcher() if kernel._loaded else kernel._load_then_call)


def pick_for(kernel: F, compiled: bool, *args: Any) -> F:
    """``pick``, where a compiled kernel is called many times with arguments of the types of
    ``args``: its entry point for them (``Kernel.entry_point``)."""
    if not (compiled and AVAILABLE and isinstance(kernel, Kernel)):
        return pick(kernel, compiled)
    return cast(F, kernel.entry_point(*args))


def backend(compiled: bool = True) -> str:
    """``"numba <version>"`` when kernels can be compiled (and ``compiled``), else ``"python"``."""
    if not (AVAILABLE and compiled):
        return "python"
    return f"numba {importlib.metadata.version('numba')}"
