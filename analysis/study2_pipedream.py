"""Study 2: PipeDream (SOSP 2019): hybrid configurations and their speed-up over data parallelism.

Setting: PipeDream's measured profiles (traces/vgg16.json, alexnet.json, resnet50.json) on 16
V100s, as the paper's Cluster-A (4 servers of 4, PCIe inside a server, 12 GB/s assumed, 10 Gbit/s
Ethernet between) and Cluster-B (2 servers of 8, NVLink, 50 GB/s assumed, 25 Gbit/s between);
5 us latency (assumed). Per-GPU batch = the profile's microbatch (128 images for VGG-16 and
ResNet-50, 256 for AlexNet).

How a configuration is simulated. A configuration "r0-r1-..." cuts the layers into stages and
gives stage s r_s GPUs (data parallel inside the stage). pipesim's engine today models a
replicated stage only as a ring all-reduce of its weights, 2(r-1)/r x bytes / bandwidth, added
to the stage's update op (see pipesim/spec/stages.py); it does not divide the stage's work among
the replicas. So each stage runs on one virtual device whose speed is r_s (r_s microbatches in
the time one GPU takes for one), the schedule is 2bw (PipeDream's 1F1B steady state without
flushes; its one update per minibatch carries the all-reduce), and m = max(max r_s, p): the most
replicated stage all-reduces once per microbatch per replica, as PipeDream does; less replicated
stages all-reduce less often than PipeDream would (optimistic for them). Links between stages are
PCIe/NVLink when both stages sit in one server, else the inter-server network; the all-reduce runs
at the slowest level any replicated stage spans. Data parallelism ("16") is one stage on 16
replicas; its time per step is also given by the formula compute + 2(n-1)/n x weights / bandwidth.

Candidates: the paper's configuration (15-1 cut where the released PipeDream code cuts VGG-16:
the fully connected layers on the 16th GPU; "16" = data parallelism), 2-stage r-(16-r) splits for
r in {8, 12, 14, 15} at the cut with the best simulated throughput (every cut is simulated), 4
stages of 4 (one server each) and a straight 16-stage pipeline, both at simulate's
compute-balanced cuts, and the planner's plan when pipesim.plan is installed.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import pandas as pd

import pipesim
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
DATA_PARALLEL, PAPER_CUT = "16 (data parallel)", "15-1, paper's cut"
PAPER_LABEL = {"16": DATA_PARALLEL, "15-1": PAPER_CUT}

Config = tuple[tuple[tuple[int, int], ...], tuple[int, ...]]  # (partition, replicas)


def compute_per_layer(profile: pipesim.Profile) -> list[float]:
    """Forward + backward seconds of each layer for one microbatch."""
    return [layer.forward_s + layer.backward_s for layer in profile.layers]


def two_stage(profile: pipesim.Profile, first: int, total: int, cut: int) -> Config:
    """The configuration ``first``-(total-first) with stage 1 starting at layer ``cut``."""
    return ((0, cut), (cut, profile.num_layers)), (first, total - first)


def paper_cut(profile: pipesim.Profile) -> int:
    """Where the released PipeDream code starts its last stage: the first fully connected layer."""
    return next(index for index, layer in enumerate(profile.layers) if "Linear" in layer.name)


def best_two_stage(profile: pipesim.Profile, setting: Setting, first: int) -> Config:
    """``first``-(n-first) at the cut with the highest simulated throughput (every cut is simulated)."""
    n = setting.num_devices
    configs = [two_stage(profile, first, n, cut) for cut in range(1, profile.num_layers)]
    return max(configs, key=lambda config: throughput(profile, setting, config, setting.inter_bytes_per_s))


def candidates(profile: pipesim.Profile, setting: Setting, quick: bool = False) -> dict[str, Config]:
    """The hand-enumerated configurations, by label."""
    n, layers = setting.num_devices, profile.num_layers
    configs: dict[str, Config] = {DATA_PARALLEL: (((0, layers),), (n,))}
    if setting.paper_config == "15-1":
        configs[PAPER_CUT] = two_stage(profile, n - 1, n, paper_cut(profile))
    if quick:
        return configs
    for first in (8, 12, 14, 15):
        configs[f"{first}-{n - first}, best cut"] = best_two_stage(profile, setting, first)
    configs["4-4-4-4, compute-balanced"] = (balanced(profile, 4), (4, 4, 4, 4))
    configs["straight 16, compute-balanced"] = (balanced(profile, n), (1,) * n)
    return configs


def balanced(profile: pipesim.Profile, num_stages: int) -> tuple[tuple[int, int], ...]:
    """simulate's own compute-balanced partition."""
    plan = pipesim.make_plan(profile, schedule="1f1b", num_stages=num_stages, num_microbatches=1)
    return plan.partition


