"""Gantt timeline of a trace: one row per device, ops colored by kind, microbatch numbers on bars."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from pipesim.engine.trace import KINDS, STREAMS, Trace
from pipesim.plots import style
from pipesim.plots.style import IDLE_COLOR, KIND_COLORS, SEND_COLORS

# Vertical layout of a device's row (y grows downward once the axis is inverted).
COMPUTE_TOP, COMPUTE_BOTTOM = -0.40, 0.14
SEND_ROWS = {"activations": (0.18, 0.28), "gradients": (0.30, 0.40)}
_COMPUTE, _SEND = STREAMS.index("compute"), STREAMS.index("send")


def _rectangles(x0: npt.NDArray[np.float64], x1: npt.NDArray[np.float64], y: npt.NDArray[np.float64],
                top: float, bottom: float) -> npt.NDArray[np.float64]:
    """Vertices of axis-aligned rectangles, shape (n, 4, 2)."""
    verts = np.empty((x0.size, 4, 2))
    verts[:, 0, 0] = verts[:, 1, 0] = x0
    verts[:, 2, 0] = verts[:, 3, 0] = x1
    verts[:, 0, 1] = verts[:, 3, 1] = y + top
    verts[:, 1, 1] = verts[:, 2, 1] = y + bottom
    return verts


def idle_gaps(trace: Trace, device: int) -> list[tuple[float, float]]:
    """Intervals of ``[0, makespan]`` in which ``device``'s compute stream runs nothing (its bubbles)."""
    s = trace.spans
    mine = (s["stream"] == _COMPUTE) & (s["device"] == device)
    order = np.argsort(s["start_s"][mine], kind="stable")
    starts, ends = s["start_s"][mine][order], s["end_s"][mine][order]
    gaps, cursor = [], 0.0
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        if start > cursor:
            gaps.append((cursor, start))
        cursor = max(cursor, end)
    if trace.makespan_s > cursor:
        gaps.append((cursor, trace.makespan_s))
    return gaps


