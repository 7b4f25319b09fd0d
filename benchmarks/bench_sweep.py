"""Sweep benchmark: the 10,080-point acceptance sweep of issue 7, measured or projected.

Usage: python benchmarks/bench_sweep.py [--full] [--sample N] [--workers W] [--baseline TREE [--label L]] [--no-write]
       python benchmarks/bench_sweep.py --scaling 1,2 [--every N] [--repeats R] [--budget S] [--out FILE.md]
                                        [--no-write]
(``make bench-sweep`` projects; ``make bench-sweep-full`` runs all 10,080 points, a few minutes.)

Measurements, each quoted against a baseline taken in the same run (the machines are shared and
noisy), with the jit backend (pipesim.jit.backend()), date and machine:

1. Where a point's time goes, at three sizes: building and lowering the schedule, the engine
   (analytic where available, else DES), metrics, and (not part of a sweep) validation.
2. The baseline: a systematic sample of the sweep's groups of points that share their work
   (``pipesim.sweep.points.SHARED_WORK``) simulated serially in this process, phase by phase
   (the sweep's own row work included), with reuse as a sweep runs them and, alternated with
   it, every point from scratch; projected to all points on W workers at perfect scaling.
3. ``--full``: all 10,080 points through ``run_sweep`` on an embedded cluster of W workers: wall
   time, points/s, and the wall split into the phases of 2 (scaled from the sample) and the
   rest (cluster start, Dask, transfers, chunk writes and the merge, imbalance).
   Without ``--full``: Dask's overhead on the slice p <= 16 (2,400 points) through ``run_sweep``
   against the same points simulated serially in this process.
4. ``--baseline TREE`` (a source tree of another commit: ``git archive COMMIT | tar -x -C TREE``):
   this tree against it in one run, asked alternately (``sweep_ab.py``): a sample of the sweep
   simulated serially (CPU seconds) and the whole sweep through ``run_sweep`` on 2 workers.

Results go to benchmarks/RESULTS.md, in its ``sweep`` section (benchmarks/results_file.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipesim import jit  # noqa: E402
from pipesim.engine.analytic import analytic_unsupported, run_analytic  # noqa: E402
from pipesim.engine.des import run_des  # noqa: E402
from pipesim.errors import PipesimError  # noqa: E402
from pipesim.metrics import compute_metrics, stage_staleness  # noqa: E402
from pipesim.reuse import Reuse  # noqa: E402
from pipesim.schedule.validate import validate  # noqa: E402
from pipesim.simulation import make_plan, prepare  # noqa: E402
from pipesim.spec.topology import Topology  # noqa: E402
from pipesim.sweep import PointRunner, Resolved, load_spec, metrics_row, parse_spec, run_sweep  # noqa: E402
from pipesim.sweep.points import SHARED_WORK, shared_work_order, sweep_kernels  # noqa: E402

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
    lines = ["| p | m | compute ops | engine | build + lower s | engine s | metrics s | (validate s, not run) | "
             "metrics, plain-Python kernels s (baseline) |", "|---|---|---|---|---|---|---|---|---|"]
    for p, m in ((8, 32), (32, 128), (64, 256)):
        plan = make_plan(profile, schedule="2bw", num_stages=p, num_microbatches=m, num_minibatches=4)
        topology = Topology.uniform(num_devices=p, bandwidth="10GB/s", latency="5us")
        marks = [time.perf_counter()]
        program = prepare(profile, topology, plan)
        marks.append(time.perf_counter())
        trace = engine(program)
        marks.append(time.perf_counter())
        metrics = compute_metrics(trace, compiled=True)
        marks.append(time.perf_counter())
        validate(program.schedule)
        marks.append(time.perf_counter())
        compute_metrics(trace, compiled=False)
        marks.append(time.perf_counter())
        phases = " | ".join(f"{b - a:.3f}" for a, b in zip(marks, marks[1:], strict=False))
        lines.append(f"| {p} | {m} | {metrics.num_ops} | {metrics.engine} | {phases} |")
        print(lines[-1], flush=True)
    return lines


# What profiling found; the runs above measure the code as it is now.
FINDINGS = (
    "Why a point costs what it does (2026-11-26, against 6f4fbda, the 504-point sample of `--baseline`, CPU "
    "seconds, both trees in one session, each phase's time summed over the sample in worker processes asked "
    "alternately 6 times). Before the last changes of the day the sample took 1.09x (fastest) to 1.17x "
    "(median) of 6f4fbda's; build + lower is now 0.90-0.95x (the 1F1B block formula no longer writes a "
    "previous-send column that no engine read), the metrics 0.98x (the levels pass adds one category per "
    "event and checks the time order in the same pass), and the engine 1.2x, of which the memory events "
    "1.25x: recomputation's working bytes (issue 18; 6f4fbda did not model them) add an event at every B's "
    "start, 25% more events on those points (164k against 131k at pipedream p=32, m=256, K=4), and a second "
    "sort (the B and I ops by start, 0.11 s of the sample); the version events and the kernel's integer "
    "structure are built once per schedule, which a sweep's 4 points (2 bandwidths x 2 recomputation "
    "settings) share, where 6f4fbda's kernel derived them inside each run. In one process on one point the "
    "kernels are at or below 6f4fbda's: solve with its state 4.9 against 5.5 ms and memory events 5.7 "
    "against 7.5 ms at pipedream p=61, m=427, K=4 without recomputation; prepare 0.63-0.64 against 0.67-0.70 "
    "ms at 1F1B p=32, m=256. The machine's own drift between runs is of the size of these gaps (the same "
    "sample read 3.5-4.8 s for 6f4fbda within the hour), so each figure above is a ratio within one run. "
    "The malloc thresholds of the sweep's Dask workers (`MALLOC_TRIM_THRESHOLD_` and `MALLOC_MMAP_THRESHOLD_` "
    "at 256 MiB, `pipesim.allocator.ENVIRONMENT`) are on for both trees: without them every point's freed "
    "columns go back to the OS and are faulted in again. "
    "Against the merge base of issue 17's work (eb4a112), all 10,080 points serially in one process: 69.5 s "
    "against 102.7 s of CPU time, every row identical (a hash over the rows). "
    "The progress line's time left (`sweep.local.WorkDone`): on one run of this sweep (points then run in "
    "shared-work order), at 13%, 24%, 48%, 63% and 78% of its wall time the points done held 2%, 14%, 36%, 53% "
    "and 74% of the sweep's ops (p x m x K) and 26%, 51%, 71%, 81% and 90% of its points; weighing each point "
    "by its ops plus 10,000 for its own overhead gave 9%, 24%, 46%, 61% and 78%. Since 2026-11-28 a point "
    "weighs its schedule's op count plus 12,500 (`sweep.batches.point_cost`, a fit of 1.2 ms + 0.1 us per op "
    "to every point's CPU time, in one process: see the section on the serial part)."
)

PHASES = ("plan + row", "build + lower", "engine", "metrics")


def sample_groups(points: list[dict[str, Any]], num_points: int) -> list[dict[str, Any]]:
    """About ``num_points`` points: whole groups of points that share their work (equal in
    ``SHARED_WORK``: here the 2 bandwidths x 2 recomputation settings), every k-th group in
    the sweep's order (by p, then schedule and m), in the order a sweep runs them. A systematic
    sample covers p evenly: a point's cost grows with p * m, so a random one of a few dozen
    groups strays by tens of percent (one run drew a sample 1.5x the sweep's mean)."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for point in points:
        groups.setdefault(tuple(point[axis] for axis in SHARED_WORK), []).append(point)
    size = max(1, len(points) // len(groups))
    keys = [key for _, key in sorted((tuple((type(v).__name__, v) for v in key), key) for key in groups)]
    step = max(1, len(keys) // max(1, num_points // size))
    return shared_work_order([point for key in keys[step // 2::step] for point in groups[key]])


def phase_seconds(runner: PointRunner, points: list[dict[str, Any]], reuse: Reuse | None) -> dict[str, float]:
    """Seconds per phase to simulate ``points`` serially, as PointRunner does each point: the
    plan and the row (the sweep's own work), building and lowering, the engine, the metrics;
    with ``reuse`` (as a sweep runs) or without (every point from scratch)."""
    spent = dict.fromkeys(PHASES, 0.0)
    for point in points:
        marks = [time.perf_counter()]
        label, profile = runner.resolved.profiles[point["profile"]]
        row = {column: point[column] for column in ("point", "num_stages", "schedule")}
        try:
            plan = make_plan(profile, schedule=point["schedule"], num_stages=point["num_stages"],
                             num_microbatches=point["num_microbatches"], num_minibatches=point["num_minibatches"],
                             recompute=point["recompute"])
            topology = runner._topology(point)
            marks.append(time.perf_counter())
            program = prepare(profile, topology, plan, reuse=reuse)
            marks.append(time.perf_counter())
            compiled = jit.use_compiled(program.ops.num_ops, runner.kernels)  # as the sweep's PointRunner
            trace = (run_analytic(program, compiled=compiled) if analytic_unsupported(program) is None
                     else run_des(program, compiled=compiled))
            marks.append(time.perf_counter())
            known = None if reuse is None else reuse.staleness(
                program.schedule, lambda: stage_staleness(trace, compiled=compiled))
            metrics = compute_metrics(trace, staleness=known, compiled=compiled)
            marks.append(time.perf_counter())
            row.update(metrics_row(metrics, plan.partition, min(d.memory_bytes for d in topology.devices)))
        except PipesimError as exc:
            row["error"] = str(exc)
            marks += [marks[-1]] * (5 - len(marks))
        marks.append(time.perf_counter())
        spent["plan + row"] += (marks[1] - marks[0]) + (marks[5] - marks[4])
        for index, phase in enumerate(PHASES[1:], start=1):
            spent[phase] += marks[index + 1] - marks[index]
    return spent


def serial_seconds(runner: PointRunner, points: list[dict[str, object]]) -> float:
    """Seconds to simulate ``points`` in this process."""
    started = time.perf_counter()
    runner.run_batch(points)
    return time.perf_counter() - started



def hundred_points(spec: Any) -> str:
    """The 100 points of the spec at p=2, m <= 10, through run_sweep and through the whole CLI
    (a fresh process: imports, spec, sweep, table), each the best of 3."""
    import subprocess

    import yaml

    fields = spec.model_dump(by_alias=True, exclude_defaults=True)
    small = parse_spec({**fields, "where": f"({spec.where}) and stages == 2 and microbatches <= 10"})
    assert len(Resolved(small).points()) == 100
    walls, wheres, processes = [], set(), []
    with tempfile.TemporaryDirectory() as folder:
        spec_file = Path(folder) / "hundred.yaml"
        spec_file.write_text(yaml.safe_dump(small.model_dump(mode="json", by_alias=True, exclude_defaults=True)))
        for attempt in range(3):
            summary = run_sweep(small, Path(folder) / f"api-{attempt}.parquet", workers=2)
            walls.append(summary.wall_s)
            wheres.add(summary.where)
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "pipesim", "sweep", str(spec_file), "--out",
                            str(Path(folder) / f"cli-{attempt}.parquet"), "--workers", "2"], check=True,
                           capture_output=True, cwd=ROOT)
            processes.append(time.perf_counter() - started)
    return (f"100 points (the spec at p=2, m <= 10; 2 workers allowed): `run_sweep` {min(walls):.2f} s end to end "
            f"({', '.join(sorted(wheres))}), the whole `pipesim sweep` process {min(processes):.2f} s (best of 3 "
            "each; target: under 2 s).")


def against_baseline(baseline: Path, label: str) -> list[str]:
    """This tree against ``baseline`` in one run (``sweep_ab.py``): a table of both sides' times."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from sweep_ab import REPEATS, rows

    from sweep_ab import same_tables

    with tempfile.TemporaryDirectory() as keep:
        found = rows(baseline, ROOT, every=20, keep=keep)
        count, same = same_tables(keep)
    lines = [f"Against {label}, in the same run (`bench_sweep.py --baseline`, `benchmarks/sweep_ab.py`): each tree "
             "in its own worker process, the steps asked of both alternately, the fastest of "
             f"{REPEATS['serial']} (serial) and {REPEATS['run_sweep']} (run_sweep) runs per side kept. `serial`: "
             "every 20th group of points that share their work, simulated one after another in the worker "
             "(CPU seconds, with the malloc thresholds of the sweep's workers); `run_sweep`: all points on 2 "
             "workers (wall seconds).", "", "| points | step | baseline s | this tree s | this / baseline |",
             "|---|---|---|---|---|"]
    lines += [f"| {row['point']} | {row['step']} | {row['baseline_s']:.2f} | {row['candidate_s']:.2f} | "
              f"{row['candidate_s'] / row['baseline_s']:.2f} |" for row in found]
    lines += ["", f"The {count} tables of the run_sweep steps, both trees: {'all equal' if same else 'NOT all equal'} "
              "(pandas `equals`)."]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="run all 10,080 points on Dask instead of projecting")
    parser.add_argument("--sample", type=int, default=160, help="points sampled for the projection")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--baseline", type=Path, help="source tree of a commit to compare with, in the same run")
    parser.add_argument("--label", default="", help="what the baseline is (e.g. its commit)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    parser.add_argument("--scaling", help="worker counts, e.g. 2,14: the serial part by phase, alternated "
                        "(benchmarks/sweep_scaling.py); only that")
    parser.add_argument("--every", type=int, default=1, help="with --scaling: only the stage counts divisible by N")
    parser.add_argument("--repeats", type=int, default=2, help="with --scaling: runs per worker count")
    parser.add_argument("--budget", type=float, help="with --scaling: seconds; the counts run in the order given, "
                        "a run predicted to end past the budget is skipped")
    parser.add_argument("--out", type=Path, help="with --scaling: also write the report to this file, and its "
                        "data (every run's phases) beside it as .json")
    args = parser.parse_args()
    if args.scaling:
        scaling(args)
        return

    spec = load_spec(SPEC)
    resolved = Resolved(spec)
    points = resolved.points()
    runner = PointRunner(resolved, sweep_kernels(points, args.workers))  # the kernels the sweep itself runs
    has_analytic = analytic_available()
    print(f"jit backend: {jit.backend()}")
    print(f"{len(points)} points; analytic engine {'present' if has_analytic else 'absent (DES for every point)'}")
    lines = [f"Spec `benchmarks/sweep_10k.yaml`: {len(points):,} points (p 2..64, m = p..8p in steps of p, five "
             f"schedules, two bandwidths, recomputation off/on, K=4, uniform 128 layers). Analytic engine: "
             f"{'present' if has_analytic else 'absent, so every point ran on the DES engine'}.", ""]

    print("1. one point, by phase", flush=True)
    phase_seconds(runner, points[:3], None)  # warm-up: imports, and compiled kernels loaded from numba's cache
    lines += ["Where one point's time goes (2bw, K=4). Registry schedules are not re-validated when simulated "
              "(pipesim.simulation.prepare); the validate column is what validating would add; the last column is "
              "the metrics kernels as plain Python (``compiled=False``), on the same trace:", "",
              *breakdown(resolved), ""]

    print(f"2. baseline: about {args.sample} sampled points, serially, by phase", flush=True)
    sample = sample_groups(points, args.sample)
    phase_seconds(runner, sample[:4], Reuse())  # warm-up of the kernels this path adds
    alone, spent = dict.fromkeys(PHASES, 0.0), dict.fromkeys(PHASES, 0.0)
    for _ in range(2):  # alternated, so that a change in the load falls on both
        for phase, seconds in phase_seconds(runner, sample, None).items():
            alone[phase] += seconds / 2
        for phase, seconds in phase_seconds(runner, sample, Reuse()).items():
            spent[phase] += seconds / 2
    per_point = sum(spent.values()) / len(sample)
    projected = per_point * len(points) / args.workers
    lines.append(f"Baseline, serial in this process: {len(sample)} of its points, in whole groups that share their "
                 f"work (the 2 bandwidths x 2 recomputation settings of one schedule, p and m; every k-th group by p, "
                 f"schedule and m), run as a sweep runs them, reusing orders, stage costs and staleness (`pipesim.reuse`): "
                 f"{per_point:.4f} s a point ({sum(alone.values()) / len(sample):.4f} s with every point from scratch, "
                 f"so reuse takes {sum(spent.values()) / sum(alone.values()):.2f}x the time; mean of 2 alternated "
                 f"runs each), so {len(points):,} points take about {per_point * len(points):,.0f} s on one core, "
                 f"**{projected:,.1f} s projected on {args.workers} workers** at perfect scaling "
                 f"({projected / 20:.2f}x the 20 s target).")
    print(lines[-1], flush=True)

    if args.full:
        print("3. the full sweep through run_sweep on an embedded cluster", flush=True)
        with tempfile.TemporaryDirectory() as folder:
            summary = run_sweep(spec, Path(folder) / "results.parquet", workers=args.workers)
        assert summary.num_run == len(points)
        share = {phase: seconds / len(sample) * len(points) / args.workers for phase, seconds in spent.items()}
        rest = summary.wall_s - summary.startup_s - sum(share.values())
        lines += ["", f"Full sweep, run: all {summary.num_points:,} points through `run_sweep` with {args.workers} "
                  f"workers allowed ({summary.where}: {summary.num_here} points here, the rest on an embedded "
                  f"LocalCluster of single-threaded worker processes): **{summary.wall_s:.1f} s** end to "
                  f"end, {summary.points_per_s:.1f} points/s ({summary.num_batches} batches, "
                  f"{summary.num_errors} rows with an error, 2bw with m < p); target: under 20 s "
                  f"({summary.wall_s / 20:.2f}x). Against the baseline's projection: "
                  f"{summary.wall_s / projected:.2f}x. The wall time by phase (the sample's shares scaled to all "
                  f"points over {args.workers} workers; the rest is measured minus those):", "",
                  "| phase | s of the wall | share |", "|---|---|---|",
                  f"| starting the cluster | {summary.startup_s:.1f} | {summary.startup_s / summary.wall_s:.0%} |",
                  *(f"| {phase} | {seconds:.1f} | {seconds / summary.wall_s:.0%} |" for phase, seconds in share.items()),
                  f"| the rest: Dask, transfers, chunk writes and merge, imbalance, other load | {rest:.1f} | "
                  f"{rest / summary.wall_s:.0%} |"]
        print("\n".join(lines[-9:]), flush=True)
    else:
        print("3. Dask overhead on the slice p <= 16", flush=True)
        fields = spec.model_dump(by_alias=True, exclude_defaults=True)
        small = parse_spec({**fields, "where": f"({spec.where}) and stages <= 16"})
        small_points = Resolved(small).points()
        baseline = serial_seconds(PointRunner(Resolved(small)), small_points)
        with tempfile.TemporaryDirectory() as folder:
            summary = run_sweep(small, Path(folder) / "results.parquet", workers=args.workers)
        working = summary.wall_s - summary.startup_s
        lines += ["", f"Slice p <= 16 ({len(small_points):,} points): serial in one process {baseline:.1f} s "
                  f"(baseline); `run_sweep` on {args.workers} workers {summary.wall_s:.1f} s end to end "
                  f"({baseline / summary.wall_s:.2f}x the serial speed), of which {summary.startup_s:.1f} s starting "
                  f"the cluster; the {working:.1f} s after it ({summary.num_batches} batches, chunks written and "
                  f"merged) are {baseline / working:.2f}x the serial speed. The sweep's own process (scheduler, chunk "
                  f"writes) shares the 2 cores with the workers."]
        print(lines[-1], flush=True)

    print("4. a 100-point sweep, end to end", flush=True)
    lines += ["", hundred_points(spec)]
    print(lines[-1], flush=True)

    if args.baseline:
        print(f"5. against {args.baseline}, alternately", flush=True)
        lines += ["", *against_baseline(args.baseline, args.label or str(args.baseline))]
        print("\n".join(lines[-6:]), flush=True)

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from results_file import RESULTS, machine, write_section

    lines += ["", FINDINGS]
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    target = "make bench-sweep-full" if args.full else "make bench-sweep"
    section = "\n".join([f"## Sweeps (`{target}`)", "", f"{stamp}; {machine()}; jit backend: {jit.backend()}; load "
                         f"average {open('/proc/loadavg').read().split()[0]} at the end (other jobs share the machine).",
                         "", *lines])
    if args.no_write:
        print(section)
        return
    write_section("sweep", section)
    print(f"wrote {RESULTS}")


def scaling(args: argparse.Namespace) -> None:
    """``--scaling``: the serial part of the sweep by phase at each worker count (``sweep_scaling.py``)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from results_file import machine, write_section
    from sweep_scaling import report

    counts = [int(count) for count in args.scaling.split(",")]
    load_start = open("/proc/loadavg").read().split()[0]
    lines, data = report(counts, args.every, args.repeats, args.budget)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    load_end = open("/proc/loadavg").read().split()[0]
    text = "\n".join([f"## Sweeps on W workers: the serial part (`bench_sweep.py --scaling {args.scaling}`)", "",
                      f"{stamp}; {machine()}; jit backend: {jit.backend()}; load average {load_start} at the "
                      f"start, {load_end} at the end.", "", *lines])
    print(text, flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
        meta = {"date": stamp, "machine": machine(), "jit_backend": jit.backend(), "load_average_start": load_start,
                "load_average_end": load_end, "command": sys.argv}
        args.out.with_suffix(".json").write_text(json.dumps({**meta, **data}, indent=1) + "\n")
    if not args.no_write:
        write_section("sweep-scaling", text)


if __name__ == "__main__":
    main()
