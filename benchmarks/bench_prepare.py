"""prepare() per point, fresh and with the schedule kept, against a baseline tree; writes its RESULTS.md section.

Each configuration runs in a child process (the kernels compile, or not, at import): with numba,
with PIPESIM_NO_JIT=1, and with glibc told to keep freed memory (so that a point reuses the
pages of the one before instead of faulting fresh ones in). ``--baseline TREE`` (e.g. a worktree
of main) times the same points on that tree's pipesim: its children and this tree's alternate,
round after round, so that load from other jobs falls on both alike, and each keeps its best.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SIZES = ((8, 32), (32, 128), (64, 256))
OTHERS = ("gpipe", "1f1b", "pipedream", "pipemare")
KEEP_MEMORY = {"MALLOC_TRIM_THRESHOLD_": str(256 << 20), "MALLOC_MMAP_THRESHOLD_": str(256 << 20),
               "MALLOC_TOP_PAD_": str(64 << 20)}


def point(name: str, p: int, m: int) -> tuple[Any, Any, Any]:
    """The sweep's profile (uniform, 128 layers), a 10 GB/s topology and a K=4 plan."""
    from pipesim import Topology, uniform_profile
    from pipesim.simulation import make_plan

    profile = uniform_profile(num_layers=128, forward_s=1e-3, backward_s=2e-3, activation_bytes=1e6, param_bytes=4e6)
    topology = Topology.uniform(num_devices=p, bandwidth="10GB/s", latency="5us")
    return profile, topology, make_plan(profile, schedule=name, num_stages=p, num_microbatches=m, num_minibatches=4)