def timeline(trace: Trace, *, ax: Any = None, label_ops: bool | None = None, time_unit: str | None = None,
             show_idle: bool = True) -> Any:
    """Draw the trace as a Gantt chart and return the matplotlib Axes.

    Each device has a compute row (F, B, I, W bars colored by kind; an update U is a green
    mark, a zero-length one a line) and beneath it two thin send rows: activations going
    forward and gradients going back. Idle stretches of the compute row, the bubbles, are
    shaded grey. Bars carry their microbatch number where it fits (``label_ops``: None
    decides by bar width, True/False forces). Every op is one polygon in a collection whose
    gid is ``compute:<kind>``, ``send:activations``, ``send:gradients`` or ``idle``.

    Args:
        trace: what an engine recorded.
        ax: Axes to draw on (default: a new figure sized to the number of devices).
        time_unit: ``"s"``, ``"ms"`` or ``"us"`` (default: by the makespan).
        show_idle: shade the bubbles.
    """
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Patch

    num_ranks = trace.info.num_ranks
    makespan = trace.makespan_s
    unit, scale = style.time_unit(makespan) if time_unit is None else (time_unit, _SCALES[time_unit])
    if ax is None:
        row_height = 0.62 if num_ranks <= 16 else max(0.16, 10.0 / num_ranks)
        _, ax = plt.subplots(figsize=(12, 1.6 + row_height * num_ranks))
    s = trace.spans
    device = s["device"].astype(np.float64)
    start, end = s["start_s"] * scale, s["end_s"] * scale
    ax.set_xlim(0, max(makespan * scale, 1e-12) * 1.005)
    ax.set_ylim(num_ranks - 0.5, -0.5)
    # Bars narrower than a few pixels lose their white outline, which would otherwise hide their color.
    outlined = (end - start) * _px_per_unit(ax) >= 3.0
    if show_idle:
        idle = [(d, a * scale, b * scale) for d in range(num_ranks) for a, b in idle_gaps(trace, d)]
        if idle:
            arr = np.asarray(idle)
            gaps = PolyCollection(list(_rectangles(arr[:, 1], arr[:, 2], arr[:, 0], COMPUTE_TOP, COMPUTE_BOTTOM)),
                                  facecolors=IDLE_COLOR, edgecolors="none", zorder=1)
            gaps.set_gid("idle")
            ax.add_collection(gaps)
    kinds_drawn = []
    for code, kind in enumerate(KINDS):
        mask = (s["stream"] == _COMPUTE) & (s["kind"] == code)
        if not mask.any():
            continue
        kinds_drawn.append(kind)
        is_update = kind == "U"
        edges = np.where(outlined[mask] & (not is_update), "white", KIND_COLORS[kind])
        bars = PolyCollection(
            list(_rectangles(start[mask], end[mask], device[mask], COMPUTE_TOP, COMPUTE_BOTTOM)),
            facecolors=KIND_COLORS[kind], edgecolors=list(edges),
            linewidths=1.2 if is_update else 0.3, zorder=3 if is_update else 2,
        )
        bars.set_gid(f"compute:{kind}")
        ax.add_collection(bars)
    sends_drawn = []
    for name, (top, bottom) in SEND_ROWS.items():
        forward = s["kind"] == KINDS.index("F")
        mask = (s["stream"] == _SEND) & (forward if name == "activations" else ~forward)
        if not mask.any():
            continue
        sends_drawn.append(name)
        edges = np.where(outlined[mask], "white", SEND_COLORS[name])
        bars = PolyCollection(list(_rectangles(start[mask], end[mask], device[mask], top, bottom)),
                              facecolors=SEND_COLORS[name], edgecolors=list(edges), linewidths=0.2, zorder=2)
        bars.set_gid(f"send:{name}")
        ax.add_collection(bars)
    _label_bars(ax, trace, start, end, label_ops)
    stage_to_rank = list(trace.info.stage_to_rank)
    ax.set_yticks(range(num_ranks))
    ax.set_yticklabels([
        f"device {d}\n" + "stage " + ",".join(str(st) for st, r in enumerate(stage_to_rank) if r == d)
        for d in range(num_ranks)
    ], fontsize=8 if num_ranks <= 16 else 5)
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("device")
    info = trace.info
    ax.set_title(f"{info.schedule}: p={info.num_stages}, m={info.num_microbatches}, "
                 f"K={info.num_minibatches} ({info.engine or '?'} engine)", loc="left",
                 fontsize=10)
    handles = [Patch(facecolor=KIND_COLORS[k], label=k) for k in kinds_drawn]
    handles += [Patch(facecolor=SEND_COLORS[n], label=f"send {n}") for n in sends_drawn]
    if show_idle:
        handles.append(Patch(facecolor=IDLE_COLOR, label="idle (bubble)"))
    ax.legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=7, ncols=len(handles),
              frameon=False, borderaxespad=0.2, handlelength=1.2, columnspacing=1.0)
    return ax


_SCALES = {"s": 1.0, "ms": 1e3, "us": 1e6}


def _px_per_unit(ax: Any) -> float:
    """Display pixels per x unit, from the figure size and the axes' share of it (before layout)."""
    figure = ax.figure
    low, high = ax.get_xlim()
    return float(figure.get_figwidth() * figure.dpi * ax.get_position().width / (high - low))


def _label_bars(ax: Any, trace: Trace, start: npt.NDArray[np.float64], end: npt.NDArray[np.float64],
                label_ops: bool | None) -> None:
    """Microbatch numbers on F/B/I/W bars wide enough to hold them (all of them when forced)."""
    if label_ops is False:
        return
    s = trace.spans
    px_per_unit = _px_per_unit(ax)
    mask = (s["stream"] == _COMPUTE) & (s["kind"] != KINDS.index("U"))
    indices = np.flatnonzero(mask)
    if label_ops is None:
        digits = np.floor(np.log10(np.maximum(s["microbatch"][indices], 1))) + 1
        wide = (end[indices] - start[indices]) * px_per_unit >= 5.0 * digits + 2
        indices = indices[wide]
        if indices.size > 2000:
            return
    for row in indices.tolist():
        ax.text((start[row] + end[row]) / 2, float(s["device"][row]) + (COMPUTE_TOP + COMPUTE_BOTTOM) / 2,
                str(int(s["microbatch"][row])), ha="center", va="center", fontsize=6, color="white", zorder=4,
                clip_on=True)
