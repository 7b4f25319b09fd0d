"""The figures of an HTML report, rendered to bytes: for one simulation, schedules compared, a search,
or a sweep table."""

from __future__ import annotations

from typing import Any

from pipesim.engine.trace import Trace
from pipesim.metrics import Metrics
from pipesim.plots.compare import stacked_timelines
from pipesim.plots.files import figure_bytes, use_headless_backend
from pipesim.plots.memory import memory, memory_breakdown, peak_stage
from pipesim.plots.staleness import staleness
from pipesim.plots.sweeps import bubble, heatmap, pareto
from pipesim.plots.timeline import timeline
from pipesim.sweep.analysis import usable

Figure = tuple[str, bytes, str]
MAX_HEATMAPS = 6


def is_stale(metrics: Metrics) -> bool:
    """Whether some stage holds more than one weight version or runs a forward or backward on
    stale weights (a staleness chart of a flush schedule is all 0 and 1: nothing to see)."""
    return any(stage.weight_versions_max > 1 or stage.forward_delay_steps or stage.discrepancy_max
               for stage in metrics.stages)


def simulation_figures(trace: Trace, metrics: Metrics, *, fmt: str = "png") -> list[Figure]:
    """Timeline, memory over time (every stage up to 4, else the highest and the last), peak
    memory by kind per stage, and staleness per stage where there is any (``is_stale``)."""
    use_headless_backend()
    p = metrics.num_stages
    stages = list(range(p)) if p <= 4 else sorted({peak_stage(trace), p - 1})
    figures = [("Timeline: compute and sends per device; grey is idle (the bubbles)", figure_bytes(timeline(trace), fmt),
                fmt)]
    for stage in stages:
        figures.append((f"Memory of stage {stage} over time, stacked by kind", figure_bytes(memory(trace, stage=stage), fmt),
                        fmt))
    figures.append(("Peak memory per stage, by kind", figure_bytes(memory_breakdown(metrics), fmt), fmt))
    if is_stale(metrics):
        figures.append(("Weight versions, forward delay and discrepancy per stage",
                        figure_bytes(staleness(metrics), fmt), fmt))
    return figures


def comparison_figures(traces: list[Trace], *, fmt: str = "png") -> list[Figure]:
    """Every schedule's timeline on one time axis, top to bottom in the comparison's order."""
    use_headless_backend()
    return [("Timelines of the schedules on one time axis; grey is idle (the bubbles)",
             figure_bytes(stacked_timelines(traces), fmt), fmt)]


def search_figures(frame: Any, *, budget: float | None, fmt: str = "png") -> list[Figure]:
    """Tokens/s against peak memory of a search's simulated candidates, the Pareto front, those
    over the budget as rings and the budget as a line when known; none when nothing was simulated."""
    use_headless_backend()
    simulated = frame[frame["status"] == "simulated"]
    if simulated.empty:
        return []
    ax = pareto(simulated, x="peak_memory_bytes", y="tokens_per_s", hue="schedule", budget=budget, fits="fits")
    return [("Tokens/s against peak memory per GPU; the Pareto front in black, rings over the budget",
             figure_bytes(ax, fmt), fmt)]


# What the figures of a sweep's report draw: a row without a finite value in one of them is left out.
SWEEP_FIGURE_NUMBERS = ("bubble_fraction", "throughput_samples_per_s", "peak_memory_bytes")


def sweep_figures(frame: Any, *, fmt: str = "png") -> list[Figure]:
    """Bubble against m at up to three values of p, a throughput heatmap (m by p) per schedule,
    and the throughput-memory Pareto front, from the successful rows whose ``SWEEP_FIGURE_NUMBERS``
    are finite and whose schedule is given; none when there is no such row."""
    use_headless_backend()
    rows = usable(frame, *SWEEP_FIGURE_NUMBERS)
    rows = rows[rows["schedule"].notna()]
    if rows.empty:
        return []
    figures: list[Figure] = []
    stages = sorted(set(rows["num_stages"].tolist()))
    picks = sorted({stages[0], stages[len(stages) // 2], stages[-1]})
    for p in picks:
        figures.append((f"Bubble fraction against m at p={p} (mean over the other inputs), with the closed form",
                        figure_bytes(bubble(rows, num_stages=p), fmt), fmt))
    # m often scales with p (m = p, 2p, ...): a grid over m/p is then dense where one over m is sparse.
    rows = rows.assign(m_per_stage=rows["num_microbatches"] / rows["num_stages"])
    dense = rows["num_microbatches"].nunique() > 24 and rows["m_per_stage"].nunique() <= 24
    x, across = ("m_per_stage", "m/p") if dense else ("num_microbatches", "m")
    for schedule in list(dict.fromkeys(rows["schedule"].tolist()))[:MAX_HEATMAPS]:
        ax = heatmap(rows[rows["schedule"] == schedule], x=x)
        ax.set_title(f"{schedule}: {ax.get_title(loc='left')}", loc="left", fontsize=10, wrap=True)
        figures.append((f"{schedule}: throughput by {across} and stages (best over the other inputs)",
                        figure_bytes(ax, fmt), fmt))
    figures.append(("Throughput against peak memory; the Pareto front in black",
                    figure_bytes(pareto(rows), fmt), fmt))
    return figures
