"""Plots of sweep tables: bubble fraction against m with the closed form, heatmaps and Pareto fronts."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipesim.errors import ConfigError
from pipesim.plots.style import byte_unit, legend_beside, schedule_color
from pipesim.sweep.analysis import closed_form_bubble, pareto_front, require_columns, successful, varying_inputs

LABELS = {
    "num_stages": "stages p", "num_microbatches": "microbatches m", "num_minibatches": "minibatches K",
    "m_per_stage": "microbatches per stage m/p",
    "throughput_samples_per_s": "throughput (samples/s)", "iteration_time_s": "iteration time (s)",
    "bubble_fraction": "bubble fraction", "peak_memory_bytes": "peak memory", "schedule": "schedule",
    "bandwidth_bytes_per_s": "bandwidth (B/s)", "latency_s": "latency (s)",
}


def distinct_columns(*named: tuple[str, str]) -> None:
    """Refuse one column given for two of a figure's axes (``("x", column), ("y", column)``):
    a table cannot be pivoted or fronted against itself.

    Raises:
        ConfigError: naming the later field, its column and the field it repeats.
    """
    seen: dict[str, str] = {}
    for field, column in named:
        if column in seen:
            raise ConfigError(field, column, f"must differ from {seen[column]}, which names the same column")
        seen[column] = field


def over_the_rest(frame: Any, how: str, *shown: str) -> str:
    """``" (max over bandwidth, recompute)"``: what a figure did with the inputs it does not show,
    or "" when every other input has one value."""
    others = varying_inputs(frame, *shown)
    return f" ({how} over {', '.join(label_of(column) for column in others)})" if others else ""


def cell_format(values: Any) -> str:
    """One format for every number in a figure's cells, fixed-point with as many decimals as the
    largest value needs for three significant digits (``1,590`` beside ``933``, not ``1.59e+03``)."""
    finite = np.abs(np.asarray(values, dtype=float))
    finite = finite[np.isfinite(finite) & (finite > 0)]
    if not finite.size:
        return ",.0f"
    largest = float(finite.max())
    if largest >= 1e7 or largest < 1e-4:
        return ".2e"
    return f",.{max(0, 2 - int(np.floor(np.log10(largest))))}f"


_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
# Axes computed from inputs: a grid over m/p covers m once p is its other axis.
_DERIVED = {"m_per_stage": ("num_microbatches",)}


def label_of(column: str) -> str:
    """A readable axis label for a table column."""
    return LABELS.get(column, column.replace("_", " "))


def default_stages(frame: Any) -> int:
    """The middle value of the table's num_stages (the p a single bubble plot shows by default)."""
    values = sorted(set(frame["num_stages"].tolist()))
    if not values:
        raise ConfigError("num_stages", None, "the table has no rows to plot")
    return int(values[len(values) // 2])


def bubble(frame: Any, *, num_stages: int | None = None, ax: Any = None) -> Any:
    """Bubble fraction against m at one p, a line per schedule, and the closed form (p-1)/(m+p-1).

    Rows that differ in other inputs (bandwidth, ...) are averaged per (schedule, m), and the
    title names those inputs; filter the table first (``--where``) to show one setting. Each schedule's line has the schedule as its label and gid
    ``bubble:<schedule>``; the closed form's gid is ``closed-form``.

    Raises:
        ConfigError: missing columns, or no row with ``num_stages``.
    """
    import matplotlib.pyplot as plt

    require_columns(frame, "schedule", "num_stages", "num_microbatches", "bubble_fraction")
    rows = successful(frame)
    p = default_stages(rows) if num_stages is None else num_stages
    rows = rows[rows["num_stages"] == p]
    if rows.empty:
        raise ConfigError("num_stages", p, "no successful row of the table has this many stages")
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.2))
    means = rows.groupby(["schedule", "num_microbatches"], sort=True)["bubble_fraction"].mean().reset_index()
    for index, schedule in enumerate(dict.fromkeys(rows["schedule"].tolist())):
        line = means[means["schedule"] == schedule]
        # Schedules often coincide (gpipe and 1f1b; the asynchronous ones at 0): open markers of
        # falling size keep each one visible on top of the others.
        ax.plot(line["num_microbatches"], line["bubble_fraction"], marker=_MARKERS[index % len(_MARKERS)],
                markersize=max(3.0, 8.0 - 1.2 * index), markerfacecolor="none", linestyle="-",
                color=schedule_color(schedule), linewidth=1.2, label=schedule, gid=f"bubble:{schedule}")
    low, high = int(rows["num_microbatches"].min()), int(rows["num_microbatches"].max())
    m = np.linspace(low, high, 200) if high > low else np.array([low, low + 1.0])
    ax.plot(m, closed_form_bubble(p, m), "--", color="black", linewidth=1.2, label="(p-1)/(m+p-1)",
            gid="closed-form")
    if high >= 16 * max(low, 1):
        ax.set_xscale("log", base=2)
    top = min(1.0, max(float(rows["bubble_fraction"].max()), float(closed_form_bubble(p, low))))
    ax.set_ylim(-0.03, top * 1.1 + 0.02)
    ax.set_xlabel("microbatches m")
    ax.set_ylabel("bubble fraction")
    ax.set_title(f"bubble fraction against m at p={p}"
                 f"{over_the_rest(rows, 'mean', 'schedule', 'num_stages', 'num_microbatches')}", loc="left", fontsize=10)
    legend_beside(ax)
    ax.grid(alpha=0.3)
    return ax


