"""The exceptions pipesim raises: user mistakes name the field, the value and the rule."""

from __future__ import annotations

from typing import Any


class PipesimError(Exception):
    """Base class of every error pipesim raises on purpose; its message is one line."""


class _Missing:
    """The value of a field the input left out (``MISSING``)."""

    def __repr__(self) -> str:
        return "MISSING"


#: ConfigError's value for a field that was not given: the message names the field alone.
MISSING: Any = _Missing()


class ConfigError(PipesimError, ValueError):
    """An input value breaks a rule.

    Args:
        field: dotted name of the offending field, e.g. ``"layers[3].forward_s"``.
        value: the value that was given, or ``MISSING`` for a field left out.
        rule: what the value must satisfy, e.g. ``"must be >= 0"``.
        source: optional file the value came from.
    """

    def __init__(self, field: str, value: Any, rule: str, *, source: str | None = None) -> None:
        self.field = field
        self.value = value
        self.rule = rule
        self.source = source
        where = f"{_printable(source)}: " if source else ""
        shown = "" if value is MISSING else f"={_short_repr(value)}"
        super().__init__(f"{where}{_printable(field)}{shown}: {_printable(rule)}")


class WriteFailedError(PipesimError):
    """The disk refused an output (full, a file-size limit, an I/O error): not the input's fault,
    so the command exits 1; the message names what could not be written and what was kept."""


class ScheduleError(PipesimError):
    """A schedule is malformed or cannot run; the message carries the grid with the failing op marked.

    Args:
        reason: one line saying what is wrong.
        grid: the schedule drawn one row per rank, the failing cell marked, or ``""``.
    """

    def __init__(self, reason: str, grid: str = "") -> None:
        self.reason = reason
        self.grid = grid
        super().__init__(reason if not grid else f"{reason}\n{grid}")


class DeadlockError(ScheduleError):
    """The engine reached a state where no op can start; the stuck ops are named."""


def interrupted(error: BaseException) -> bool:
    """Whether ``error`` is, or was raised because of, a KeyboardInterrupt (Ctrl-C): one that
    lands inside compiled code (numba loading a kernel) surfaces as another error caused by it."""
    seen: BaseException | None = error
    for _ in range(16):  # a chain of causes, never a cycle in practice
        if seen is None:
            return False
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _printable(text: str) -> str:
    """``text`` itself when printable on one line, else its escaped repr."""
    return text if text.isprintable() else repr(text)


def _short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters, built no further than that: a YAML spec's
    aliases can make a value of millions of items out of a few bytes, whose whole repr would
    take minutes and gigabytes before the cut."""
    pieces: list[str] = []
    _bounded_repr(value, pieces, [limit + 1])
    text = "".join(pieces)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_BRACKETS: dict[type, tuple[str, str]] = {list: ("[", "]"), tuple: ("(", ")"), dict: ("{", "}"), set: ("{", "}"),
                                           frozenset: ("frozenset({", "})")}


def _bounded_repr(value: Any, pieces: list[str], budget: list[int]) -> None:
    """Append ``repr(value)``'s text to ``pieces`` until ``budget[0]`` characters are spent."""
    kind = type(value)
    if kind in _BRACKETS and value:
        opening, closing = _BRACKETS[kind]
        _spend(opening, pieces, budget)
        for index, item in enumerate(value.items() if kind is dict else value):
            if budget[0] <= 0:
                return
            if index:
                _spend(", ", pieces, budget)
            if kind is dict:
                _bounded_repr(item[0], pieces, budget)
                _spend(": ", pieces, budget)
                item = item[1]
            _bounded_repr(item, pieces, budget)
        _spend("," + closing if kind is tuple and len(value) == 1 else closing, pieces, budget)
    elif kind is str:
        _spend(repr(value[: budget[0]]), pieces, budget)
    elif kind is int and value.bit_length() > 14_000:  # past int's 4,300-digit limit, repr() raises
        _spend(f"<an integer of {value.bit_length():,} bits>", pieces, budget)
    else:
        _spend(repr(value), pieces, budget)


def _spend(text: str, pieces: list[str], budget: list[int]) -> None:
    if budget[0] > 0:
        pieces.append(text[: budget[0]])
        budget[0] -= len(text)
