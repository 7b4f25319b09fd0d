"""What the op cost model costs: a ``simulate --model`` run and ``search`` per candidate, against another tree.

Alternates this tree and ``--baseline TREE`` (e.g. ``git archive main | tar -x -C /tmp/base``), each
command in a fresh process, and reports the medians and their ratio (these machines are shared:
only the ratio in one run means anything). ``--write`` puts the table into benchmarks/RESULTS.md.

    python benchmarks/bench_model_cost.py --baseline /tmp/base [--rounds 5] [--write]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from results_file import machine, write_section

HERE = Path(__file__).resolve().parents[1]
SIMULATE = ("simulate", "--model", "llama3-70b", "--device", "h100", "--tp", "8", "--stages", "8", "--dp", "8",
            "--global-batch", "1024", "--recompute-stages", "selective", "--schedule", "1f1b", "--json")
SEARCH = ("search", "--model", "llama3-8b", "--device", "h100", "--gpus", "64", "--global-batch", "256",
          "--seq-len", "4096", "--json", "--no-progress")


def timed(tree: Path, args: tuple[str, ...]) -> tuple[float, str]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pipesim", *args], cwd=tree, env=env, capture_output=True, text=True,
                          timeout=1800)
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"{tree}: pipesim {' '.join(args[:3])} failed: {done.stderr.strip()[-300:]}")
    return seconds, done.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    trees = {"this tree": HERE, "baseline": args.baseline.resolve()}
    results: dict[str, dict[str, list[float]]] = {name: {"simulate": [], "search": []} for name in trees}
    candidates: dict[str, int] = {}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            results[name]["simulate"].append(timed(tree, SIMULATE)[0])
            seconds, out = timed(tree, SEARCH)
            candidates[name] = len(json.loads(out)["candidates"])
            results[name]["search"].append(seconds / candidates[name])
    load = os.getloadavg()[0]
    lines = ["## The op cost model's own cost (`bench_model_cost.py`, issue 31)", "",
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {machine()}, load average "
             f"{load:.1f} at the end; {args.rounds} alternated rounds, each command a fresh process; baseline "
             f"`{args.baseline}`.", "",
             "| command | this tree (median) | baseline (median) | ratio |", "|---|---|---|---|"]
    for key, label in (("simulate", "`simulate --model llama3-70b` (8 stages, tp 8, dp 8), s"),
                       ("search", f"`search llama3-8b` on 64 H100, s per candidate ({candidates['this tree']} "
                                  f"candidates; baseline {candidates['baseline']})")):
        mine, base = statistics.median(results["this tree"][key]), statistics.median(results["baseline"][key])
        lines.append(f"| {label} | {mine:.3f} | {base:.3f} | {mine / base:.2f}x |")
    text = "\n".join(lines)
    print(text)
    if args.write:
        write_section("model-cost", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
