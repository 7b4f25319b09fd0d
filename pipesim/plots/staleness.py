"""Staleness per stage: weight versions held, forward delay and discrepancy, as grouped bars."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipesim.engine.trace import Trace
from pipesim.metrics import Metrics, compute_metrics
from pipesim.plots.style import legend_beside

SERIES = (
    ("weight versions held", "weight_versions_max", "#4C72B0"),
    ("forward delay, max (updates)", "forward_delay_steps", "#DD8452"),
    ("discrepancy, max (versions)", "discrepancy_max", "#8172B3"),
)


def staleness(source: Trace | Metrics, *, ax: Any = None) -> Any:
    """Per stage: most weight versions held, largest forward delay and largest discrepancy as
    grouped bars (one BarContainer per series, labelled as in SERIES), and the mean forward delay
    as black dots.

    Forward delay = updates between a microbatch's forward and the update that consumes its
    gradient; discrepancy = version(backward) - version(forward) (see pipesim.metrics).
    """
    import matplotlib.pyplot as plt

    metrics = compute_metrics(source) if isinstance(source, Trace) else source
    stages = metrics.stages
    if ax is None:
        _, ax = plt.subplots(figsize=(max(5.0, 0.45 * len(stages) + 3), 4))
    x = np.arange(len(stages))
    width = 0.8 / len(SERIES)
    for index, (label, attribute, color) in enumerate(SERIES):
        values = [getattr(stage, attribute) for stage in stages]
        ax.bar(x + (index - (len(SERIES) - 1) / 2) * width, values, width=width, color=color, label=label)
    means = [stage.forward_delay_mean for stage in stages]
    ax.plot(x + (1 - (len(SERIES) - 1) / 2) * width, means, "o", color="black", markersize=3.5,
            label="forward delay, mean", gid="forward_delay_mean")
    ax.set_xticks(x)
    ax.set_xticklabels([str(stage.stage) for stage in stages], fontsize=8 if len(stages) <= 32 else 5)
    ax.set_xlabel("stage")
    ax.set_ylabel("versions / updates")
    top = max([1.0, *(getattr(s, a) for s in stages for _, a, _ in SERIES)])
    ax.set_ylim(0, top * 1.25 + 0.5)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_title(f"{metrics.schedule}: weight staleness per stage (p={metrics.num_stages}, "
                 f"m={metrics.num_microbatches})", loc="left", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    # Matplotlib lists lines before bars; keep the order of the drawing: the bars, then the mean.
    order = [labels.index(label) for label, _, _ in SERIES] + [labels.index("forward delay, mean")]
    legend_beside(ax, [handles[i] for i in order], [labels[i] for i in order])
    return ax
