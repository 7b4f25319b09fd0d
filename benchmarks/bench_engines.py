"""Engine speed benchmark: DES and analytic ops/s against a bare SimPy loop; writes RESULTS.md."""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import datetime as dt
import io
import json
import os
import platform
import pstats
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import simpy

from bare_simpy import bare_simpy_loop
from pipesim import Topology, jit, uniform_profile
from pipesim.engine.analytic import run_analytic
from pipesim.engine.assemble import fill_span_columns
from pipesim.engine.kernel import KernelState, solve
from pipesim.engine.des import run_des
from pipesim.engine.lowering import OpTable, Program, lower
from pipesim.engine.memory import memory_columns
from pipesim.metrics import compute_metrics
from pipesim.schedule.registry import build_schedule
from pipesim.schedule.validate import validate
from pipesim.simulation import make_plan, prepare, simulate
from pipesim.spec.stages import stage_costs

HERE = Path(__file__).resolve().parent
SIZES = ((8, 64), (32, 256), (64, 512), (128, 1024))
SCHEDULES = ("1f1b", "2bw")
DES_LIMIT_S = 60.0
# Op times and sizes: 1 ms forward, 2 ms backward, 1 MB activations over 25 Gbit/s + 5 us links.
FORWARD_S, BACKWARD_S, ACTIVATION_BYTES, PARAM_BYTES = 1e-3, 2e-3, 1e6, 4e6
BANDWIDTH, LATENCY = "25Gbit/s", "5us"


def inputs(p: int) -> tuple[Any, Topology]:
    """The uniform profile (one layer per stage) and topology every point uses."""
    profile = uniform_profile(num_layers=p, forward_s=FORWARD_S, backward_s=BACKWARD_S,
                              activation_bytes=ACTIVATION_BYTES, param_bytes=PARAM_BYTES)
    return profile, Topology.uniform(num_devices=p, bandwidth=BANDWIDTH, latency=LATENCY)


def program(schedule: str, p: int, m: int) -> Program:
    """The lowered program of one point (default K: 1 for 1f1b, 4 for 2bw)."""
    profile, topology = inputs(p)
    return prepare(profile, topology, make_plan(profile, schedule=schedule, num_stages=p, num_microbatches=m))


def fresh(prog: Program) -> Program:
    """``prog`` with a new OpTable over the same columns: nothing the last run cached on the
    table (its links, previous sends) carries over into the next timing."""
    ops = prog.ops
    table = OpTable(**{f.name: getattr(ops, f.name) for f in dataclasses.fields(OpTable)})
    return dataclasses.replace(prog, ops=table)


def time_analytic(prog: Program, budget_s: float = 1.0, most: int = 7, compiled: bool | None = None) -> float:
    """Best engine time of ``run_analytic`` (the pass and assembling the Trace), each repeat on a
    fresh table."""
    times: list[float] = []
    while len(times) < 2 or (sum(times) < budget_s and len(times) < most):
        run = fresh(prog)
        started = time.perf_counter()
        run_analytic(run, compiled=compiled)
        times.append(time.perf_counter() - started)
    return min(times)


def bare_simpy_ops_per_s(num_stages: int, ops_per_stage: int) -> float:
    """A bare SimPy loop: one process per stage, a timeout per op, nothing else."""
    env = bare_simpy_loop(num_stages, ops_per_stage)
    started = time.perf_counter()
    env.run()
    return num_stages * ops_per_stage / (time.perf_counter() - started)


def best_of(run: Any, budget_s: float = 1.0, most: int = 7) -> float:
    """Fastest wall time of ``run()`` over repeats within about ``budget_s`` (at least 2)."""
    times: list[float] = []
    while len(times) < 2 or (sum(times) < budget_s and len(times) < most):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def engine_rows() -> list[dict[str, Any]]:
    """Ops/s of both engines and of the bare SimPy loop, point by point."""
    rows = []
    des_rate: dict[str, float] = {}
    for schedule in SCHEDULES:
        for p, m in SIZES:
            prog = program(schedule, p, m)
            ops = prog.ops.num_ops
            per_stage = int(np.diff(prog.ops.rank_offsets).max())
            bare = max(bare_simpy_ops_per_s(p, per_stage) for _ in range(2))
            run_analytic(prog, compiled=True)  # numba's start-up (and compiling, unless cached) on the first point
            analytic_s = time_analytic(prog, compiled=True)
            row: dict[str, Any] = {"schedule": schedule, "p": p, "m": m, "k": prog.schedule.num_minibatches,
                                   "ops": ops, "bare_ops_per_s": bare, "analytic_s": analytic_s}
            expected_des_s = ops / des_rate[schedule] if schedule in des_rate else 0.0
            if expected_des_s > DES_LIMIT_S:
                row["des_s"] = None
            else:
                row["des_s"] = best_of(lambda prog=prog: run_des(prog, compiled=True), budget_s=2.0, most=3)
                des_rate[schedule] = ops / row["des_s"]
                bare = max(bare, bare_simpy_ops_per_s(p, per_stage))
                row["bare_ops_per_s"] = bare
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def plain_rows() -> list[dict[str, Any]]:
    """The analytic engine's time per point with numba off (PIPESIM_NO_JIT=1: the kernels as plain
    Python), in a fresh process."""
    env = {**os.environ, "PIPESIM_NO_JIT": "1"}
    done = subprocess.run([sys.executable, __file__, "--plain"], capture_output=True, text=True, check=True,
                          timeout=900, env=env)
    rows: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return rows


