"""Study 5: bubble fraction against m for p in {4, 8, 16}: simulated points on the closed-form curves.

Setting: a uniform profile of 16 layers (1 ms forward, 2 ms backward per layer and microbatch),
one minibatch, GPipe and 1F1B (PipeDream-Flush), communication free. The closed form for both
is (p - 1) / (m + p - 1). A third series runs 1F1B with each stage boundary sending 4 MB over a
10 GB/s, 5 us link (0.405 ms a transfer against 1 ms of forward per layer) to show where the
closed form stops holding.
"""

from __future__ import annotations

import sys

import pandas as pd

import pipesim
from outputs import parse_args, write_figure, write_table

DEPTHS = (4, 8, 16)
MICROBATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
LAYERS = 16
ACTIVATION_BYTES = 4e6


def closed_form(p: int, m: int) -> float:
    """Bubble fraction of GPipe and 1F1B with uniform stages and free communication."""
    return (p - 1) / (m + p - 1)


def run(quick: bool) -> pd.DataFrame:
    """One row per (p, m, series): simulated and closed-form bubble fraction."""
    depths = (4,) if quick else DEPTHS
    counts = (1, 4) if quick else MICROBATCHES
    free = pipesim.uniform_profile(num_layers=LAYERS, forward_s=1e-3, backward_s=2e-3)
    talking = pipesim.uniform_profile(num_layers=LAYERS, forward_s=1e-3, backward_s=2e-3,
                                      activation_bytes=ACTIVATION_BYTES)
    rows = []
    for p in depths:
        link = pipesim.Topology.uniform(num_devices=p, bandwidth="10GB/s", latency="5us")
        series = (("gpipe", "gpipe", free, None), ("1f1b", "1f1b", free, None),
                  ("1f1b + 4 MB at 10 GB/s", "1f1b", talking, link))
        for m in counts:
            for label, schedule, profile, topology in series:
                result = pipesim.simulate(profile, topology, schedule=schedule, num_stages=p, num_microbatches=m,
                                          num_minibatches=1)
                simulated = result.metrics.bubble_fraction
                rows.append({
                    "p": p, "m": m, "series": label,
                    "simulated_bubble": simulated,
                    "closed_form_bubble": closed_form(p, m),
                    "simulated_minus_closed": simulated - closed_form(p, m),
                    "iteration_time_ms": result.metrics.iteration_time_s * 1e3,
                })
    return pd.DataFrame(rows)


def plot(frame: pd.DataFrame) -> object:
    """Closed-form curves with the simulated points on them."""
    import matplotlib.pyplot as plt
    import numpy as np

    from matplotlib.lines import Line2D

    figure, ax = plt.subplots(figsize=(7.5, 4.8))
    colors = {4: "#4C72B0", 8: "#DD8452", 16: "#55A868"}
    markers = {"gpipe": "o", "1f1b": "x", "1f1b + 4 MB at 10 GB/s": "^"}
    for p, group in frame.groupby("p"):
        grid = np.geomspace(1, max(group["m"]), 200)
        ax.plot(grid, (p - 1) / (grid + p - 1), color=colors[p], linewidth=1.2)
        for series, points in group.groupby("series", sort=False):
            style = ({"facecolors": "none", "edgecolors": colors[p]} if series == "gpipe"
                     else {"color": colors[p]})
            ax.scatter(points["m"], points["simulated_bubble"], marker=markers[series], s=30, linewidths=1.0,
                       **style)
    handles = [Line2D([], [], color=colors[p], label=f"(p-1)/(m+p-1), p={p}") for p in sorted(set(frame["p"]))]
    handles += [Line2D([], [], linestyle="none", marker=markers[series], color="black",
                       markerfacecolor="none" if series == "gpipe" else "black", label=f"simulated {series}")
                for series in markers]
    ax.set_xscale("log", base=2)
    ax.set_xlabel("microbatches per minibatch m")
    ax.set_ylabel("bubble fraction")
    ax.set_title("Bubble fraction: DES engine against the closed form (uniform stages)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(handles=handles, fontsize=7.5, loc="lower left")
    return figure


def main(argv: list[str] | None = None) -> pd.DataFrame:
    """Run the study and write its table and figure."""
    args = parse_args(__doc__ or "", argv)
    frame = run(args.quick)
    write_table(frame, args.out, "study5_bubble")
    write_figure(plot(frame), args.out, "study5_bubble")
    free = frame[frame["series"] != "1f1b + 4 MB at 10 GB/s"]
    print(f"study 5: {len(frame)} points; largest |simulated - closed form| without communication: "
          f"{free['simulated_minus_closed'].abs().max():.2e}")
    return frame


if __name__ == "__main__":
    main(sys.argv[1:])
