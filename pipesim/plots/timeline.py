"""Gantt timeline of a trace: one row per device, ops colored by kind, labels on the bars that fit them,
and the steady-state window the iteration time is measured over."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from pipesim.engine.trace import KINDS, STREAMS, Trace
from pipesim.metrics import steady_window
from pipesim.plots import style
from pipesim.plots.style import IDLE_COLOR, KIND_COLORS, SEND_COLORS, darken

# Vertical layout of a device's row (y grows downward once the axis is inverted).
COMPUTE_TOP, COMPUTE_BOTTOM = -0.40, 0.14
SEND_ROWS = {"activations": (0.18, 0.28), "gradients": (0.30, 0.40)}
_COMPUTE, _SEND = STREAMS.index("compute"), STREAMS.index("send")
# Text drawn per figure at most: beyond it every row keeps an evenly thinned share of its labels.
MAX_LABELS = 3000
# How much a device's later stages are darkened (the last one by this much), as torch's visualizer shades
# chunks; darker, not lighter, so that they cannot be taken for the pale send bars.
CHUNK_DARKEN = 0.4
_LABEL_PX_PER_CHAR, _LABEL_MARGIN_PX = 4.2, 2.0


def chunk_of_stage(trace: Trace) -> tuple[list[int], int]:
    """Each stage's index among its device's stages (0 for the first), and the most stages on one device."""
    stage_to_rank = list(trace.info.stage_to_rank)
    seen: dict[int, int] = {}
    chunks = []
    for rank in stage_to_rank:
        chunks.append(seen.get(rank, 0))
        seen[rank] = seen.get(rank, 0) + 1
    return chunks, max(seen.values(), default=1)


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
    shaded grey. Bars carry their microbatch number, or with several stages on a device the
    whole op (``0F3``: stage, kind, microbatch), and the device's later stages are drawn
    darker, so its chunks tell apart. Labels go where they fit (``label_ops``: None decides
    by bar width, True/False forces), at most ``MAX_LABELS``, thinned evenly on every row
    beyond that. Dashed lines (gid ``window``) bound the steady-state window the iteration
    time is measured over, when it is not the whole run. Every op is one polygon in a
    collection whose gid is ``compute:<kind>``, ``send:activations``, ``send:gradients`` or
    ``idle``.

    Args:
        trace: what an engine recorded.
        ax: Axes to draw on (default: a new figure sized to the number of devices).
        time_unit: ``"s"``, ``"ms"`` or ``"us"`` (default: by the makespan).
        show_idle: shade the bubbles.
    """
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection
    from matplotlib.lines import Line2D
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
    chunks, per_device = chunk_of_stage(trace)
    shade = np.asarray(chunks, dtype=np.float64) * (CHUNK_DARKEN / max(per_device - 1, 1))
    for code, kind in enumerate(KINDS):
        mask = (s["stream"] == _COMPUTE) & (s["kind"] == code)
        if not mask.any():
            continue
        kinds_drawn.append(kind)
        is_update = kind == "U"
        edges = np.where(outlined[mask] & (not is_update), "white", KIND_COLORS[kind])
        faces = [darken(KIND_COLORS[kind], amount) for amount in shade[s["stage"][mask]].tolist()]
        bars = PolyCollection(
            list(_rectangles(start[mask], end[mask], device[mask], COMPUTE_TOP, COMPUTE_BOTTOM)),
            facecolors=faces, edgecolors=list(edges),
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
    _label_bars(ax, trace, start, end, label_ops, whole_op=per_device > 1)
    window = _mark_window(ax, trace, scale)
    stage_to_rank = list(trace.info.stage_to_rank)
    ax.set_yticks(range(num_ranks))
    ax.set_yticklabels([
        f"device {d}\n" + "stage " + ",".join(str(st) for st, r in enumerate(stage_to_rank) if r == d)
        for d in range(num_ranks)
    ], fontsize=8 if num_ranks <= 16 else 5)
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("device")
    handles: list[Any] = [Patch(facecolor=KIND_COLORS[k], label=k) for k in kinds_drawn]
    if per_device > 1:
        handles.append(Patch(facecolor=darken(KIND_COLORS["F"], CHUNK_DARKEN), label="darker: device's later stages"))
    handles += [Patch(facecolor=SEND_COLORS[n], label=f"send {n}") for n in sends_drawn]
    if show_idle:
        handles.append(Patch(facecolor=IDLE_COLOR, label="idle (bubble)"))
    if window:
        handles.append(Line2D([], [], color="black", linestyle="--", linewidth=0.9, label=window))
    ax.legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=7, ncols=len(handles),
              frameon=False, borderaxespad=0.2, handlelength=1.2, columnspacing=1.0)
    # A long legend takes the whole width above the axes: the title then goes on a line above it.
    info = trace.info
    ax.set_title(f"{info.schedule}: p={info.num_stages}, m={info.num_microbatches}, "
                 f"K={info.num_minibatches} ({info.engine or '?'} engine)", loc="left",
                 fontsize=10, pad=18 if len(handles) > 6 else 6)
    return ax