def plain_points() -> list[dict[str, Any]]:
    """Run by ``plain_rows`` in the PIPESIM_NO_JIT=1 process."""
    assert jit.setting_from_environment() == "never", "run with PIPESIM_NO_JIT=1"
    rows = []
    for schedule in SCHEDULES:
        for p, m in SIZES:
            prog = program(schedule, p, m)
            rows.append({"schedule": schedule, "p": p, "m": m, "backend": jit.backend(compiled=False),
                         "analytic_s": time_analytic(prog)})
    return rows


def startup_rows() -> list[dict[str, Any]]:
    """A fresh process's first ``simulate()`` with the analytic engine, 1f1b at p=8 m=64 and
    p=64 m=512: numba's start-up is paid there (the engine rows above run warm)."""
    rows = []
    for label, extra, env in (("auto", [], {}), ("kernels forced", ["--kernels"], {}),
                              ("PIPESIM_NO_JIT=1", [], {"PIPESIM_NO_JIT": "1"})):
        for p, m in ((8, 64), (64, 512)):
            started = time.perf_counter()
            done = subprocess.run([sys.executable, __file__, "--startup", str(p), str(m), *extra], capture_output=True,
                                  text=True, check=True, timeout=300, env={**os.environ, **env})
            wall = time.perf_counter() - started
            rows.append({"mode": label, "process_s": wall, **json.loads(done.stdout.strip().splitlines()[-1])})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def startup_point(p: int, m: int, kernels: bool) -> dict[str, Any]:
    """Run by ``startup_rows`` in a fresh process: the first simulate() (with ``kernels``, the
    compiled kernels from the first op on)."""
    if kernels:
        os.environ["PIPESIM_JIT"] = "always"
    profile, topology = inputs(p)
    started = time.perf_counter()
    result = simulate(profile, topology, schedule="1f1b", num_stages=p, num_microbatches=m, engine="analytic")
    return {"p": p, "m": m, "ops": result.metrics.num_ops, "simulate_s": time.perf_counter() - started,
            "engine_s": result.engine_wall_s}


def analytic_phases() -> list[dict[str, Any]]:
    """Where the compiled analytic engine's time goes, per phase, at three points (best of 7)."""
    rows = []
    for schedule, p, m in (("1f1b", 64, 512), ("1f1b", 128, 1024), ("2bw", 128, 1024)):
        prog = program(schedule, p, m)
        n = prog.ops.num_ops
        trace = run_analytic(prog, compiled=True)
        spans = {column: values.copy() for column, values in trace.spans.items()}
        remote = np.flatnonzero(prog.ops.is_remote_send)
        start, end = spans["start_s"], spans["end_s"]

        def solved(prog: Program = prog) -> None:
            state = KernelState.build(prog, prog.ops.duration_s, compiled=True)
            jit.pick(solve, True)(state.order, state.ints, state.floats)

        phases = {
            "solve_s": best_of(solved, budget_s=5.0, most=7),
            "memory_s": best_of(lambda prog=prog, start=start, end=end, n=n: memory_columns(prog, start[:n], end[:n],
                                                                                          compiled=True),
                                budget_s=5.0, most=7),
            "spans_s": best_of(lambda prog=prog, spans=spans, remote=remote: fill_span_columns(prog, spans, remote),
                               budget_s=5.0, most=7),
            "total_s": time_analytic(prog, budget_s=5.0, compiled=True),
        }
        rows.append({"schedule": schedule, "p": p, "m": m, "ops": n, **phases})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def end_to_end_rows() -> list[dict[str, Any]]:
    """``simulate()`` per point, and where its time goes: schedule, validation, lowering, engine, metrics."""
    rows = []
    for schedule, p, m in (("1f1b", 8, 64), ("2bw", 8, 64), ("1f1b", 64, 512), ("2bw", 64, 512)):
        profile, topology = inputs(p)
        total = best_of(lambda: simulate(profile, topology, schedule=schedule, num_stages=p, num_microbatches=m,
                                         engine="auto"), budget_s=3.0, most=3)
        plan = make_plan(profile, schedule=schedule, num_stages=p, num_microbatches=m)
        clock = time.perf_counter()
        built = build_schedule(schedule, p, m, num_minibatches=plan.num_minibatches)
        built_s = time.perf_counter() - clock
        clock = time.perf_counter()
        validate(built)
        validate_s = time.perf_counter() - clock
        costs = stage_costs(profile, plan, topology)
        clock = time.perf_counter()
        prog = lower(built, costs, topology, check=False)
        lower_s = time.perf_counter() - clock
        clock = time.perf_counter()
        trace = run_analytic(prog)
        engine_s = time.perf_counter() - clock
        clock = time.perf_counter()
        compute_metrics(trace)
        metrics_s = time.perf_counter() - clock
        row = {"schedule": schedule, "p": p, "m": m, "ops": prog.ops.num_ops, "simulate_s": total,
               "schedule_s": built_s, "validate_s": validate_s, "lower_s": lower_s, "engine_s": engine_s,
               "metrics_s": metrics_s}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def point(schedule: str, p: int, m: int, engine: str) -> dict[str, Any]:
    """One simulate() in this process, with its peak RSS (run in a fresh process by rss_rows)."""
    profile, topology = inputs(p)
    imported = peak_rss_mib()
    started = time.perf_counter()
    result = simulate(profile, topology, schedule=schedule, num_stages=p, num_microbatches=m, engine=engine)  # type: ignore[arg-type]
    wall = time.perf_counter() - started
    return {"schedule": schedule, "p": p, "m": m, "engine": result.metrics.engine, "ops": result.metrics.num_ops,
            "simulate_s": wall, "engine_s": result.engine_wall_s, "peak_rss_mib": peak_rss_mib(),
            "import_rss_mib": imported, "backend": jit.backend()}


