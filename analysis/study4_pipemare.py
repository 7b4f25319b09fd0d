"""Study 4: PipeMare's pipeline utilization and memory against GPipe and PipeDream as stages grow.

Setting (fine-grained pipelining, one device per stage, communication free as on the dataflow
accelerators PipeMare targets): two models, ResNet-50 (PipeDream's measured profile, 177 layers,
128 images a microbatch, fp32, SGD with momentum: optimizer state 1 x weights) at p in
{4, 8, 16, 32, 64}, and the GPT-like transformer of analysis/gpt_profile.py (32 layers, Adam:
6 x weights) at p in {4, 8, 16, 32} (32 = one layer a stage), without and with activation
recomputation (which leaves weights, not activations, as the bulk of memory). m = 16 microbatches per
minibatch throughout. GPipe flushes every minibatch; PipeDream and PipeMare stream K = max(4,
ceil(3p/m)) minibatches so that the pipeline reaches its steady state (PipeDream's stage 0 then
holds its full p weight versions). Utilization is compute work per minibatch over
p x iteration time; memory is the peak of the fullest stage and the sum of all stages' peaks.
"""

from __future__ import annotations

import math
import sys

import pandas as pd

import pipesim
from gpt_profile import OPTIMIZER_MULTIPLIER, TransformerSizes, even_partition, gpt_profile
from outputs import GB, TRACES, activations_gb, busy_fraction, parse_args, reference_values, write_figure, write_table

MICROBATCHES = 16
SCHEDULES = ("gpipe", "pipedream", "pipemare")


def settings(quick: bool) -> list[tuple[str, pipesim.Profile, tuple[int, ...], float, bool, bool]]:
    """(model, profile, depths, optimizer multiplier, identical layers, recompute) for each model."""
    if quick:
        return [("gpt-like", gpt_profile(TransformerSizes(layers=4)), (2, 4), OPTIMIZER_MULTIPLIER, True, False)]
    gpt = gpt_profile()
    return [
        ("resnet50", pipesim.load_profile(TRACES / "resnet50.json"), (4, 8, 16, 32, 64), 1.0, False, False),
        ("gpt-like", gpt, (4, 8, 16, 32), OPTIMIZER_MULTIPLIER, True, False),
        ("gpt-like+recompute", gpt, (4, 8, 16, 32), OPTIMIZER_MULTIPLIER, True, True),
    ]


def run(quick: bool) -> pd.DataFrame:
    """One row per (model, depth, schedule)."""
    m = 2 if quick else MICROBATCHES
    rows = []
    for model, profile, depths, multiplier, identical, recompute in settings(quick):
        for p in depths:
            partition = even_partition(profile.num_layers, p) if identical else None
            for schedule in SCHEDULES:
                minibatches = 4 if schedule == "gpipe" else max(4, math.ceil(3 * p / m))
                result = pipesim.simulate(profile, None, schedule=schedule, num_stages=p, num_microbatches=m,
                                          num_minibatches=minibatches, partition=partition, recompute=recompute,
                                          optimizer_state_multiplier=multiplier)
                stages = result.metrics.stages
                fullest = max(stages, key=lambda stage: stage.peak_memory_bytes)
                rows.append({
                    "model": model, "p": p, "m": m, "schedule": schedule, "minibatches": minibatches,
                    "utilization": busy_fraction(result),
                    "throughput_samples_per_s": result.metrics.throughput_samples_per_s,
                    "peak_memory_gb": fullest.peak_memory_bytes / GB,
                    "peak_weights_gb": fullest.peak_breakdown_bytes["weights"] / GB,
                    "peak_activations_gb": activations_gb(fullest.peak_breakdown_bytes),
                    "total_memory_gb": sum(stage.peak_memory_bytes for stage in stages) / GB,
                    "stage0_versions": stages[0].weight_versions_max,
                    "stage0_inflight": stages[0].max_inflight_microbatches,
                    "stage0_delay_max": stages[0].forward_delay_steps,
                })
    frame = pd.DataFrame(rows)
    keys = ["model", "p"]
    frame["pipemare_utilization_over_this"] = (reference_values(frame, keys, "pipemare", "utilization")
                                               / frame["utilization"])
    frame["peak_memory_this_over_pipemare"] = (frame["peak_memory_gb"]
                                               / reference_values(frame, keys, "pipemare", "peak_memory_gb"))
    frame["total_memory_this_over_pipemare"] = (frame["total_memory_gb"]
                                                / reference_values(frame, keys, "pipemare", "total_memory_gb"))
    return frame


def plot(frame: pd.DataFrame) -> object:
    """Per model: utilization against p, and total memory against p."""
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(frame["model"]))
    figure, axes = plt.subplots(len(models), 2, figsize=(12, 4.2 * len(models)), squeeze=False)
    colors = {"gpipe": "#4C72B0", "pipedream": "#55A868", "pipemare": "#8172B3"}
    markers = {"gpipe": "o", "pipedream": "s", "pipemare": "x"}
    for row, model in enumerate(models):
        rows = frame[frame["model"] == model]
        utilization, memory = axes[row]
        for schedule, group in rows.groupby("schedule", sort=False):
            utilization.plot(group["p"], group["utilization"], marker=markers[schedule], markerfacecolor="none",
                             color=colors[schedule], label=schedule)
            memory.plot(group["p"], group["total_memory_gb"], marker="o", color=colors[schedule],
                        label=f"{schedule}: sum over stages")
            memory.plot(group["p"], group["peak_memory_gb"], marker="x", linestyle=":", color=colors[schedule],
                        label=f"{schedule}: fullest stage")
        depths = sorted(set(rows["p"]))
        for ax in (utilization, memory):
            ax.set_xscale("log", base=2)
            ax.set_xticks(depths, [str(p) for p in depths])
            ax.set_xlabel("stages p (one device each)")
            ax.grid(True, alpha=0.3)
        utilization.set_ylim(0, 1.05)
        utilization.set_ylabel("pipeline utilization")
        utilization.set_title(f"{model}, m = {int(rows['m'].iloc[0])}: utilization", fontsize=10)
        utilization.legend(fontsize=8)
        memory.set_yscale("log")
        memory.set_ylabel("memory (GB)")
        memory.set_title(f"{model}: memory", fontsize=10)
        memory.legend(fontsize=7, ncols=2)
    return figure


def main(argv: list[str] | None = None) -> pd.DataFrame:
    """Run the study and write its table and figure."""
    args = parse_args(__doc__ or "", argv)
    frame = run(args.quick)
    write_table(frame, args.out, "study4_pipemare")
    write_figure(plot(frame), args.out, "study4_pipemare")
    for model, rows in frame.groupby("model", sort=False):
        gpipe = rows[rows["schedule"] == "gpipe"]["pipemare_utilization_over_this"]
        stash = rows[rows["schedule"] == "pipedream"]["total_memory_this_over_pipemare"]
        print(f"study 4: {model}: pipemare/gpipe utilization up to {gpipe.max():.2f}x; "
              f"pipedream/pipemare total memory up to {stash.max():.2f}x")
    return frame


if __name__ == "__main__":
    main(sys.argv[1:])
