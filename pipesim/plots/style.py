"""Shared looks of the plots: colors per op kind, memory category and schedule, and unit scaling."""

from __future__ import annotations

import hashlib
from typing import Any

KIND_COLORS = {"F": "#4C72B0", "B": "#DD8452", "I": "#C44E52", "W": "#8172B3", "U": "#2CA02C"}
SEND_COLORS = {"activations": "#9DB4D8", "gradients": "#EDB98F"}
IDLE_COLOR = "#E9E9E9"
CATEGORY_COLORS = {"weights": "#4C72B0", "gradients": "#8172B3", "optimizer": "#937860", "activations": "#DD8452",
                   "working": "#C44E52"}
# One color per schedule in every figure (a report's or a sweep's figures agree with each other).
SCHEDULE_COLORS = {"gpipe": "#4C72B0", "1f1b": "#DD8452", "pipedream": "#55A868", "2bw": "#C44E52",
                   "pipemare": "#8172B3", "interleaved-1f1b": "#937860", "looped-bfs": "#DA8BC3",
                   "interleaved-zb": "#8C8C8C", "zbv": "#CCB974", "dualpipev": "#64B5CD", "zb-h1": "#2F4B7C",
                   "zb-h2": "#1B9E77", "zb-auto": "#0B6E4F"}
_EXTRA_COLORS = ("#A05195", "#665191", "#D45087", "#F95D6A", "#FF7C43", "#FFA600")


def schedule_color(name: str) -> str:
    """The color of a schedule: fixed for the registry's schedules; any other name (a custom CSV)
    gets one chosen by a hash of the name, so it too is the same in every figure and every run."""
    if name in SCHEDULE_COLORS:
        return SCHEDULE_COLORS[name]
    return _EXTRA_COLORS[int(hashlib.sha256(name.encode("utf-8")).hexdigest(), 16) % len(_EXTRA_COLORS)]


def darken(color: str, amount: float) -> str:
    """``color`` (``#RRGGBB``) mixed with black: ``amount`` 0 keeps it, 1 gives black."""
    channels = [int(color[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c * (1 - amount)):02X}" for c in channels)


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


def legend_beside(ax: Any, handles: Any = None, labels: Any = None, **options: Any) -> Any:
    """A legend to the right of ``ax``, outside its plotting area, so that it covers no data
    (``handles`` and ``labels``: as ``Axes.legend`` takes them; ``options`` override the place)."""
    settings = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0, "fontsize": 8} | options
    if handles is None:
        return ax.legend(**settings)
    return ax.legend(handles, labels, **settings)
