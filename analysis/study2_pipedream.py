"""Study 2: PipeDream (SOSP 2019): hybrid configurations and their speed-up over data parallelism.

Setting: PipeDream's measured profiles (traces/vgg16.json, alexnet.json, resnet50.json) on 16
V100s, as the paper's Cluster-A (4 servers of 4, PCIe inside a server, 12 GB/s assumed, 10 Gbit/s
Ethernet between) and Cluster-B (2 servers of 8, NVLink, 50 GB/s assumed, 25 Gbit/s between);
5 us latency (assumed). Per-GPU batch = the profile's microbatch (128 images for VGG-16 and
ResNet-50, 256 for AlexNet).

How a configuration is simulated: as the planner checks its own candidates (pipesim.plan.check).
A configuration "r0-r1-..." cuts the layers into stages on consecutive GPUs ending at the last;
a stage of r replicas runs as one pipeline stage r times as fast (microbatches dealt round-robin,
PipeDream's own approximation), whose update carries a ring all-reduce over its own GPUs, at the
slowest link its ring crosses; the schedule is pipedream (1F1B, weight stashing, an update per
microbatch, so each carries 1/r of the all-reduce); links between stages are those between their
first GPUs. Data parallelism ("16") is one stage on 16 replicas.

Candidates: the planner's own (`pipesim plan`: its analytic optimum, every uniform width, the
best 2-stage cut of each split, data parallelism), the paper's configuration (15-1 at the cut
PipeDream's released runtime shipped: the fully connected layers on the 16th GPU; "16" = data
parallelism) and PipeDream's released optimizer's choice on the same cluster (`--cost-model
pipedream`). The table states, per model and cluster, the planner's choice, the best simulated
candidate and the paper's configuration.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any

import pandas as pd

import pipesim
from pipesim.plan.check import Simulated, check_stages, plan_and_check
from outputs import TRACES, parse_args, write_figure, write_table

GBIT = 1e9 / 8
LATENCY_S = 5e-6


@dataclass(frozen=True)
class Setting:
    """A model on a cluster, with what the paper reports for it (Table 3 of the SOSP'19 paper)."""

    model: str
    cluster: str
    servers: int
    per_server: int
    intra_bytes_per_s: float
    inter_bytes_per_s: float
    paper_config: str
    paper_speedup: float

    @property
    def num_devices(self) -> int:
        """GPUs in the cluster."""
        return self.servers * self.per_server


SETTINGS = (
    Setting("vgg16", "A (4x4, 10 Gbit/s)", 4, 4, 12e9, 10 * GBIT, "15-1", 5.28),
    Setting("vgg16", "B (2x8, 25 Gbit/s)", 2, 8, 50e9, 25 * GBIT, "15-1", 2.98),
    Setting("alexnet", "A (4x4, 10 Gbit/s)", 4, 4, 12e9, 10 * GBIT, "15-1", 4.92),
    Setting("alexnet", "B (2x8, 25 Gbit/s)", 2, 8, 50e9, 25 * GBIT, "15-1", 2.04),
    Setting("resnet50", "A (4x4, 10 Gbit/s)", 4, 4, 12e9, 10 * GBIT, "16", 1.0),
    Setting("resnet50", "B (2x8, 25 Gbit/s)", 2, 8, 50e9, 25 * GBIT, "16", 1.0),
)
EFFECTIVE_GBIT = (10.0, 5.0, 2.5, 1.25)
DATA_PARALLEL, PAPER_CUT, RELEASED = "16 (data parallel)", "15-1, paper's cut", "PipeDream's optimizer"


def compute_per_layer(profile: pipesim.Profile) -> list[float]:
    """Forward + backward seconds of each layer for one microbatch."""
    return [layer.forward_s + layer.backward_s for layer in profile.layers]


def paper_cut(profile: pipesim.Profile) -> int:
    """Where the released PipeDream code starts its last stage: the first fully connected layer."""
    return next(index for index, layer in enumerate(profile.layers) if "Linear" in layer.name)


def cluster(setting: Setting, inter_bytes_per_s: float) -> pipesim.Topology:
    """The setting's servers: one bandwidth inside a server, another between, 5 us latency."""
    return pipesim.Topology.hierarchical(num_devices=setting.num_devices, devices_per_server=setting.per_server,
                                         intra_bandwidth=setting.intra_bytes_per_s, inter_bandwidth=inter_bytes_per_s,
                                         latency=LATENCY_S)


def paper_stages(profile: pipesim.Profile, setting: Setting) -> tuple[tuple[int, int, int], ...]:
    """The paper's configuration as ``(start, end, replicas)`` stages."""
    n, layers = setting.num_devices, profile.num_layers
    if setting.paper_config == "16":
        return ((0, layers, n),)
    cut = paper_cut(profile)
    return ((0, cut, n - 1), (cut, layers, 1))


def simulated_configs(profile: pipesim.Profile, setting: Setting, inter_bytes_per_s: float,
                      quick: bool = False) -> tuple[list[tuple[str, Simulated]], Simulated]:
    """Every candidate of the study, by label, and the planner's choice among its own."""
    topology = cluster(setting, inter_bytes_per_s)
    planned = plan_and_check(profile, topology)
    configs = [(DATA_PARALLEL if c.label == "data parallelism" else f"planner: {c.label}", c)
               for c in planned.candidates if not quick or c is planned.chosen or c.label == "data parallelism"]
    stages = paper_stages(profile, setting)
    if setting.paper_config != "16":
        configs.append((PAPER_CUT, check_stages(profile, topology, stages, label=PAPER_CUT)))
    if not quick:
        released = plan_and_check(profile, topology, cost_model="pipedream").chosen
        configs.append((RELEASED, check_stages(profile, topology, _stages(released), label=RELEASED)))
    return configs, planned.chosen


def _stages(candidate: Simulated) -> tuple[tuple[int, int, int], ...]:
    replicas = candidate.plan.replicas or (1,) * candidate.plan.num_stages
    return tuple((int(a), int(b), int(r)) for (a, b), r in zip(candidate.result.plan.partition, replicas, strict=True))


def data_parallel_formula(profile: pipesim.Profile, setting: Setting, inter_bytes_per_s: float) -> float:
    """Samples per second of data parallelism: n x batch / (compute + ring all-reduce)."""
    n = setting.num_devices
    weights = sum(layer.param_bytes for layer in profile.layers)
    step = sum(compute_per_layer(profile)) + 2 * (n - 1) / n * weights / inter_bytes_per_s
    return n * profile.microbatch_size / step


def run(quick: bool) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The configuration table and the bandwidth-sensitivity table."""
    settings = SETTINGS[:1] if quick else SETTINGS
    rows = []
    for setting in settings:
        profile = pipesim.load_profile(TRACES / f"{setting.model}.json")
        configs, chosen = simulated_configs(profile, setting, setting.inter_bytes_per_s, quick)
        dp_sim = dict(configs)[DATA_PARALLEL].result.metrics.throughput_samples_per_s
        paper_replicas = [r for _, _, r in paper_stages(profile, setting)]
        for label, config in configs:
            simulated = config.result.metrics.throughput_samples_per_s
            replicas = list(config.plan.replicas or [1] * config.plan.num_stages)
            rows.append({
                "model": setting.model, "cluster": setting.cluster, "config": label,
                "replicas": "-".join(str(r) for r in replicas),
                "partition": " ".join(f"{a}:{b}" for a, b in config.result.plan.partition),
                "predicted_samples_per_s": config.estimate.throughput_samples_per_s,
                "throughput_samples_per_s": simulated,
                "speedup_over_dp": simulated / dp_sim,
                "dp_formula_samples_per_s": data_parallel_formula(profile, setting, setting.inter_bytes_per_s),
                "paper_config": setting.paper_config,
                "is_paper_config": label == PAPER_CUT or (setting.paper_config == "16" and label == DATA_PARALLEL
                                                          and replicas == paper_replicas),
                "paper_speedup": setting.paper_speedup,
                "is_planner_choice": config is chosen,
            })
    frame = pd.DataFrame(rows)
    best = frame.groupby(["model", "cluster"], sort=False)["throughput_samples_per_s"].transform("max")
    frame["is_best"] = frame["throughput_samples_per_s"] == best
    frame["simulated_over_paper"] = (frame["speedup_over_dp"] / frame["paper_speedup"]).where(frame["is_paper_config"])
    frame["implied_dp_gbit_per_s"] = [implied_dp_bandwidth(row) for row in frame.itertuples(index=False)]
    return frame, sensitivity(quick)


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per model and cluster: the planner's choice, the best simulated candidate and the paper's configuration."""
    rows = []
    for (model, cluster_name), group in frame.groupby(["model", "cluster"], sort=False):
        chosen = group[group["is_planner_choice"]].iloc[0]
        best = group[group["is_best"]].iloc[0]
        paper = group[group["is_paper_config"]].iloc[0]
        released = group[group["config"] == RELEASED]
        rows.append({
            "model": model, "cluster": cluster_name,
            "planner_choice": f"{chosen['replicas']} ({chosen['partition']})",
            "planner_speedup_over_dp": chosen["speedup_over_dp"],
            "best_simulated": f"{best['config']}: {best['replicas']} ({best['partition']})",
            "best_speedup_over_dp": best["speedup_over_dp"],
            "paper_config": f"{paper['replicas']} ({paper['partition']})",
            "paper_simulated_speedup_over_dp": paper["speedup_over_dp"],
            "paper_reported_speedup": paper["paper_speedup"],
            "released_optimizer_choice": released["replicas"].iloc[0] if len(released) else "",
            "released_simulated_speedup_over_dp": released["speedup_over_dp"].iloc[0] if len(released) else math.nan,
        })
    return pd.DataFrame(rows)


def implied_dp_bandwidth(row: Any) -> float:
    """For the paper's configuration: the all-reduce bandwidth (Gbit/s) at which data parallelism is
    as slow as the reported speed-up says, given the simulated throughput of the configuration."""
    if not row.is_paper_config or row.paper_speedup <= 1.0:
        return float("nan")
    profile = pipesim.load_profile(TRACES / f"{row.model}.json")
    n = sum(int(r) for r in row.replicas.split("-"))
    step_s = n * profile.microbatch_size / (row.throughput_samples_per_s / row.paper_speedup)
    allreduce_s = step_s - sum(compute_per_layer(profile))
    weights = sum(layer.param_bytes for layer in profile.layers)
    return 2 * (n - 1) / n * weights / allreduce_s / GBIT


def sensitivity(quick: bool) -> pd.DataFrame:
    """VGG-16 on Cluster-A: speed-up of the paper's 15-1 over data parallelism as the network slows."""
    setting = SETTINGS[0]
    profile = pipesim.load_profile(TRACES / "vgg16.json")
    rows = []
    for gbit in EFFECTIVE_GBIT[:2] if quick else EFFECTIVE_GBIT:
        topology = cluster(setting, gbit * GBIT)
        dp = check_stages(profile, topology, ((0, profile.num_layers, setting.num_devices),), label=DATA_PARALLEL)
        hybrid = check_stages(profile, topology, paper_stages(profile, setting), label=PAPER_CUT)
        dp_s, hybrid_s = (c.result.metrics.throughput_samples_per_s for c in (dp, hybrid))
        rows.append({"model": "vgg16", "cluster": "A", "effective_inter_server_gbit_per_s": gbit,
                     "dp_samples_per_s": dp_s, "paper_config_samples_per_s": hybrid_s,
                     "speedup_over_dp": hybrid_s / dp_s, "paper_speedup": setting.paper_speedup})
    return pd.DataFrame(rows)


def plot(frame: pd.DataFrame, bandwidth: pd.DataFrame) -> object:
    """Speed-up over data parallelism per configuration and setting, and against network speed."""
    import matplotlib.pyplot as plt
    import numpy as np

    settings = list(dict.fromkeys(zip(frame["model"], frame["cluster"], strict=True)))
    figure, axes = plt.subplots(1, 2, figsize=(14, 5.5), width_ratios=[2.2, 1])
    ax = axes[0]
    groups = {
        "planner's choice": frame["is_planner_choice"],
        "paper's configuration": frame["is_paper_config"],
        RELEASED + " (released)": frame["config"] == RELEASED,
        "best other planner candidate": frame["config"].str.startswith("planner: ") & ~frame["is_planner_choice"],
    }
    width = 0.8 / len(groups)
    x = np.arange(len(settings))
    for index, (label, selected) in enumerate(groups.items()):
        values = [frame[selected & (frame["model"] == model) & (frame["cluster"] == cluster)]
                  ["speedup_over_dp"].max() for model, cluster in settings]
        ax.bar(x + (index - (len(groups) - 1) / 2) * width, values, width, label=label)
    for position, (model, cluster) in enumerate(settings):
        reported = frame[(frame["model"] == model) & (frame["cluster"] == cluster)]["paper_speedup"].iloc[0]
        ax.plot([position - 0.45, position + 0.45], [reported, reported], color="black", linewidth=2)
    ax.plot([], [], color="black", linewidth=2, label="paper's reported speed-up (Table 3, recalled)")
    ax.set_xticks(x, [f"{model}\n{cluster}" for model, cluster in settings], fontsize=8)
    ax.set_ylabel("speed-up over data parallelism (throughput ratio)")
    ax.set_title("Simulated hybrid configurations against data parallelism, 16 V100s", fontsize=10)
    ax.set_ylim(0, frame["paper_speedup"].max() * 1.25)  # room for the legend above the paper's marks
    ax.legend(fontsize=7, ncols=2, loc="upper right")
    ax.grid(True, axis="y", alpha=0.3)
    ax = axes[1]
    ax.plot(bandwidth["effective_inter_server_gbit_per_s"], bandwidth["speedup_over_dp"], marker="o",
            label="simulated 15-1 / data parallel")
    ax.axhline(bandwidth["paper_speedup"].iloc[0], color="black", linestyle="--", label="paper: 5.28x (recalled)")
    ax.set_xscale("log", base=2)
    ticks = list(bandwidth["effective_inter_server_gbit_per_s"])
    ax.set_xticks(ticks, [f"{tick:g}" for tick in ticks])
    ax.minorticks_off()
    ax.set_xlabel("effective inter-server bandwidth, Gbit/s (both sides)")
    ax.set_ylabel("speed-up over data parallelism")
    ax.set_title("VGG-16, Cluster-A: sensitivity to the network", fontsize=10)
    ax.invert_xaxis()
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return figure


def main(argv: list[str] | None = None) -> pd.DataFrame:
    """Run the study and write its tables and figure."""
    args = parse_args(__doc__ or "", argv)
    frame, bandwidth = run(args.quick)
    write_table(frame, args.out, "study2_pipedream")
    choices = summary(frame)
    write_table(choices, args.out, "study2_choices")
    write_table(bandwidth, args.out, "study2_bandwidth")
    write_figure(plot(frame, bandwidth), args.out, "study2_pipedream")
    for row in choices.itertuples(index=False):
        print(f"study 2: {row.model:8s} {row.cluster}: planner {row.planner_choice} {row.planner_speedup_over_dp:.2f}x; "
              f"best {row.best_simulated} {row.best_speedup_over_dp:.2f}x; paper's {row.paper_config} "
              f"{row.paper_simulated_speedup_over_dp:.2f}x vs reported {row.paper_reported_speedup:.2f}x")
    return frame


if __name__ == "__main__":
    main(sys.argv[1:])