def heatmap(frame: Any, *, x: str = "num_microbatches", y: str = "num_stages", value: str = "throughput_samples_per_s",
            aggregate: str = "max", ax: Any = None) -> Any:
    """``value`` over a grid of ``x`` by ``y`` (``aggregate`` over rows that share a cell; empty
    cells blank) with a colorbar; cells carry their numbers, in one format, when there are at most
    150. The title names the inputs the aggregate ran over.

    Raises:
        ConfigError: one column for two of x, y and value, missing columns, an unknown aggregate,
            or no row to draw.
    """
    import matplotlib.pyplot as plt

    distinct_columns(("x", x), ("y", y), ("value", value))
    require_columns(frame, x, y, value)
    if aggregate not in ("max", "min", "mean", "median"):
        raise ConfigError("aggregate", aggregate, "must be one of max, min, mean, median")
    rows = successful(frame)
    if rows.empty:
        raise ConfigError("table", len(frame), "has no successful rows to plot")
    grid = rows.pivot_table(index=y, columns=x, values=value, aggfunc=aggregate).sort_index().sort_index(axis=1)
    if ax is None:
        _, ax = plt.subplots(figsize=(min(14.0, 3.5 + 0.5 * grid.shape[1]), min(10.0, 2.0 + 0.4 * grid.shape[0])))
    data = np.ma.masked_invalid(grid.to_numpy(dtype=float))
    image = ax.imshow(data, aspect="auto", origin="lower", cmap="viridis", interpolation="nearest")
    image.set_gid("heatmap")
    colorbar = ax.figure.colorbar(image, ax=ax)
    colorbar.set_label(f"{label_of(value)} ({aggregate})")
    for axis, labels, setter in ((grid.columns, "x", ax.set_xticks), (grid.index, "y", ax.set_yticks)):
        step = max(1, len(axis) // 24)
        positions = list(range(0, len(axis), step))
        setter(positions)
        getattr(ax, f"set_{labels}ticklabels")([_short(axis[i]) for i in positions], fontsize=7)
    if data.size <= 150:
        values = grid.to_numpy(dtype=float)
        middle, fmt = float(np.nanmean(values)), cell_format(values)
        for (row, column), cell in np.ndenumerate(values):
            if np.isfinite(cell):
                ax.text(column, row, format(cell, fmt), ha="center", va="center", fontsize=6,
                        color="black" if cell > middle else "white")
    ax.set_xlabel(label_of(x))
    ax.set_ylabel(label_of(y))
    title = (f"{label_of(value)} by {label_of(x)} and {label_of(y)}"
             f"{over_the_rest(rows, aggregate, x, y, *_DERIVED.get(x, ()), *_DERIVED.get(y, ()))}")
    ax.set_title(title, loc="left", fontsize=10, wrap=True)
    return ax


def _short(value: Any) -> str:
    if isinstance(value, float | np.floating):
        return f"{value:.3g}"
    return str(value)


def pareto(frame: Any, *, x: str = "peak_memory_bytes", y: str = "throughput_samples_per_s", hue: str = "schedule",
           ax: Any = None, budget: float | None = None, fits: str | None = None) -> Any:
    """Every row as a point (colored by ``hue``) and the Pareto front of low ``x``, high ``y`` as
    a black staircase with the front's points ringed.

    Points of each hue group are a collection with gid ``points:<value>``; the front line's gid
    is ``pareto``. Byte columns are shown in GB/MB/KB. ``budget`` (in ``x``'s unit, e.g. bytes)
    draws a dashed red vertical line (gid ``budget``); ``fits`` names a boolean column: rows where
    it is false are drawn as hollow rings (gid ``over:<value>``), those that fit as filled dots.

    Raises:
        ConfigError: one column for both x and y, missing columns, or no row to draw.
    """
    import matplotlib.pyplot as plt

    distinct_columns(("x", x), ("y", y))
    require_columns(frame, x, y, hue, *([fits] if fits else []))
    rows = successful(frame)
    if rows.empty:
        raise ConfigError("table", len(frame), "has no successful rows to plot")
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 4.8))
    divisor, x_label, unit = 1.0, label_of(x), ""
    if x.endswith("_bytes"):
        unit, divisor = byte_unit(max(float(rows[x].max()), budget or 0.0))
        x_label = f"{x_label} ({unit})"
    fitting = rows[fits].eq(True) if fits else None  # a missing value does not fit
    for group in dict.fromkeys(rows[hue].tolist()):
        in_group = rows[hue] == group
        part = rows[in_group & fitting] if fitting is not None else rows[in_group]
        color = schedule_color(str(group))
        ax.scatter(part[x] / divisor, part[y], s=10, alpha=0.55, color=color, label=str(group),
                   gid=f"points:{group}", linewidths=0)
        if fitting is not None:
            over = rows[in_group & ~fitting]
            ax.scatter(over[x] / divisor, over[y], s=12, facecolors="none", edgecolors=color, alpha=0.7,
                       linewidths=0.7, gid=f"over:{group}")
    front = pareto_front(rows, x=x, y=y)
    if front.empty:
        raise ConfigError("table", len(frame), f"has no successful row with a finite {x} and {y} to plot")
    # The staircase runs on to the largest x: nothing to its right does better.
    steps_x = np.r_[front[x].to_numpy(dtype=float), float(rows[x].max())] / divisor
    steps_y = np.r_[front[y].to_numpy(dtype=float), float(front[y].iloc[-1])]
    ax.step(steps_x, steps_y, where="post", color="black", linewidth=1.2, label="Pareto front", gid="pareto")
    ax.scatter(front[x] / divisor, front[y], s=28, facecolors="none", edgecolors="black", linewidths=0.9,
               label="black ring: on the front", gid="front")
    if fitting is not None:
        ax.scatter([], [], s=12, facecolors="none", edgecolors="grey", linewidths=0.7,
                   label="hollow dot: over budget")
    if budget is not None:
        ax.axvline(budget / divisor, color="#C44E52", linestyle="--", linewidth=1.2,
                   label=f"memory budget {budget / divisor:.4g} {unit}".rstrip(), gid="budget")
    spread = float(rows[x].max()) / max(float(rows[x][rows[x] > 0].min()) if (rows[x] > 0).any() else 1.0, 1e-300)
    if spread > 100:
        ax.set_xscale("log")
    ax.set_xlabel(x_label)
    ax.set_ylabel(label_of(y))
    counted = f", {int(fitting.sum())} fit" if fitting is not None else ""
    ax.set_title(f"{label_of(y)} against {label_of(x)}: {len(front)} of {len(rows)} points on the front{counted}",
                 loc="left", fontsize=10)
    legend_beside(ax, markerscale=1.6)
    ax.grid(alpha=0.3)
    return ax
