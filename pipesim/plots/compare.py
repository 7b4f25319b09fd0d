"""Several runs' timelines stacked on one time axis, for schedules compared side by side."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipesim.engine.trace import Trace
from pipesim.plots import style
from pipesim.plots.timeline import timeline


def stacked_timelines(traces: Sequence[Trace]) -> Any:
    """One Gantt chart per trace, top to bottom, sharing the time axis of the longest; returns the last Axes.

    Raises:
        ValueError: no traces.
    """
    import matplotlib.pyplot as plt

    if not traces:
        raise ValueError("stacked_timelines needs at least one trace")
    heights = [1.6 + 0.5 * trace.info.num_ranks for trace in traces]
    _, axes = plt.subplots(len(traces), 1, figsize=(12, sum(heights)), height_ratios=heights, squeeze=False)
    longest = max(trace.makespan_s for trace in traces)
    unit, _ = style.time_unit(longest)
    for ax, trace in zip(axes[:, 0], traces, strict=True):
        timeline(trace, ax=ax, time_unit=unit)
    right = max(ax.get_xlim()[1] for ax in axes[:, 0])
    for ax in axes[:, 0]:
        ax.set_xlim(0, right)
    return axes[-1, 0]
