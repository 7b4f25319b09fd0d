"""Gantt timeline of a trace: one row per device, ops colored by kind, microbatch numbers on bars."""

from __future__ import annotations

from typing import Any

from pipesim.engine.trace import Trace

KIND_COLORS = {"F": "#4C72B0", "B": "#DD8452", "I": "#C44E52", "W": "#8172B3", "U": "#55A868"}
SEND_COLOR = "#BBBBBB"


def timeline(trace: Trace, *, ax: Any = None, label_ops: bool | None = None, time_unit: str = "ms") -> Any:
    """Draw the trace as a Gantt chart and return the matplotlib Axes.

    Each device has a compute row and, beneath it, a thinner send row. Bars carry their
    microbatch number when there are few enough to read (``label_ops``; default: up to 400
    compute spans). Idle gaps are the bubbles.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[time_unit]
    if ax is None:
        _, ax = plt.subplots(figsize=(12, 1.0 + 0.6 * int(trace.meta["num_ranks"])))
    frame = trace.to_frame()
    compute = frame[frame["stream"] == "compute"]
    if label_ops is None:
        label_ops = len(compute) <= 400
    for row in frame.itertuples(index=False):
        start = row.start_s * scale
        width = (row.end_s - row.start_s) * scale
        if row.stream == "compute":
            ax.broken_barh([(start, width)], (row.device - 0.4, 0.6),
                           facecolors=KIND_COLORS[row.kind], edgecolor="white", linewidth=0.3)
            if label_ops and row.kind != "U":
                ax.text(start + width / 2, row.device - 0.1, str(row.microbatch), ha="center",
                        va="center", fontsize=6, color="white")
        else:
            ax.broken_barh([(start, width)], (row.device + 0.22, 0.16), facecolors=SEND_COLOR)
    ax.set_yticks(range(int(trace.meta["num_ranks"])))
    ax.set_yticklabels([f"device {d}" for d in range(int(trace.meta["num_ranks"]))])
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({time_unit})")
    ax.set_ylabel("device")
    ax.set_title(f"{trace.meta['schedule']}: p={trace.meta['num_stages']}, m={trace.meta['num_microbatches']}, "
                 f"K={trace.meta['num_minibatches']}")
    kinds = sorted(set(compute["kind"]), key=list(KIND_COLORS).index)
    handles = [Patch(color=KIND_COLORS[k], label=k) for k in kinds] + [Patch(color=SEND_COLOR, label="send")]
    ax.legend(handles=handles, loc="upper right", fontsize=7, ncols=len(handles))
    return ax
