"""prepare() per point: columnar schedules against the Op path, compiled and plain; writes its RESULTS.md section.

Each configuration runs in a child process (the kernels compile, or not, at import): with numba,
with PIPESIM_NO_JIT=1, and with glibc told to keep freed memory (so that a point reuses the
pages of the one before instead of faulting fresh ones in). Inside a child the two paths are
timed alternately, point after point, so that load from other jobs falls on both alike.
``--baseline TREE`` adds prepare() of another source tree (e.g. /work/main) in its own child.
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


def child(repeats: int, both: bool) -> dict[str, Any]:
    """Best-of-``repeats`` seconds of prepare() (columnar and, with ``both``, the Op path) and of
    the analytic engine, per point."""
    from pipesim import jit
    from pipesim.engine.analytic import run_analytic
    from pipesim.simulation import prepare, simulate_plan

    rows = []
    cases = [("2bw", p, m) for p, m in SIZES] + [(name, 64, 256) for name in OTHERS]
    for name, p, m in cases:
        profile, topology, plan = point(name, p, m)
        program = prepare(profile, topology, plan)  # warm-up (and compilation)
        run_analytic(program)
        best: dict[str, float] = {}
        for _ in range(repeats):
            ways = {"columnar": lambda: prepare(profile, topology, plan)}
            if both:
                ways["op"] = lambda: prepare(profile, topology, plan, columnar=False)
            for way, run in ways.items():
                started, cpu = time.perf_counter(), time.process_time()
                program = run()
                elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
                best[way] = min(best.get(way, elapsed), elapsed)
                best[way + "_cpu"] = min(best.get(way + "_cpu", cpu), cpu)
            started = time.perf_counter()
            run_analytic(program)
            best["engine"] = min(best.get("engine", 1e9), time.perf_counter() - started)
            del program
        for _ in range(max(1, repeats // 3)):  # the whole point, as a sweep runs it
            started = time.perf_counter()
            simulate_plan(profile, topology, plan, engine="auto")
            best["point"] = min(best.get("point", 1e9), time.perf_counter() - started)
        rows.append({"schedule": name, "p": p, "m": m, "ops": int(prepare(profile, topology, plan).ops.num_ops),
                     **best})
    import pipesim

    return {"backend": jit.backend(), "source": str(Path(pipesim.__file__).parent), "rows": rows}


def run_child(tree: Path, env: dict[str, str], repeats: int, both: bool) -> dict[str, Any]:
    """``child`` in a fresh interpreter on the pipesim of ``tree``."""
    command = [sys.executable, __file__, "--child", "--repeats", str(repeats)] + (["--both"] if both else [])
    merged = {**os.environ, **env, "PYTHONPATH": str(tree)}
    done = subprocess.run(command, env=merged, capture_output=True, text=True, check=True, cwd=tree)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def table(compiled: dict[str, Any], plain: dict[str, Any], kept: dict[str, Any],
          baseline: dict[str, Any] | None) -> list[str]:
    head = "| schedule | p | m | ops | Op path ms | columnar ms | speed-up | columnar CPU ms | columnar, plain ms | " \
           "columnar, memory kept ms | analytic engine ms | engine, plain ms | prepare / engine | " \
           "simulate_plan ms | simulate_plan, memory kept ms |"
    lines = [head + (" main's prepare ms |" if baseline else ""), "|" + "---|" * (15 + bool(baseline))]
    for index, row in enumerate(compiled["rows"]):
        plain_row, kept_row = plain["rows"][index], kept["rows"][index]
        cells = [row["schedule"], row["p"], row["m"], f"{row['ops']:,}", f"{row['op'] * 1e3:.1f}",
                 f"{row['columnar'] * 1e3:.2f}", f"{row['op'] / row['columnar']:.0f}x",
                 f"{row['columnar_cpu'] * 1e3:.2f}",
                 f"{plain_row['columnar'] * 1e3:.2f}", f"{kept_row['columnar'] * 1e3:.2f}",
                 f"{row['engine'] * 1e3:.1f}", f"{plain_row['engine'] * 1e3:.1f}",
                 f"{row['columnar'] / row['engine']:.2f}", f"{row['point'] * 1e3:.1f}",
                 f"{kept_row['point'] * 1e3:.1f}"]
        if baseline:
            cells.append(f"{baseline['rows'][index]['columnar'] * 1e3:.1f}")
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--both", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=15, help="timed repeats per point (best of)")
    parser.add_argument("--baseline", type=Path, default=None, help="another source tree whose prepare() to time")
    parser.add_argument("--no-write", action="store_true", help="print the section instead of writing RESULTS.md")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.repeats, args.both)))
        return
    compiled = run_child(ROOT, {}, args.repeats, both=True)
    plain = run_child(ROOT, {"PIPESIM_NO_JIT": "1"}, args.repeats, both=False)
    kept = run_child(ROOT, KEEP_MEMORY, args.repeats, both=False)
    baseline = run_child(args.baseline.resolve(), {}, max(3, args.repeats // 3), both=False) if args.baseline else None
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from results_file import RESULTS, machine, write_section

    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    lines = [
        "## prepare(): columnar schedules (`make bench-prepare`)", "",
        f"{stamp}; {machine()}; load average {open('/proc/loadavg').read().split()[0]} at the end (other jobs "
        "share the machine). Sweep profile (uniform, 128 layers), 10 GB/s, K=4; best of "
        f"{args.repeats} per point. Kernels: {compiled['backend']} (plain: PIPESIM_NO_JIT=1).", "",
        "Op path: `prepare(..., columnar=False)`, one `Op` object per op, then lowering (as before this "
        "change); columnar: `schedule.columnar` + `lower_columnar`, the default for gpipe, 1f1b, pipedream, 2bw "
        "and pipemare; both timed alternately in one process, so the speed-up is a same-run ratio. *Memory "
        "kept*: the same with glibc keeping freed memory (MALLOC_TRIM_THRESHOLD_ and MALLOC_MMAP_THRESHOLD_ "
        "= 256 MiB): without it every point faults its columns' pages in afresh (13.4 MiB, 3,430 page faults, "
        "per prepare() at 2bw p=64 m=256). prepare() runs no compiled kernel (numpy only, the same code with "
        "and without numba), so its compiled and plain columns differ by noise alone; the engine's do not. "
        "*simulate_plan*: the whole point (prepare, analytic engine, metrics) as a sweep runs it. Times are "
        "wall-clock, best of the repeats; *CPU* is the process's CPU time (less sensitive to other jobs).", "",
        *table(compiled, plain, kept, baseline),
    ]
    if baseline:
        lines += ["", f"main's prepare: the tree {args.baseline} in its own process (not interleaved)."]
    section = "\n".join(lines)
    print(section)
    if args.no_write:
        return
    write_section("prepare", section)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
