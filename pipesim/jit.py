"""Optional compilation with numba, and the one policy that decides when compiled kernels run.

A kernel is written once, in the subset of Python and numpy that numba compiles. ``jit``
wraps it: ``kernel.py_func`` is the plain-Python function, ``compiled(kernel)`` numba's
(made on first use). Which of the two a run uses is ``use_compiled(num_ops)``: an explicit
setting, or the run's own size, never what the process ran before. Both give the same bits.
"""

from __future__ import annotations

import hashlib
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
            _key_cache_on_frozen_inputs(self._compiled, self.__wrapped__)
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


def frozen_inputs(function: Callable[..., Any]) -> str:
    """A digest of what numba freezes into ``function``'s machine code besides its own file: the
    values of the module-level names it reads, directly or as a module's attributes (numbers,
    text, arrays, tuples of them: constants once compiled), and, for each kernel it calls, that
    kernel's code (the names it reads included) and frozen inputs in turn.

    numba's disk cache is invalidated when the kernel's own source file changes, not when a
    constant it imports from another module or a kernel of another file does; this digest, part of
    the cache's key, makes such a change compile afresh.
    """
    digest = hashlib.sha256()
    _digest_inputs(function, digest, set())
    return digest.hexdigest()


def _digest_inputs(function: Callable[..., Any], digest: Any, seen: set[int]) -> None:
    if id(function) in seen or not isinstance(function, types.FunctionType):
        return
    seen.add(id(function))
    names = _names_read(function.__code__)
    for name in sorted(names):
        if name not in function.__globals__:
            continue
        value = function.__globals__[name]
        if isinstance(value, Kernel):
            callee = value.__wrapped__
            assert isinstance(callee, types.FunctionType)
            digest.update(f"kernel {name} {callee.__code__.co_filename}\n".encode() + _code_bytes(callee.__code__))
            _digest_inputs(callee, digest, seen)
        elif isinstance(value, types.ModuleType):  # ``module.CONSTANT``: the attributes the kernel may read
            for attribute in sorted(names):
                _digest_value(f"{name}.{attribute}", vars(value).get(attribute), digest)
        else:
            _digest_value(name, value, digest)


def _digest_value(name: str, value: Any, digest: Any) -> None:
    """Add a constant numba would freeze (a number, text, an array, a tuple of them) to ``digest``;
    anything else (functions, classes) is left out."""
    import numpy as np  # noqa: PLC0415 - loaded with numba by now; jit itself stays light

    if isinstance(value, (np.ndarray, np.generic)):
        digest.update(f"array {name} {value.dtype.str} {np.shape(value)}\n".encode() + np.ascontiguousarray(value).tobytes())
    elif isinstance(value, tuple):
        digest.update(f"tuple {name} {len(value)}\n".encode())
        for index, item in enumerate(value):
            _digest_value(f"{name}[{index}]", item, digest)
    elif isinstance(value, frozenset):
        digest.update(f"frozenset {name} {_stable_repr(value)}\n".encode())
    elif isinstance(value, (bool, int, float, complex, str, bytes)):
        digest.update(f"value {name} {type(value).__name__} {value!r}\n".encode())


def _names_read(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _names_read(constant)
    return names


def _code_bytes(code: types.CodeType) -> bytes:
    """A function's bytecode, the names it reads (globals, attributes: ``min`` or ``max``) and its
    constants, those of the functions it defines included."""
    nested = [c for c in code.co_consts if isinstance(c, types.CodeType)]
    plain = [_stable_repr(c) for c in code.co_consts if not isinstance(c, types.CodeType)]
    return (code.co_code + repr(code.co_names).encode() + repr(plain).encode()
            + b"".join(_code_bytes(c) for c in nested))


def _stable_repr(value: Any) -> str:
    """``repr`` with a frozenset's items sorted (``x in {"a", "b"}`` compiles to one, whose repr
    follows the string hashes, which differ from process to process)."""
    if isinstance(value, frozenset):
        return "frozenset(" + repr(sorted(map(_stable_repr, value))) + ")"
    if isinstance(value, tuple):
        return "(" + ", ".join(map(_stable_repr, value)) + ",)"
    return repr(value)


def _key_cache_on_frozen_inputs(dispatcher: Any, function: Callable[..., Any]) -> None:
    """Give ``dispatcher`` a disk cache whose key adds ``frozen_inputs(function)`` to numba's own
    (numba's internals: a numba without them keeps its own cache, keyed on the kernel's file)."""
    base = getattr(importlib.import_module("numba.core.caching"), "FunctionCache", None)
    if base is None or not hasattr(base, "_index_key") or not hasattr(dispatcher, "_cache"):
        return
    digest = frozen_inputs(function)

    class KeyedCache(base):  # type: ignore[misc, valid-type]
        def _index_key(self, sig: Any, codegen: Any) -> Any:
            return (*super()._index_key(sig, codegen), digest)

    dispatcher._cache = KeyedCache(dispatcher.py_func)


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