def peak_rss_mib() -> float:
    """This process's peak resident memory (VmHWM: unlike ru_maxrss it does not carry the parent's
    peak across fork and exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_rows() -> list[dict[str, Any]]:
    """Peak RSS of simulating p=128, m=1024, each point in a fresh process."""
    rows = []
    for schedule in SCHEDULES:
        for engine in ("analytic", "des"):
            done = subprocess.run([sys.executable, __file__, "--point", schedule, "128", "1024", engine],
                                  capture_output=True, text=True, check=True, timeout=900)
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
    return rows


def des_profile() -> str:
    """cProfile of the DES engine on 1f1b p=32 m=256: the ten functions with most own time."""
    prog = program("1f1b", 32, 256)
    profiler = cProfile.Profile()
    profiler.enable()
    run_des(prog, compiled=True)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(10)
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls"))
    return "\n".join(lines[start - 1: start + 11]).replace(str(Path(sys.prefix)), "$VENV").replace(str(HERE.parent), ".")


def machine() -> str:
    """Date, host facts and load, for the header of RESULTS.md."""
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    model = next((line.split(":", 1)[1].strip() for line in lscpu if line.startswith("Model name")), "?")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=HERE).stdout.strip()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"- date: {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}; commit {commit or '?'}\n"
            f"- machine: {model}, nproc {os.cpu_count()}, load average at start {load} (a shared machine: "
            f"compare ratios measured in the same run, not absolute times across runs)\n"
            f"- python {platform.python_version()}, numpy {np.__version__}, simpy {simpy.__version__}; "
            f"kernels: {jit.backend()}")


def report(engines: list[dict[str, Any]], e2e: list[dict[str, Any]], rss: list[dict[str, Any]], profile: str,
           header: str, phases: list[dict[str, Any]], startup: list[dict[str, Any]]) -> str:
    """RESULTS.md: the tables and what they say against the targets."""
    from report_text import render

    return render(engines, e2e, rss, profile, header, phases, startup)


def main() -> None:
    """Run everything and write RESULTS.md (or, with --point, one RSS point as JSON)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--point", nargs=4, metavar=("SCHEDULE", "P", "M", "ENGINE"))
    parser.add_argument("--plain", action="store_true", help="time the analytic engine only (with PIPESIM_NO_JIT=1)")
    parser.add_argument("--startup", nargs=2, type=int, metavar=("P", "M"), help="one first simulate() as JSON")
    parser.add_argument("--kernels", action="store_true", help="with --startup: the compiled kernels at once")
    parser.add_argument("--out", default=str(HERE / "RESULTS.md"), help="the shared results file")
    args = parser.parse_args()
    if args.plain:
        print(json.dumps(plain_points()))
        return
    if args.startup:
        p, m = args.startup
        print(json.dumps(startup_point(p, m, kernels=args.kernels)))
        return
    if args.point:
        schedule, p, m, engine = args.point
        print(json.dumps(point(schedule, int(p), int(m), engine)))
        return
    header = machine()
    engines = engine_rows()
    for row, plain in zip(engines, plain_rows(), strict=True):
        assert (row["schedule"], row["p"], row["m"]) == (plain["schedule"], plain["p"], plain["m"])
        row["plain_s"], row["plain_backend"] = plain["analytic_s"], plain["backend"]
    phases = analytic_phases()
    startup = startup_rows()
    e2e = end_to_end_rows()
    rss = rss_rows()
    profile = des_profile()
    sys.path.insert(0, str(HERE))
    from results_file import write_section

    write_section("engines", report(engines, e2e, rss, profile, header, phases, startup), Path(args.out))
    print(f"wrote the engines section of {args.out}")


if __name__ == "__main__":
    main()
