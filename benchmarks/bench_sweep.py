"""Sweep benchmark: the 10,080-point acceptance sweep of issue 7, measured or projected.

Usage: python benchmarks/bench_sweep.py [--full] [--sample N] [--workers W] [--no-write]

Three measurements, each quoted against a baseline taken in the same run (the machines are
shared and noisy):

1. Where a point's time goes, at three sizes: building and lowering the schedule, the engine
   (analytic where available, else DES), metrics, and (not part of a sweep) validation.
2. The whole sweep through Dask (``--full``), or, by default, projected from a seeded random
   sample of its points simulated serially in this process (the baseline), divided by W.
3. Dask's overhead: the slice p <= 16 (2,400 points) through ``run_sweep`` on an embedded
   cluster of W workers against the same points simulated serially in this process.

Results go to benchmarks/RESULTS.md, in its ``sweep`` section (benchmarks/results_file.py).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipesim.metrics import compute_metrics  # noqa: E402
from pipesim.schedule.validate import validate  # noqa: E402
from pipesim.simulation import make_plan, prepare  # noqa: E402
from pipesim.spec.topology import Topology  # noqa: E402
from pipesim.sweep import PointRunner, Resolved, load_spec, parse_spec, run_sweep  # noqa: E402

SPEC = ROOT / "benchmarks" / "sweep_10k.yaml"


def analytic_available() -> bool:
    try:
        import pipesim.engine.analytic  # noqa: F401
    except ImportError:
        return False
    return True


def breakdown(resolved: Resolved) -> list[str]:
    """Seconds per phase for one point at three sizes (2bw, K=4, 10 GB/s)."""
    try:
        from pipesim.engine.analytic import run_analytic as engine
    except ImportError:
        from pipesim.engine.des import run_des as engine
    profile = resolved.profiles[0][1]
    lines = ["| p | m | compute ops | engine | build + lower s | engine s | metrics s | (validate s, not run) |",
             "|---|---|---|---|---|---|---|---|"]
    for p, m in ((8, 32), (32, 128), (64, 256)):
        plan = make_plan(profile, schedule="2bw", num_stages=p, num_microbatches=m, num_minibatches=4)
        topology = Topology.uniform(num_devices=p, bandwidth="10GB/s", latency="5us")
        marks = [time.perf_counter()]
        program = prepare(profile, topology, plan)
        marks.append(time.perf_counter())
        trace = engine(program)
        marks.append(time.perf_counter())
        metrics = compute_metrics(trace)
        marks.append(time.perf_counter())
        validate(program.schedule)
        marks.append(time.perf_counter())
        phases = " | ".join(f"{b - a:.3f}" for a, b in zip(marks, marks[1:], strict=False))
        lines.append(f"| {p} | {m} | {metrics.num_ops} | {metrics.engine} | {phases} |")
        print(lines[-1], flush=True)
    return lines


def serial_seconds(runner: PointRunner, points: list[dict[str, object]]) -> float:
    """Seconds to simulate ``points`` in this process."""
    started = time.perf_counter()
    runner.run_batch(points)
    return time.perf_counter() - started


def machine() -> str:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    model = next((line.split(":", 1)[1].strip() for line in lscpu if line.startswith("Model name")), "?")
    # Not `nproc`: it follows OMP_NUM_THREADS, which Dask sets to 1 in this process.
    nproc = len(os.sched_getaffinity(0))
    return f"nproc {nproc}, {model}, Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="run all 10,080 points on Dask instead of projecting")
    parser.add_argument("--sample", type=int, default=80, help="points sampled for the projection")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()

    spec = load_spec(SPEC)
    resolved = Resolved(spec)
    points = resolved.points()
    runner = PointRunner(resolved)
    has_analytic = analytic_available()
    print(f"{len(points)} points; analytic engine {'present' if has_analytic else 'absent (DES for every point)'}")
    lines = [f"Spec `benchmarks/sweep_10k.yaml`: {len(points):,} points (p 2..64, m = p..8p in steps of p, five "
             f"schedules, two bandwidths, recomputation off/on, K=4, uniform 128 layers). Analytic engine: "
             f"{'present' if has_analytic else 'absent, so every point ran on the DES engine'}.", ""]

    print("1. one point, by phase", flush=True)
    lines += ["Where one point's time goes (2bw, K=4). Registry schedules are not re-validated when simulated "
              "(pipesim.simulation.prepare); the last column is what validating would add:", "",
              *breakdown(resolved), ""]

    if args.full:
        print("2. the full sweep on Dask", flush=True)
        with tempfile.TemporaryDirectory() as folder:
            summary = run_sweep(spec, Path(folder) / "results.parquet", workers=args.workers)
        lines.append(f"Full sweep on an embedded cluster of {args.workers} workers: **{summary.wall_s:.1f} s** "
                     f"({summary.num_points / summary.wall_s:.1f} points/s, {summary.num_batches} batches); "
                     f"target: under 60 s.")
    else:
        print(f"2. projection from {args.sample} sampled points", flush=True)
        sample = random.Random(0).sample(points, args.sample)
        per_point = serial_seconds(runner, sample) / len(sample)
        projected = per_point * len(points) / args.workers
        lines.append(f"Full sweep, projected (not run): {len(sample)} of its points drawn at random (seed 0) took "
                     f"{per_point:.3f} s a point serially in one process, so {len(points):,} points take about "
                     f"{per_point * len(points):,.0f} s on one core, **{projected:,.0f} s on {args.workers} workers** "
                     f"at perfect scaling; target: under 60 s ({projected / 60:.0f}x over).")
    print(lines[-1], flush=True)

    print("3. Dask overhead on the slice p <= 16", flush=True)
    fields = spec.model_dump(by_alias=True, exclude_defaults=True)
    small = parse_spec({**fields, "where": f"({spec.where}) and stages <= 16"})
    small_points = Resolved(small).points()
    baseline = serial_seconds(PointRunner(Resolved(small)), small_points)
    with tempfile.TemporaryDirectory() as folder:
        summary = run_sweep(small, Path(folder) / "results.parquet", workers=args.workers)
    working = summary.wall_s - summary.startup_s
    lines += ["", f"Slice p <= 16 ({len(small_points):,} points): serial in one process {baseline:.1f} s (baseline); "
              f"`run_sweep` on {args.workers} workers {summary.wall_s:.1f} s end to end ({baseline / summary.wall_s:.2f}x "
              f"the serial speed), of which {summary.startup_s:.1f} s starting the cluster; the {working:.1f} s after it "
              f"({summary.num_batches} batches, chunks written and merged) are {baseline / working:.2f}x the serial "
              f"speed. The sweep's own process (scheduler, chunk writes) shares the 2 cores with the workers."]
    print(lines[-1], flush=True)

    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    section = "\n".join(["## Sweeps (`make bench-sweep`)", "", f"{stamp}; {machine()}; load average "
                         f"{open('/proc/loadavg').read().split()[0]} at the end (other jobs share the machine).",
                         "", *lines])
    if args.no_write:
        print(section)
        return
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from results_file import RESULTS, write_section

    write_section("sweep", section)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
