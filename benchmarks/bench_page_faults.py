"""Page faults per run: the same call repeated in a fresh process, with glibc's adaptive malloc
thresholds and with pipesim's fixed ones (``pipesim.allocator``), against a baseline tree.

    python benchmarks/bench_page_faults.py --baseline TREE [--label COMMIT] [--write]

Each (tree, thresholds) runs in its own process: 1F1B at p=64, m=512 (65,600 ops) is prepared
once, then the analytic engine (compiled) and the DES (compiled) each run it 40 times after a
first run; per call the median wall time, the CPU time and the minor page faults. The baseline
tree does not set the thresholds itself, so its "fixed" row sets glibc's through the
environment (``pipesim.allocator.ENVIRONMENT``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from results_file import machine, write_section

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RUNS = 40
PROBE = """
import inspect, json, resource, statistics, time
from pipesim import Topology, uniform_profile
from pipesim.engine.analytic import run_analytic
from pipesim.engine.des import run_des
from pipesim.simulation import make_plan, prepare
profile = uniform_profile(num_layers=64, forward_s=1e-3, backward_s=2e-3, activation_bytes=1e6, param_bytes=4e6)
topology = Topology.uniform(num_devices=64, bandwidth="25Gbit/s", latency="5us")
program = prepare(profile, topology, make_plan(profile, schedule="1f1b", num_stages=64, num_microbatches=512))
analytic = {"compiled": True} if "compiled" in inspect.signature(run_analytic).parameters else {"method": "kernel"}
des = {"compiled": True} if "compiled" in inspect.signature(run_des).parameters else {}
found = {}
for name, call in (("analytic", lambda: run_analytic(program, **analytic)), ("des", lambda: run_des(program, **des))):
    call()
    walls = []
    faults, cpu = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time()
    for _ in range(RUNS):
        started = time.perf_counter()
        call()
        walls.append(time.perf_counter() - started)
    found[name] = {"wall_s": statistics.median(walls), "cpu_s": (time.process_time() - cpu) / RUNS,
                   "faults": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / RUNS}
print(json.dumps(found))
"""


def probe(tree: Path, environment: dict[str, str]) -> dict[str, dict[str, float]]:
    """One fresh process of ``tree`` with ``environment`` added; its measurements."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("MALLOC_")}
    env.update(environment, PYTHONPATH=str(tree))
    done = subprocess.run([sys.executable, "-c", PROBE.replace("RUNS", str(RUNS))], capture_output=True, text=True,
                          env=env, cwd="/", check=True)
    result: dict[str, dict[str, float]] = json.loads(done.stdout)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True)
    parser.add_argument("--label", default="baseline")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from pipesim.allocator import ENVIRONMENT

    cases = [(args.label, args.baseline, "glibc's adaptive", {}),
             ("this tree", ROOT, "glibc's adaptive", {"PIPESIM_MALLOC": "default"}),
             (args.label, args.baseline, "fixed (environment)", ENVIRONMENT),
             ("this tree", ROOT, "fixed (pipesim.allocator)", {})]
    rows = []
    for tree_name, tree, thresholds, environment in cases:
        found = probe(tree, environment)
        for engine, figures in found.items():
            rows.append(f"| {engine} | {tree_name} | {thresholds} | {figures['wall_s'] * 1e3:.2f} | "
                        f"{figures['cpu_s'] * 1e3:.2f} | {figures['faults']:.0f} |")
            print(rows[-1], flush=True)
    rows.sort(key=lambda row: row.split("|")[1])
    text = "\n".join([
        "## Page faults per run (`bench_page_faults.py`)", "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {machine()}", "",
        f"1F1B, p=64, m=512 (65,600 ops), prepared once; {RUNS} calls per engine (compiled kernels) in one fresh "
        "process per row, after a first call. Wall: median per call; CPU: mean per call; faults: minor page "
        "faults per call.", "",
        "| engine | tree | malloc thresholds | wall ms | CPU ms | faults |", "|---|---|---|---|---|---|", *rows])
    print(text)
    if args.write:
        write_section("page-faults", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
