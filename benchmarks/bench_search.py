"""pipesim search speed (issue 33): Llama-3 70B on 512 H100, GPT-3 175B on 384 A100-80GB, Llama-3 405B on 16,384 H100.

Whole processes, as a user runs them: each search command beside ``python -c "import numpy, pipesim"``
in the same run, alternating, so host drift hits both alike. Wall seconds and the child's CPU
seconds (user + system) are recorded: on a shared host the CPU seconds are what a quiet host's
wall would be, near enough. The first search of a fresh checkout also loads (or compiles) numba's
kernels; a warm-up run does that before timing. ``BASELINE=TREE`` (a checkout of an older
pipesim) also times the first case there, once. Writes its section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from results_file import machine, write_section

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "Llama-3 70B, 512 H100, batch 1024 x 8k (target 10 s)":
        ["--model", "llama3-70b", "--device", "h100", "--gpus", "512", "--global-batch", "1024", "--seq-len", "8192"],
    "GPT-3 175B, 384 A100-80GB, batch 1536 x 2k (target 10 s)":
        ["--model", "gpt3-175b", "--device", "a100-80gb", "--gpus", "384", "--global-batch", "1536"],
    "Llama-3 405B, 16,384 H100, batch 2048 x 8k (target 60 s)":
        ["--model", "llama3-405b", "--device", "h100", "--gpus", "16384", "--global-batch", "2048", "--seq-len", "8192"],
}
BASELINE = ["-c", "import numpy, pipesim"]


def run(args: list[str], cwd: Path = ROOT) -> tuple[float, float, str]:
    """Wall and CPU seconds of one ``python ARGS`` process, and its stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, check=True,
                          env={**os.environ, "PYTHONPATH": str(cwd)})
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def main(repeats: int = 2) -> None:
    """Each case ``repeats`` times beside the import baseline, alternating; then the section."""
    first = next(iter(CASES.values()))
    run(["-m", "pipesim", "search", *first, "--json"])  # warm-up: numba's cache
    rows, lines = [], []
    for name, flags in CASES.items():
        walls, cpus, bases, output = [], [], [], ""
        for _ in range(repeats):
            bases.append(run(BASELINE)[0])
            wall, cpu, output = run(["-m", "pipesim", "search", *flags, "--json"])
            walls.append(wall)
            cpus.append(cpu)
        data = json.loads(output)
        best = data["best"]
        wall, cpu, base = statistics.median(walls), statistics.median(cpus), statistics.median(bases)
        rows.append(f"| {name} | {data['num_candidates']:,} | {data['num_simulated']} | {data['num_pruned_by_memory']:,} "
                    f"| {data['num_pruned_by_bound']:,} | {wall:.2f} | {cpu:.2f} | {wall / base:.1f}x |")
        lines.append(f"- {name}: tp={best['tp']} cp={best['cp']} pp={best['pp']} dp={best['dp']} "
                     f"b={best['microbatch_size']} {best['schedule']} V={best['stages_per_rank']} "
                     f"SP={'on' if best['sequence_parallel'] else 'off'} recompute {best['recompute']} "
                     f"ZeRO-{best['zero']}: {best['tokens_per_s']:,.0f} tokens/s, MFU {best['mfu']:.1%}, "
                     f"peak {best['peak_memory_bytes'] / 1e9:.1f} GB. Runs: {', '.join(f'{w:.2f}' for w in walls)} s "
                     f"wall, {', '.join(f'{c:.2f}' for c in cpus)} s CPU; baseline {', '.join(f'{b:.2f}' for b in bases)} s.")
    old = ""
    if os.environ.get("BASELINE"):
        tree = Path(os.environ["BASELINE"]).resolve()
        wall, cpu, output = run(["-m", "pipesim", "search", *first, "--json"], cwd=tree)
        old = (f"\nThe same first case on the older tree {tree.name} (the search before issue 33), once, in this run: "
               f"{wall:.1f} s wall, {cpu:.1f} s CPU ({len(json.loads(output)['candidates']):,} candidates).\n")
    text = f"""## Configuration search (`make bench-search`)

{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {machine()}.
`pipesim search ... --json` over the whole space (TP x CP x PP x DP, microbatch 1/2/4, every schedule
and even V, sequence parallelism, recomputation, ZeRO 0-3), whole process, median of {repeats}, each run
beside a `python -c "import numpy, pipesim"` baseline (numba's kernels warm in its disk cache):

| case | candidates | simulated | pruned by memory | pruned by bound | wall s | CPU s | wall over baseline |
| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |
{chr(10).join(rows)}

Best configurations (simulated; the device files' efficiencies):

{chr(10).join(lines)}
{old}
Load average over the last minute when it finished: {os.getloadavg()[0]:.1f}. The host is shared: wall
seconds swell with the load; the CPU seconds are the better guide to a quiet host's wall time.
"""
    write_section("search", text)
    print(text)


if __name__ == "__main__":
    main()
