"""Study 1: GPipe, 1F1B, PipeDream, PipeDream-2BW and PipeMare on one model and cluster.

Setting: the GPT-like synthetic transformer of analysis/gpt_profile.py (32 layers, hidden 2048,
one 1,024-token sequence per microbatch, fp16, mixed-precision Adam), cut into p = 4 stages of
8 layers on 4 V100s of one p3.16xlarge-like server, m = 8 microbatches per minibatch, K = 4
minibatches. Iteration time and throughput are over the steady-state window (the first and
last minibatch excluded); memory, versions and staleness are over the whole run.
"""

from __future__ import annotations

import sys

import pandas as pd

import pipesim
import pipesim.plots
from gpt_profile import OPTIMIZER_MULTIPLIER, V100_MEMORY_BYTES, even_partition, gpt_profile, v100_cluster
from outputs import GB, activations_gb, parse_args, write_figure, write_table

SCHEDULES = ("gpipe", "1f1b", "pipedream", "2bw", "pipemare")
LABELS = {"gpipe": "GPipe", "1f1b": "1F1B (PipeDream-Flush)", "pipedream": "PipeDream (stashing)",
          "2bw": "PipeDream-2BW", "pipemare": "PipeMare"}


def simulate_all(quick: bool) -> dict[str, pipesim.Result]:
    """One Result per schedule."""
    profile = gpt_profile()
    p, m, k = (2, 2, 3) if quick else (4, 8, 4)
    topology = v100_cluster(p)
    return {
        schedule: pipesim.simulate(profile, topology, schedule=schedule, num_stages=p, num_microbatches=m,
                                   num_minibatches=k, partition=even_partition(profile.num_layers, p),
                                   optimizer_state_multiplier=OPTIMIZER_MULTIPLIER)
        for schedule in SCHEDULES
    }


def table(results: dict[str, pipesim.Result]) -> pd.DataFrame:
    """One row per (schedule, stage)."""
    rows = []
    for schedule, result in results.items():
        metrics = result.metrics
        for stage in metrics.stages:
            breakdown = stage.peak_breakdown_bytes
            rows.append({
                "schedule": schedule,
                "stage": stage.stage,
                "throughput_samples_per_s": metrics.throughput_samples_per_s,
                "iteration_time_s": metrics.iteration_time_s,
                "bubble_fraction": max(0.0, metrics.bubble_fraction),
                "stage_bubble_fraction": max(0.0, stage.bubble_fraction),
                "peak_memory_gb": stage.peak_memory_bytes / GB,
                "weights_gb": breakdown["weights"] / GB,
                "gradients_gb": breakdown["gradients"] / GB,
                "optimizer_gb": breakdown["optimizer"] / GB,
                "activations_gb": activations_gb(breakdown),
                "fits_16gb": stage.peak_memory_bytes <= V100_MEMORY_BYTES,
                "weight_versions_max": stage.weight_versions_max,
                "inflight_microbatches_max": stage.max_inflight_microbatches,
                "forward_delay_max": stage.forward_delay_steps,
                "forward_delay_mean": stage.forward_delay_mean,
                "discrepancy_max": stage.discrepancy_max,
            })
    return pd.DataFrame(rows)


def plot(results: dict[str, pipesim.Result], frame: pd.DataFrame) -> object:
    """Timelines of the five schedules over three panels: throughput, peak memory, staleness."""
    import matplotlib.pyplot as plt
    import numpy as np

    figure = plt.figure(figsize=(14, 17))
    grid = figure.add_gridspec(len(results) + 1, 4, height_ratios=[1.0] * len(results) + [1.5])
    span = max(result.metrics.makespan_s for result in results.values())
    for row, (schedule, result) in enumerate(results.items()):
        ax = figure.add_subplot(grid[row, :])
        pipesim.plots.timeline(result.trace, ax=ax, time_unit="s")
        ax.set_xlim(0, span * 1.01)
        title = ax.get_title()
        ax.set_title("")
        ax.set_title(f"{LABELS[schedule]}: {title}", fontsize=10, loc="left")
        legend = ax.get_legend()
        if row == 0:
            legend.set_bbox_to_anchor((1.0, 1.0))
            legend.set_loc("lower right")
        else:
            legend.remove()
    names = list(results)
    stages = sorted(set(frame["stage"]))
    width = 0.8 / len(names)
    x = np.arange(len(names))
    ax = figure.add_subplot(grid[-1, 0])
    bars = ax.bar(x, [results[s].metrics.throughput_samples_per_s for s in names], color="#4C72B0")
    for bar, schedule in zip(bars, names, strict=True):
        bubble = max(0.0, results[schedule].metrics.bubble_fraction)
        ax.annotate(f"bubble\n{bubble:.0%}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, names, fontsize=7)
    ax.set_ylabel("throughput (sequences/s)")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.15)
    ax.set_title("steady-state throughput", fontsize=10)
    panels = (("peak_memory_gb", "peak memory (GB)", "peak memory per stage"),
              ("weight_versions_max", "versions", "weight versions held"),
              ("forward_delay_max", "updates", "max forward delay"))
    for column, (field, unit, title) in enumerate(panels, start=1):
        ax = figure.add_subplot(grid[-1, column])
        for index, schedule in enumerate(names):
            rows = frame[frame["schedule"] == schedule]
            ax.bar(np.array(stages) + (index - (len(names) - 1) / 2) * width, rows[field], width, label=schedule)
        if field == "peak_memory_gb":
            ax.axhline(V100_MEMORY_BYTES / GB, color="black", linestyle="--", linewidth=0.8, label="16 GB")
        ax.set_xticks(stages, [f"stage {s}" for s in stages], fontsize=7)
        ax.set_ylabel(unit)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=6.5)
    return figure


def main(argv: list[str] | None = None) -> pd.DataFrame:
    """Run the study and write its table and figure."""
    args = parse_args(__doc__ or "", argv)
    results = simulate_all(args.quick)
    frame = table(results)
    write_table(frame, args.out, "study1_schedules")
    write_figure(plot(results, frame), args.out, "study1_schedules")
    for schedule, result in results.items():
        metrics = result.metrics
        print(f"study 1: {schedule:9s} {metrics.throughput_samples_per_s:7.2f} seq/s, bubble "
              f"{max(0.0, metrics.bubble_fraction):.3f}, peak {metrics.peak_memory_bytes / GB:6.2f} GB")
    return frame


if __name__ == "__main__":
    main(sys.argv[1:])