_SCALES = {"s": 1.0, "ms": 1e3, "us": 1e6}


def _px_per_unit(ax: Any) -> float:
    """Display pixels per x unit, from the figure size and the axes' share of it (before layout)."""
    figure = ax.figure
    low, high = ax.get_xlim()
    return float(figure.get_figwidth() * figure.dpi * ax.get_position().width / (high - low))


def _mark_window(ax: Any, trace: Trace, scale: float) -> str:
    """Dashed lines at the steady-state window's ends; its legend label, or "" for the whole run."""
    low, high, warmup, cooldown = steady_window(trace)
    if not (warmup or cooldown):
        return ""
    for x in (low * scale, high * scale):
        ax.axvline(x, color="black", linestyle="--", linewidth=0.9, zorder=5, gid="window")
    last = trace.info.num_minibatches - cooldown - 1
    return f"iteration time window (minibatches {warmup}..{last})"


def _label_bars(ax: Any, trace: Trace, start: npt.NDArray[np.float64], end: npt.NDArray[np.float64],
                label_ops: bool | None, *, whole_op: bool) -> None:
    """Microbatch numbers (``whole_op``: the op, ``0F3``, where it fits) on F/B/I/W bars wide enough
    to hold them (all of them when forced), at most MAX_LABELS, each device's row thinned alike
    beyond that."""
    if label_ops is False:
        return
    s = trace.spans
    mask = (s["stream"] == _COMPUTE) & (s["kind"] != KINDS.index("U"))
    indices = np.flatnonzero(mask)
    stages, kinds, microbatches = (s[c][indices].tolist() for c in ("stage", "kind", "microbatch"))
    short = [str(mb) for mb in microbatches]
    texts = [f"{st}{KINDS[k]}{mb}" for st, k, mb in zip(stages, kinds, microbatches, strict=True)] if whole_op \
        else short
    if label_ops is None:
        # The whole op where it fits, else its microbatch number (the shade still tells the stage), else nothing.
        room = (end[indices] - start[indices]) * _px_per_unit(ax) - _LABEL_MARGIN_PX
        texts = [text if len(text) * _LABEL_PX_PER_CHAR <= width else
                 number if len(number) * _LABEL_PX_PER_CHAR <= width else ""
                 for text, number, width in zip(texts, short, room.tolist(), strict=True)]
        wide = np.asarray([bool(text) for text in texts], dtype=bool)
        texts = [text for text in texts if text]
        indices = indices[wide]
    if indices.size > MAX_LABELS:
        stride = -(-indices.size // MAX_LABELS)
        keep = np.zeros(indices.size, dtype=bool)
        for row in np.unique(s["device"][indices]).tolist():
            mine = np.flatnonzero(s["device"][indices] == row)
            keep[mine[::stride]] = True
        texts = [text for text, kept in zip(texts, keep.tolist(), strict=True) if kept]
        indices = indices[keep]
    for row, text in zip(indices.tolist(), texts, strict=True):
        ax.text((start[row] + end[row]) / 2, float(s["device"][row]) + (COMPUTE_TOP + COMPUTE_BOTTOM) / 2,
                text, ha="center", va="center", fontsize=6, color="white", zorder=4, clip_on=True)
