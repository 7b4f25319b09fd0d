"""Planner speed: PipeDream's partitioner on the shipped profiles; writes its section of benchmarks/RESULTS.md."""

from __future__ import annotations

import argparse
import datetime
import math
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pipesim.plan import partition as partition_module
from pipesim.plan.partition import partition
from pipesim.plan.planner import plan_2bw
from pipesim.spec.files import load_profile
from pipesim.spec.stages import balance_partition
from pipesim.spec.topology import Topology

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
BEGIN, END = "<!-- planner:begin -->", "<!-- planner:end -->"


def best_of(repeats: int, work: Callable[[], object]) -> tuple[float, float]:
    """(minimum, median) wall seconds of ``repeats`` runs of ``work``."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times), statistics.median(times)


def count_passes(work: Callable[[], object]) -> int:
    """Feasibility passes (one sweep of the DP over every (devices, replicas) pair) that ``work`` makes."""
    original = partition_module.Partitioner.feasible
    calls = 0

    def counted(self: partition_module.Partitioner, time_limit: float, memory_limit: float) -> object:
        nonlocal calls
        calls += 1
        return original(self, time_limit, memory_limit)

    partition_module.Partitioner.feasible = counted  # type: ignore[method-assign, assignment]
    try:
        work()
    finally:
        partition_module.Partitioner.feasible = original  # type: ignore[method-assign]
    return calls


def machine() -> str:
    """``nproc`` and the first lines of ``lscpu``."""
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines()[:8]
    except OSError:
        lscpu = [platform.processor()]
    nproc = subprocess.run(["nproc"], capture_output=True, text=True, check=False).stdout.strip()
    return f"nproc {nproc}; " + "; ".join(" ".join(line.split()) for line in lscpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()
    cluster = Topology.hierarchical(num_devices=16, devices_per_server=4, intra_bandwidth="10GB/s",
                                    inter_bandwidth="10Gbit/s")
    nasnet = load_profile(ROOT / "traces" / "nasnetalarge.json")
    baseline_min, _ = best_of(args.repeats, lambda: balance_partition(nasnet, 16))
    rows = []
    cases: list[tuple[str, str, Callable[[], object]]] = []
    for name in ("nasnetalarge", "nasnetamobile", "resnet50", "vgg16"):
        profile = load_profile(ROOT / "traces" / f"{name}.json")
        cases.append((name, "pipedream, replication", lambda p=profile: partition(p, cluster)))
        if name == "nasnetalarge":
            cases.append((name, "pipedream, --overlap", lambda p=profile: partition(p, cluster, overlap=True)))
            cases.append((name, "pipedream, --straight", lambda p=profile: partition(p, cluster, straight=True)))
            cases.append((name, "pipedream, --memory 16GB", lambda p=profile: partition(p, cluster, memory_bytes=16e9)))
        if name == "vgg16":
            cases.append((name, "2bw, all depths and sizes", lambda p=profile: plan_2bw(p, cluster)))
    for name, what, work in cases:
        fastest, median = best_of(args.repeats, work)
        rows.append((name, what, fastest, median, count_passes(work)))
    lines = [
        BEGIN,
        "## Planner (issue 5): `pipesim plan`",
        "",
        f"Run {datetime.date.today().isoformat()} with `make bench-planner` "
        f"(`python benchmarks/bench_planner.py`, best and median of {args.repeats}).",
        f"Machine: {machine()}.",
        "Cluster: 16 devices, 4 per server, 10 GB/s inside a server, 10 Gbit/s between servers.",
        f"Baseline in the same run: `balance_partition(nasnetalarge, 16)` (compute-only min-max cut, no "
        f"replication) took {baseline_min:.4f} s.",
        "",
        "| profile | layers | planner | best s | median s | vs baseline | feasibility passes |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, what, fastest, median, passes in rows:
        layers = load_profile(ROOT / "traces" / f"{name}.json").num_layers
        ratio = fastest / baseline_min if baseline_min > 0 else math.inf
        lines.append(f"| {name} | {layers} | {what} | {fastest:.4f} | {median:.4f} | {ratio:.1f}x | {passes} |")
    lines += [
        "",
        "Target (DESIGN.md section 10): the largest shipped profile planned for 16 devices in under a second.",
        "The 2BW row plans every depth dividing 16, with and without recomputation, over microbatch sizes.",
        END,
    ]
    section = "\n".join(lines) + "\n"
    print(section)
    if args.no_write:
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from results_file import write_section

    write_section("planner", section.replace(BEGIN + "\n", "").replace(END + "\n", ""), RESULTS)


if __name__ == "__main__":
    main()
