"""Bytes per op: a run's peak memory over its op count, per engine, the figure ``--max-ops`` uses.

Usage: python benchmarks/bench_memory_per_op.py [--sizes 1,4] [--no-write]   (``make bench-memory``)

Method: each run is its own process. It imports pipesim, runs a small warm-up of the same engine
(so that imports and numba's kernels are loaded), reads its resident set (VmRSS), runs
``simulate_plan`` (1F1B, 2BW and PipeDream at p=64, K=4, m chosen for about N million ops,
10 GB/s links, compiled kernels), and reads its peak resident set (VmHWM). The run's memory is peak minus before: the op
table, the trace's columns, memory events, metrics and the engine's own state, all alive at the
peak. The figure per engine is the mean of the per-op values of its runs; the table
shows how far the figure's estimate is from each measured peak (within 20% is the target).

Results go to benchmarks/RESULTS.md, in its ``memory-per-op`` section.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

NUM_STAGES, NUM_MINIBATCHES = 64, 4
ENGINES = ("analytic", "des")

# One measurement, in a fresh interpreter: prints {"num_ops", "before", "peak"} in bytes.
CHILD = """
import json, sys
sys.path.insert(0, {root!r})
from pipesim.simulation import make_plan, simulate_plan
from pipesim.spec.profile import uniform_profile
from pipesim.spec.topology import Topology

def status(key):
    with open("/proc/self/status") as handle:
        return next(int(line.split()[1]) * 1024 for line in handle if line.startswith(key + ":"))

profile = uniform_profile(num_layers=128, forward_s=1e-3, backward_s=2e-3, activation_bytes=1e6, param_bytes=4e6)
topology = Topology.uniform(num_devices={p}, bandwidth="10GB/s", latency="5us")
def run(m):
    plan = make_plan(profile, schedule={schedule!r}, num_stages={p}, num_microbatches=m, num_minibatches={k})
    return simulate_plan(profile, topology, plan, engine={engine!r}, kernels="always", max_ops=10**9)
run(64)
before = status("VmRSS")
result = run({m})
print(json.dumps({{"num_ops": result.metrics.num_ops, "before": before, "peak": status("VmHWM")}}))
"""


def measure(schedule: str, engine: str, num_microbatches: int) -> dict[str, int]:
    """Peak and starting resident bytes of one run, in a process of its own."""
    code = CHILD.format(root=str(ROOT), p=NUM_STAGES, k=NUM_MINIBATCHES, engine=engine, m=num_microbatches,
                        schedule=schedule)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    found: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4", help="millions of ops, comma-separated")
    parser.add_argument("--schedules", default="1f1b,2bw,pipedream", help="registry keys, comma-separated")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()
    from results_file import machine, write_section

    from pipesim.simulation import estimate_num_ops, make_plan
    from pipesim.spec.profile import uniform_profile

    profile = uniform_profile(num_layers=128, forward_s=1e-3, backward_s=2e-3)
    rows, figures = [], {}
    for engine in ENGINES:
        measured = []
        for schedule in args.schedules.split(","):
            for millions in (float(size) for size in args.sizes.split(",")):
                one, two = (estimate_num_ops(make_plan(profile, schedule=schedule, num_stages=NUM_STAGES,
                                                       num_microbatches=count, num_minibatches=NUM_MINIBATCHES),
                                             profile) for count in (NUM_STAGES, NUM_STAGES + 1))
                # Ops grow linearly in m: (two - one) per microbatch.
                m = max(NUM_STAGES, NUM_STAGES + round((millions * 1e6 - one) / (two - one)))
                got = measure(schedule, engine, m)
                used = got["peak"] - got["before"]
                measured.append((schedule, m, got["num_ops"], used))
                print(f"{engine} {schedule} m={m} ops={got['num_ops']:,}: {used / 2**20:.0f} MiB, "
                      f"{used / got['num_ops']:.0f} B/op", flush=True)
        figure = sum(used / ops for _, _, ops, used in measured) / len(measured)
        figures[engine] = figure
        rows += [f"| {engine} | {schedule} | {m} | {ops:,} | {used / 2**20:,.0f} | {used / ops:.0f} | {figure:.0f} | "
                 f"{figure * ops / used - 1:+.0%} |" for schedule, m, ops, used in measured]
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    section = "\n".join([
        "## Memory per op (`make bench-memory`)", "",
        f"{stamp}; {machine()}.", "",
        f"p={NUM_STAGES}, K={NUM_MINIBATCHES}, uniform 128 layers, 10 GB/s, compiled kernels; each run in a "
        "fresh process after a warm-up run: peak resident set (VmHWM) minus the resident set before the run. "
        "The figure per engine is the mean per-op value; `pipesim.simulation.BYTES_PER_OP` holds it "
        "(to the byte), and `--max-ops`' default and its refusal message use it.", "",
        "| engine | schedule | m | ops | peak over start MiB | bytes/op | figure bytes/op | figure's estimate vs "
        "measured |", "|---|---|---|---|---|---|---|---|", *rows, "",
        "Figures: " + ", ".join(f"{engine} {figure:.0f} B/op" for engine, figure in figures.items()) + ". The "
        "estimate used before, 1 KiB per op, was over twice these, so runs that fit were refused."])
    print(section)
    if not args.no_write:
        write_section("memory-per-op", section)


if __name__ == "__main__":
    main()