def child(repeats: int, engine: bool) -> dict[str, Any]:
    """Best-of-``repeats`` seconds per point of prepare() on a fresh schedule (wall and CPU), of
    prepare() whose schedule a Reuse keeps (as a sweep's points share it) and, with ``engine``,
    of the analytic engine and of the whole point."""
    from pipesim import jit
    from pipesim.engine.analytic import run_analytic
    from pipesim.reuse import Reuse
    from pipesim.simulation import prepare, simulate_plan

    rows = []
    cases = [("2bw", p, m) for p, m in SIZES] + [(name, 64, 256) for name in OTHERS]
    for name, p, m in cases:
        profile, topology, plan = point(name, p, m)
        reuse = Reuse()
        program = prepare(profile, topology, plan, reuse=reuse)  # warm-up (and compilation)
        run_analytic(program)
        best: dict[str, float] = {}
        for _ in range(repeats):
            for way, run in (("fresh", lambda: prepare(profile, topology, plan)),
                             ("reused", lambda: prepare(profile, topology, plan, reuse=reuse))):
                started, cpu = time.perf_counter(), time.process_time()
                program = run()
                elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
                best[way] = min(best.get(way, elapsed), elapsed)
                best[way + "_cpu"] = min(best.get(way + "_cpu", cpu), cpu)
            if engine:
                started = time.perf_counter()
                run_analytic(program)
                best["engine"] = min(best.get("engine", 1e9), time.perf_counter() - started)
            del program
        for _ in range(max(1, repeats // 3) if engine else 0):  # the whole point, as a sweep runs it
            started = time.perf_counter()
            simulate_plan(profile, topology, plan, engine="auto")
            best["point"] = min(best.get("point", 1e9), time.perf_counter() - started)
        rows.append({"schedule": name, "p": p, "m": m, "ops": int(prepare(profile, topology, plan).ops.num_ops),
                     **best})
    import pipesim

    return {"backend": jit.backend(), "source": str(Path(pipesim.__file__).parent), "rows": rows}


def run_child(tree: Path, env: dict[str, str], repeats: int, engine: bool) -> dict[str, Any]:
    """``child`` in a fresh interpreter on the pipesim of ``tree``."""
    command = [sys.executable, __file__, "--child", "--repeats", str(repeats)] + (["--engine"] if engine else [])
    merged = {**os.environ, **env, "PYTHONPATH": str(tree)}
    done = subprocess.run(command, env=merged, capture_output=True, text=True, check=True, cwd=tree)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def best_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per point and measure, the best over several children's results."""
    merged = runs[0]
    for run in runs[1:]:
        for row, other in zip(merged["rows"], run["rows"], strict=True):
            for key, value in other.items():
                if isinstance(value, float):
                    row[key] = min(row[key], value)
    return merged


def table(compiled: dict[str, Any], plain: dict[str, Any], kept: dict[str, Any],
          baseline: dict[str, Any] | None) -> list[str]:
    head = "| schedule | p | m | ops | prepare ms | prepare CPU ms | schedule kept ms | prepare, plain ms | " \
           "prepare, memory kept ms | analytic engine ms | engine, plain ms | prepare / engine | simulate_plan ms |"
    extra = " baseline prepare ms | ratio | baseline CPU ms | CPU ratio | baseline kept ms | kept ratio |"
    lines = [head + (extra if baseline else ""), "|" + "---|" * (13 + 6 * bool(baseline))]
    for index, row in enumerate(compiled["rows"]):
        plain_row, kept_row = plain["rows"][index], kept["rows"][index]
        cells = [row["schedule"], row["p"], row["m"], f"{row['ops']:,}", f"{row['fresh'] * 1e3:.2f}",
                 f"{row['fresh_cpu'] * 1e3:.2f}", f"{row['reused'] * 1e3:.2f}", f"{plain_row['fresh'] * 1e3:.2f}",
                 f"{kept_row['fresh'] * 1e3:.2f}", f"{row['engine'] * 1e3:.1f}", f"{plain_row['engine'] * 1e3:.1f}",
                 f"{row['fresh'] / row['engine']:.2f}", f"{row['point'] * 1e3:.1f}"]
        if baseline:
            base = baseline["rows"][index]
            cells += [f"{base['fresh'] * 1e3:.2f}", f"{row['fresh'] / base['fresh']:.2f}",
                      f"{base['fresh_cpu'] * 1e3:.2f}", f"{row['fresh_cpu'] / base['fresh_cpu']:.2f}",
                      f"{base['reused'] * 1e3:.2f}", f"{row['reused'] / base['reused']:.2f}"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--engine", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=15, help="timed repeats per point (best of)")
    parser.add_argument("--baseline", type=Path, default=None, help="another source tree whose prepare() to time")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of this tree and the baseline")
    parser.add_argument("--no-write", action="store_true", help="print the section instead of writing RESULTS.md")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.repeats, args.engine)))
        return
    compiled = run_child(ROOT, {}, args.repeats, engine=True)
    plain = run_child(ROOT, {"PIPESIM_NO_JIT": "1"}, args.repeats, engine=True)
    kept = run_child(ROOT, KEEP_MEMORY, args.repeats, engine=False)
    baseline = None
    if args.baseline:
        ours, theirs = [compiled], []
        for _ in range(args.rounds):
            theirs.append(run_child(args.baseline.resolve(), {}, args.repeats, engine=False))
            ours.append(run_child(ROOT, {}, args.repeats, engine=False))
        compiled, baseline = best_of(ours), best_of(theirs)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from results_file import RESULTS, machine, write_section

    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    lines = [
        "## prepare(): building and lowering a schedule (`make bench-prepare`)", "",
        f"{stamp}; {machine()}; load average {open('/proc/loadavg').read().split()[0]} at the end (other jobs "
        "share the machine). Sweep profile (uniform, 128 layers), 10 GB/s, K=4; best of "
        f"{args.repeats} per point. Kernels: {compiled['backend']} (plain: PIPESIM_NO_JIT=1).", "",
        "*prepare*: a fresh schedule per call (the registry builds it, then `lower`); *schedule kept*: a "
        "`Reuse` keeps the schedule and the order facts it derives (versions, inputs, sends) between calls, "
        "as a sweep's points share them. *Memory kept*: fresh, with glibc keeping freed memory "
        "(MALLOC_TRIM_THRESHOLD_ and MALLOC_MMAP_THRESHOLD_ = 256 MiB): without it every point faults its "
        "columns' pages in afresh. prepare() runs no compiled kernel (numpy only), so its compiled and plain "
        "columns differ by noise alone; the engine's do not. *simulate_plan*: the whole point (prepare, "
        "analytic engine, metrics) as a sweep runs it. Times are wall-clock, best of the repeats; *CPU* is the "
        "process's CPU time (less sensitive to other jobs).", "",
        *table(compiled, plain, kept, baseline),
    ]
    if baseline:
        lines += ["", f"Baseline: the tree {args.baseline}, {args.rounds} rounds alternating with this tree's "
                  "prepare and schedule-kept children (best of all rounds on each side); *ratio*: this tree over "
                  "the baseline."]
    section = "\n".join(lines)
    print(section)
    if args.no_write:
        return
    write_section("prepare", section)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