def planner_config(setting: Setting) -> tuple[Config | None, str]:
    """The planner's configuration through ``pipesim plan --json`` (issue 5), or why there is none."""
    if importlib.util.find_spec("pipesim.plan") is None:
        return None, "pipesim.plan not installed: hand-enumerated candidates only"
    command = [sys.executable, "-m", "pipesim", "plan", "--profile", str(TRACES / f"{setting.model}.json"),
               "--devices", str(setting.num_devices), "--devices-per-server", str(setting.per_server),
               "--bandwidth", f"{setting.intra_bytes_per_s:g}B/s",
               "--inter-server-bandwidth", f"{setting.inter_bytes_per_s:g}B/s", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return None, f"pipesim plan failed: {done.stderr.strip().splitlines()[-1:]}"
    stages = json.loads(done.stdout)["stages"]
    partition = tuple((int(s["layers"][0]), int(s["layers"][1])) for s in stages)
    return (partition, tuple(int(s["replicas"]) for s in stages)), "planner (pipesim plan)"


def topology(setting: Setting, replicas: tuple[int, ...], inter_bytes_per_s: float) -> pipesim.Topology:
    """One virtual device per stage, of speed r_s; stages take GPUs in order, server by server."""
    starts = [0, *accumulate(replicas)]
    servers = [set(range(starts[s] // setting.per_server, (starts[s + 1] - 1) // setting.per_server + 1))
               for s in range(len(replicas))]
    links = []
    for stage in range(len(replicas) - 1):
        inside = len(servers[stage] | servers[stage + 1]) == 1
        links.append({"src": stage, "dst": stage + 1, "latency_s": LATENCY_S,
                      "bandwidth_bytes_per_s": setting.intra_bytes_per_s if inside else inter_bytes_per_s})
    spans_servers = any(r > 1 and len(group) > 1 for r, group in zip(replicas, servers, strict=True))
    return pipesim.Topology.model_validate({
        "devices": [{"name": f"stage{s} x{r}", "speed": float(r)} for s, r in enumerate(replicas)],
        "bandwidth_bytes_per_s": inter_bytes_per_s if spans_servers else setting.intra_bytes_per_s,
        "latency_s": LATENCY_S,
        "links": links,
    })


def throughput(profile: pipesim.Profile, setting: Setting, config: Config, inter_bytes_per_s: float) -> float:
    """Simulated samples per second of a configuration."""
    partition, replicas = config
    m = max(max(replicas), len(replicas))
    result = pipesim.simulate(profile, topology(setting, replicas, inter_bytes_per_s), schedule="2bw",
                              num_stages=len(replicas), num_microbatches=m, num_minibatches=4,
                              partition=partition, replicas=replicas)
    return result.metrics.throughput_samples_per_s


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
        configs = candidates(profile, setting, quick)
        plan, planner_note = planner_config(setting)
        if plan is not None:
            configs = {"planner": plan, **configs}
        dp_sim = throughput(profile, setting, configs[DATA_PARALLEL], setting.inter_bytes_per_s)
        for label, config in configs.items():
            partition, replicas = config
            simulated = throughput(profile, setting, config, setting.inter_bytes_per_s)
            rows.append({
                "model": setting.model, "cluster": setting.cluster, "config": label,
                "replicas": "-".join(str(r) for r in replicas),
                "partition": " ".join(f"{a}:{b}" for a, b in partition),
                "throughput_samples_per_s": simulated,
                "speedup_over_dp": simulated / dp_sim,
                "dp_formula_samples_per_s": data_parallel_formula(profile, setting, setting.inter_bytes_per_s),
                "paper_config": setting.paper_config,
                "is_paper_config": label == PAPER_LABEL[setting.paper_config],
                "paper_speedup": setting.paper_speedup,
                "planner": planner_note,
            })
    frame = pd.DataFrame(rows)
    best = frame.groupby(["model", "cluster"], sort=False)["speedup_over_dp"].transform("max")
    frame["is_best"] = frame["speedup_over_dp"] == best
    frame["simulated_over_paper"] = (frame["speedup_over_dp"] / frame["paper_speedup"]).where(frame["is_paper_config"])
    frame["implied_dp_gbit_per_s"] = [implied_dp_bandwidth(row) for row in frame.itertuples(index=False)]
    return frame, sensitivity(quick)


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
    configs = candidates(profile, setting, quick=True)
    rows = []
    for gbit in EFFECTIVE_GBIT[:2] if quick else EFFECTIVE_GBIT:
        dp = throughput(profile, setting, configs[DATA_PARALLEL], gbit * GBIT)
        hybrid = throughput(profile, setting, configs[PAPER_CUT], gbit * GBIT)
        rows.append({"model": "vgg16", "cluster": "A", "effective_inter_server_gbit_per_s": gbit,
                     "dp_samples_per_s": dp, "paper_config_samples_per_s": hybrid, "speedup_over_dp": hybrid / dp,
                     "paper_speedup": setting.paper_speedup})
    return pd.DataFrame(rows)


def plot(frame: pd.DataFrame, bandwidth: pd.DataFrame) -> object:
    """Speed-up over data parallelism per configuration and setting, and against network speed."""
    import matplotlib.pyplot as plt
    import numpy as np

    settings = list(dict.fromkeys(zip(frame["model"], frame["cluster"], strict=True)))
    figure, axes = plt.subplots(1, 2, figsize=(14, 5.5), width_ratios=[2.2, 1])
    ax = axes[0]
    labels = list(dict.fromkeys(frame["config"]))
    width = 0.8 / len(labels)
    x = np.arange(len(settings))
    for index, label in enumerate(labels):
        values = [frame[(frame["model"] == model) & (frame["cluster"] == cluster) & (frame["config"] == label)]
                  ["speedup_over_dp"].max() for model, cluster in settings]
        ax.bar(x + (index - (len(labels) - 1) / 2) * width, values, width, label=label)
    for position, (model, cluster) in enumerate(settings):
        reported = frame[(frame["model"] == model) & (frame["cluster"] == cluster)]["paper_speedup"].iloc[0]
        ax.plot([position - 0.45, position + 0.45], [reported, reported], color="black", linewidth=2)
    ax.plot([], [], color="black", linewidth=2, label="paper's reported speed-up (Table 3, recalled)")
    ax.set_xticks(x, [f"{model}\n{cluster}" for model, cluster in settings], fontsize=8)
    ax.set_ylabel("speed-up over data parallelism (throughput ratio)")
    ax.set_title("Simulated hybrid configurations against data parallelism, 16 V100s", fontsize=10)
    ax.legend(fontsize=7, ncols=2)
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
    write_table(bandwidth, args.out, "study2_bandwidth")
    write_figure(plot(frame, bandwidth), args.out, "study2_pipedream")
    for (model, cluster), rows in frame.groupby(["model", "cluster"], sort=False):
        best = rows[rows["is_best"]].iloc[0]
        paper = rows[rows["is_paper_config"]].iloc[0]
        print(f"study 2: {model:8s} {cluster}: best {best['config']} {best['speedup_over_dp']:.2f}x; paper's "
              f"{paper['config']} {paper['speedup_over_dp']:.2f}x vs reported {paper['paper_speedup']:.2f}x")
    return frame


if __name__ == "__main__":
    main(sys.argv[1:])
