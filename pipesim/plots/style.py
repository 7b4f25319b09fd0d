"""Shared looks of the plots: colors per op kind, memory category and schedule, and unit scaling."""

from __future__ import annotations

KIND_COLORS = {"F": "#4C72B0", "B": "#DD8452", "I": "#C44E52", "W": "#8172B3", "U": "#2CA02C"}
SEND_COLORS = {"activations": "#9DB4D8", "gradients": "#EDB98F"}
IDLE_COLOR = "#E9E9E9"
CATEGORY_COLORS = {"weights": "#4C72B0", "gradients": "#8172B3", "optimizer": "#937860", "activations": "#DD8452"}
SCHEDULE_COLORS = {"gpipe": "#4C72B0", "1f1b": "#DD8452", "pipedream": "#55A868", "2bw": "#C44E52",
                   "pipemare": "#8172B3"}
_EXTRA_COLORS = ("#937860", "#DA8BC3", "#8C8C8C", "#CCB974", "#64B5CD")


def schedule_color(name: str, index: int = 0) -> str:
    """The color of a schedule (a fixed one for the five seed schedules)."""
    return SCHEDULE_COLORS.get(name, _EXTRA_COLORS[index % len(_EXTRA_COLORS)])


def time_unit(span_s: float) -> tuple[str, float]:
    """``(unit, factor)`` to show times of about ``span_s`` seconds: s, ms or us."""
    if span_s >= 1:
        return "s", 1.0
    if span_s >= 1e-3:
        return "ms", 1e3
    return "us", 1e6


def byte_unit(peak_bytes: float) -> tuple[str, float]:
    """``(unit, divisor)`` to show byte counts up to ``peak_bytes``: GB, MB, KB or B (decimal)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if peak_bytes >= size:
            return unit, size
    return "B", 1.0
