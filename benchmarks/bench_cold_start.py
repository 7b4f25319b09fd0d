"""What a user waits for on a first call: one-shot CLI runs against the interpreter's own start-up,
and ``--samples`` (drawn durations) against a baseline source tree.

Every figure is a ratio to a peer timed in the same run, the two interleaved (A B, B A, ...), best
of ``--repeats``:
- ``pipesim simulate`` of p=4, m=8 (1F1B) against ``python -c "import numpy, pipesim"``: wall
  time and peak RSS of the whole process;
- ``pipesim simulate`` of p=64, m=512 (1F1B), one shot, with each kernel setting (auto, never,
  always): wall time, and the start-up the JSON reports (``startup_s``);
- with ``--baseline TREE``: ``simulate --samples 100 --cv 0.1`` of p=32, m=256 in both trees,
  their sample lists compared for equality.

    python benchmarks/bench_cold_start.py [--baseline TREE --label TEXT] [--write]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
UNIFORM = "layers={layers},forward_ms=1,backward_ms=2,activation_bytes=1000000,param_bytes=1000000"


def simulate_args(p: int, m: int, *extra: str) -> list[str]:
    """``-m pipesim simulate`` of a uniform 1F1B stack of p layers on p stages."""
    return ["-m", "pipesim", "simulate", "--uniform", UNIFORM.format(layers=p), "--stages", str(p),
            "--microbatches", str(m), "--schedule", "1f1b", *extra]


def run_once(args: list[str], tree: Path, env: dict[str, str] | None = None) -> tuple[float, str]:
    """Wall seconds and stdout of ``python ARGS`` run in ``tree`` (``-m`` and ``-c`` import from the
    working directory first) with ``tree`` on PYTHONPATH."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=tree,
                          env={**os.environ, "PYTHONPATH": str(tree), **(env or {})})
    wall = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"{' '.join(args)} failed: {done.stderr.strip()[-400:]}")
    return wall, done.stdout


def peak_rss_of(args: list[str], tree: Path, env: dict[str, str] | None = None) -> float:
    """Peak RSS (MiB) of one run of ``python ARGS``, read by /usr/bin/time's own wait4."""
    done = subprocess.run(["/usr/bin/time", "-f", "%M", sys.executable, *args], capture_output=True, text=True, cwd=tree,
                          env={**os.environ, "PYTHONPATH": str(tree), **(env or {})}, check=True)
    return int(done.stderr.strip().splitlines()[-1]) / 1024


def interleaved(pairs: list[tuple[list[str], Path, dict[str, str] | None]], repeats: int) -> list[list[float]]:
    """Wall seconds of every run, the runs of each pair alternated (A B, B A, ...)."""
    times: list[list[float]] = [[] for _ in pairs]
    for repeat in range(repeats):
        order = range(len(pairs)) if repeat % 2 == 0 else reversed(range(len(pairs)))
        for side in order:
            args, tree, env = pairs[side]
            times[side].append(run_once(args, tree, env)[0])
    return times


def one_shot_rows(tree: Path, repeats: int) -> list[str]:
    """The one-shot rows: p=4, m=8 against the import, then p=64, m=512 per kernel setting."""
    importing = ["-c", "import numpy, pipesim"]
    small = simulate_args(4, 8)
    imp, sim = interleaved([(importing, tree, None), (small, tree, None)], repeats)
    lines = ["| run | wall s (best) | ratio | peak RSS MiB |", "|---|---:|---:|---:|",
             f"| `python -c \"import numpy, pipesim\"` | {min(imp):.3f} | 1.00 | {peak_rss_of(importing, tree):.0f} |",
             f"| `simulate` p=4 m=8, 1F1B | {min(sim):.3f} | {min(sim) / min(imp):.2f} | "
             f"{peak_rss_of(small, tree):.0f} |"]
    large = simulate_args(64, 512, "--json")
    settings = ("auto", "never", "always")
    walls = interleaved([(large, tree, {"PIPESIM_JIT": s}) for s in settings], repeats)
    for setting, wall in zip(settings, walls, strict=True):
        startup = json.loads(run_once(large, tree, {"PIPESIM_JIT": setting})[1])["startup_s"]
        lines.append(f"| `simulate` p=64 m=512, 1F1B, PIPESIM_JIT={setting} (startup_s {startup:.3f}) | "
                     f"{min(wall):.3f} | {min(wall) / min(imp):.2f} | "
                     f"{peak_rss_of(large, tree, {'PIPESIM_JIT': setting}):.0f} |")
    return lines


def samples_rows(baseline: Path, tree: Path, label: str, repeats: int) -> list[str]:
    """``--samples 100`` of p=32, m=256 in both trees: best wall, ratio, and whether the samples agree."""
    args = simulate_args(32, 256, "--samples", "100", "--cv", "0.1", "--json")
    outputs = [json.loads(run_once(args, side)[1])["samples"] for side in (baseline, tree)]
    base, new = interleaved([(args, baseline, None), (args, tree, None)], repeats)
    same = "yes" if outputs[0] == outputs[1] else "NO"
    return ["| run | baseline s | this tree s | speed-up | samples identical |", "|---|---:|---:|---:|---|",
            f"| `simulate` p=32 m=256 1F1B `--samples 100 --cv 0.1` (baseline {label}) | {min(base):.2f} | "
            f"{min(new):.2f} | {min(base) / min(new):.1f}x | {same} |"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, help="source tree for the --samples comparison")
    parser.add_argument("--label", default="", help="what the baseline is (e.g. its commit)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per side, interleaved")
    parser.add_argument("--write", action="store_true", help="replace this section of benchmarks/RESULTS.md")
    args = parser.parse_args()
    tree = HERE.parent
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    sys.path.insert(0, str(HERE))
    from results_file import machine, write_section

    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines: list[Any] = ["## Cold start (`make bench-cold-start`)", "",
                        f"{stamp}; {machine()}; load average at start {load}; best of {args.repeats} interleaved runs.",
                        "", *one_shot_rows(tree, args.repeats)]
    if args.baseline is not None:
        lines += ["", *samples_rows(args.baseline.resolve(), tree, args.label or str(args.baseline),
                                    max(1, args.repeats // 2))]
    section = "\n".join(lines) + "\n"
    print(section)
    if args.write:
        write_section("cold-start", section)


if __name__ == "__main__":
    main()
