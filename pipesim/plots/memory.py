"""Memory plots: one stage's bytes over time stacked by kind, and every stage's peak by kind."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipesim.engine.trace import CATEGORIES, Trace
from pipesim.metrics import Metrics, compute_metrics, memory_over_time
from pipesim.plots.style import CATEGORY_COLORS, byte_unit, legend_beside, time_unit


def peak_stage(trace: Trace) -> int:
    """The stage whose memory peaks highest (the lowest index on a tie)."""
    frame = memory_over_time(trace)
    if frame.empty:
        return 0
    peaks = frame.groupby("stage")["total"].max()
    return int(peaks.idxmax())


def memory(trace: Trace, *, stage: int | None = None, ax: Any = None) -> Any:
    """Memory of one stage over time, stacked by kind (weights, gradients, optimizer, activations).

    Levels step at each event and hold until the next; the device's memory limit, when the
    topology gives one, is a dashed red line. Each kind is one filled area whose gid is
    ``memory:<kind>``.

    Args:
        trace: what an engine recorded.
        stage: the stage to draw (default: the one with the highest peak).
        ax: Axes to draw on (default: a new figure).

    Raises:
        ValueError: ``stage`` is not a stage of the trace.
    """
    import matplotlib.pyplot as plt

    num_stages = trace.info.num_stages
    chosen = peak_stage(trace) if stage is None else stage
    if not 0 <= chosen < num_stages:
        raise ValueError(f"stage must be in 0..{num_stages - 1}, got {chosen}")
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 4))
    frame = memory_over_time(trace)
    mine = frame[frame["stage"] == chosen]
    makespan = trace.makespan_s
    unit, scale = time_unit(makespan)
    times = np.r_[mine["time_s"].to_numpy(), makespan] * scale
    peak = float(mine["total"].max()) if len(mine) else 0.0
    limits = trace.info.device_memory_bytes
    rank = trace.info.stage_to_rank[chosen]
    limit = limits[rank] if rank < len(limits) else None
    size_unit, divisor = byte_unit(max(peak, limit or 0.0))
    lower = np.zeros(times.size)
    for category in CATEGORIES:
        values = mine[category].to_numpy() / divisor
        upper = lower + np.r_[values, values[-1] if values.size else 0.0]
        area = ax.fill_between(times, lower, upper, step="post", color=CATEGORY_COLORS[category],
                               label=category, linewidth=0)
        area.set_gid(f"memory:{category}")
        lower = upper
    if limit is not None:
        ax.axhline(limit / divisor, color="#C44E52", linestyle="--", linewidth=1.2, label="device memory")
    ax.set_xlim(0, times[-1] if times.size and times[-1] > 0 else 1.0)
    ax.set_ylim(0, max(peak, limit or 0.0) / divisor * 1.08 or 1.0)
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel(f"memory ({size_unit})")
    ax.set_title(f"{trace.info.schedule}: memory of stage {chosen} (device {rank}), "
                 f"peak {peak / divisor:.2f} {size_unit}", loc="left", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    legend_beside(ax, handles[::-1], labels[::-1])
    return ax


def memory_breakdown(source: Trace | Metrics, *, ax: Any = None) -> Any:
    """Peak memory of every stage as one bar stacked by kind (its makeup at the peak instant).

    Each kind is one BarContainer labelled with the kind, holding one bar per stage.
    """
    import matplotlib.pyplot as plt

    metrics = compute_metrics(source) if isinstance(source, Trace) else source
    stages = metrics.stages
    if ax is None:
        _, ax = plt.subplots(figsize=(max(5.0, 0.35 * len(stages) + 3), 4))
    unit, divisor = byte_unit(max((s.peak_memory_bytes for s in stages), default=0.0))
    x = np.arange(len(stages))
    bottom = np.zeros(len(stages))
    for category in CATEGORIES:
        heights = np.array([s.peak_breakdown_bytes.get(category, 0.0) for s in stages]) / divisor
        ax.bar(x, heights, bottom=bottom, color=CATEGORY_COLORS[category], label=category, width=0.7)
        bottom += heights
    # Autoscaling snaps the lower limit to a stacked segment's base within 1e-5 of the range (a tiny bottom
    # segment's top, a hair above 0, which drops the 0 tick) and the upper one to an empty top segment's
    # edge (the tallest bar touching the frame): both set here, with the headroom the margins would give.
    ax.set_ylim(0.0, float(bottom.max()) * 1.05 or 1.0)
    ax.set_xticks(x)
    ax.set_xticklabels([str(s.stage) for s in stages], fontsize=8 if len(stages) <= 32 else 5)
    ax.set_xlabel("stage")
    ax.set_ylabel(f"peak memory ({unit})")
    ax.set_title(f"{metrics.schedule}: peak memory per stage, by kind", loc="left", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    legend_beside(ax, handles[::-1], labels[::-1])
    return ax
