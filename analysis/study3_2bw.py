"""Study 3: PipeDream-2BW's memory and throughput against GPipe and PipeDream-Flush, depth 4 to 16.

Setting: the GPT-like synthetic transformer of analysis/gpt_profile.py (32 layers, hidden 2048,
16 heads, one 1,024-token sequence per microbatch, fp16, mixed-precision Adam) on V100s, 8 a
server (NVLink), servers at 25 Gbit/s; one pipeline (width 1) of depth p in {4, 8, 16}, m = 16
microbatches per minibatch at every depth (2BW needs m >= p), K = 4 minibatches, activation
recomputation off and on. PipeDream (weight stashing) is added for the memory comparison the
2BW paper draws, and "no pipelining" is the same p devices running one minibatch of 16 sequences
at a time (GPipe with m = 1, b = 16): model parallelism without pipelining.
"""

from __future__ import annotations

import sys

import pandas as pd

import pipesim
from gpt_profile import (OPTIMIZER_MULTIPLIER, V100_MEMORY_BYTES, TransformerSizes, even_partition, gpt_profile,
                         v100_cluster)
from outputs import GB, activations_gb, busy_fraction, parse_args, reference_values, write_figure, write_table

DEPTHS = (4, 8, 16)
MICROBATCHES = 16
SCHEDULES = ("gpipe", "1f1b", "2bw", "pipedream")
NO_PIPELINING = "no-pipelining"


def run(quick: bool) -> pd.DataFrame:
    """One row per (depth, schedule, recompute)."""
    depths = (2,) if quick else DEPTHS
    m = 2 if quick else MICROBATCHES
    sizes = TransformerSizes(layers=4) if quick else TransformerSizes()
    profile = gpt_profile(sizes)
    whole_batch = gpt_profile(TransformerSizes(layers=sizes.layers, microbatch=sizes.microbatch * m))
    rows = []
    for p in depths:
        topology = v100_cluster(p)
        for recompute in (False, True):
            runs = [(schedule, profile, m, 4) for schedule in SCHEDULES] + [(NO_PIPELINING, whole_batch, 1, 3)]
            for label, model, count, minibatches in runs:
                result = pipesim.simulate(
                    model, topology, schedule="gpipe" if label == NO_PIPELINING else label, num_stages=p,
                    num_microbatches=count, num_minibatches=minibatches, recompute=recompute,
                    partition=even_partition(sizes.layers, p),
                    optimizer_state_multiplier=OPTIMIZER_MULTIPLIER,
                )
                metrics = result.metrics
                peak = max(metrics.stages, key=lambda stage: stage.peak_memory_bytes)
                rows.append({
                    "p": p,
                    "schedule": label,
                    "recompute": recompute,
                    "throughput_samples_per_s": metrics.throughput_samples_per_s,
                    "utilization": busy_fraction(result),
                    "peak_memory_gb": metrics.peak_memory_bytes / GB,
                    "peak_stage": peak.stage,
                    "weights_gb": peak.peak_breakdown_bytes["weights"] / GB,
                    "activations_gb": activations_gb(peak.peak_breakdown_bytes),
                    "weight_versions_max": max(stage.weight_versions_max for stage in metrics.stages),
                    "fits_16gb": metrics.peak_memory_bytes <= V100_MEMORY_BYTES,
                })
    frame = pd.DataFrame(rows)
    keys = ["p", "recompute"]
    frame["throughput_2bw_over_this"] = (reference_values(frame, keys, "2bw", "throughput_samples_per_s")
                                         / frame["throughput_samples_per_s"])
    frame["memory_this_over_2bw"] = frame["peak_memory_gb"] / reference_values(frame, keys, "2bw", "peak_memory_gb")
    return frame


def plot(frame: pd.DataFrame) -> object:
    """Throughput and peak memory against depth, recompute off (solid) and on (dashed)."""
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    colors = {"gpipe": "#4C72B0", "1f1b": "#DD8452", "2bw": "#C44E52", "pipedream": "#55A868",
              NO_PIPELINING: "#8C8C8C"}
    markers = {"gpipe": "o", "1f1b": "s", "2bw": "D", "pipedream": "x", NO_PIPELINING: "^"}
    for (schedule, recompute), rows in frame.groupby(["schedule", "recompute"], sort=False):
        style = {"color": colors[schedule], "marker": markers[schedule], "markerfacecolor": "none",
                 "linestyle": "--" if recompute else "-",
                 "label": f"{schedule}{' + recompute' if recompute else ''}"}
        left.plot(rows["p"], rows["throughput_samples_per_s"], **style)
        right.plot(rows["p"], rows["peak_memory_gb"], **style)
    right.axhline(V100_MEMORY_BYTES / GB, color="black", linewidth=0.8, linestyle=":", label="V100 16 GB")
    for ax, label in ((left, "throughput (sequences/s)"), (right, "peak memory of the fullest stage (GB)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(set(frame["p"])), [str(p) for p in sorted(set(frame["p"]))])
        ax.set_xlabel("pipeline depth p (devices)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    right.set_yscale("log")
    left.set_title("GPT-like 1.6B, m = 16: throughput", fontsize=10)
    right.set_title("peak memory per device", fontsize=10)
    right.legend(fontsize=7, ncols=2)
    return figure


def main(argv: list[str] | None = None) -> pd.DataFrame:
    """Run the study and write its table and figure."""
    args = parse_args(__doc__ or "", argv)
    frame = run(args.quick)
    write_table(frame, args.out, "study3_2bw")
    write_figure(plot(frame), args.out, "study3_2bw")
    plain = frame[~frame["recompute"]]
    for schedule in ("gpipe", "1f1b", "pipedream", NO_PIPELINING):
        ratios = plain[plain["schedule"] == schedule]["throughput_2bw_over_this"]
        print(f"study 3: 2bw / {schedule:13s} throughput {ratios.min():.2f}x .. {ratios.max():.2f}x over depths")
    return frame


if __name__ == "__main__":
    main(sys.argv[1:])
