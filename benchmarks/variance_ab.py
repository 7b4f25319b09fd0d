"""Host speed drift: how much a fixed piece of work varies between 1-second windows, with no ranks running.

The quiet runs of ``make bench-validate`` stray 12-31% from their own median although every rank had
its CPU. This benchmark asks whether the machine itself drifts: one or two processes (one per core,
as the two ranks are) run a fixed unit of work over and over in 1-second windows, alternating two
workloads window by window so that a drift reaches both alike:

- *python*: a pure-Python loop (the interpreter, little memory traffic);
- *torch*: forward and backward of the bench-validate MLP's stage (4 x Linear(512)+ReLU, batch 64,
  1 torch thread), the work a rank's ops do.

For each unit it records the wall time and the thread's CPU time; for each window the machine's
steal time (/proc/stat). Two figures are compared: the scatter of units within a window, and the
spread of the windows' means. If the host ran at a steady speed, the window means would vary by
about the within-window standard deviation / sqrt(units) alone; the ratio says how far beyond that
they go. The worst deviation of the window means from their median is what identical 1-second runs
can be expected to show; the same over 0.3-second stretches of consecutive units, about one
bench-validate MLP run's steady state.

Usage: ``python benchmarks/variance_ab.py [--windows N] [--nice N] [--no-write]`` (``make bench-variance``);
writes its section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_file import machine, write_section  # noqa: E402
from benchmarks.speed_probe import mlp_stage_unit  # noqa: E402
from pipesim.harness.priority import raise_priority  # noqa: E402
from pipesim.harness.rank.process import configure_process  # noqa: E402

WORKLOADS = ("python", "torch")
WINDOW_S = 1.0
SHORT_S = 0.3  # about the steady state of one bench-validate MLP run (6 minibatches of ~55 ms)


def python_unit() -> None:
    """About 2 ms of interpreter work."""
    total = 0
    for i in range(40_000):
        total += i * i % 7
    if total < 0:  # keeps the loop's result alive
        raise AssertionError


def steal_and_total() -> tuple[int, int]:
    """The machine's steal and total jiffies so far (the aggregate ``cpu`` line of /proc/stat)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return 0, 0
    values = [int(v) for v in fields[:8]]
    return (values[7] if len(values) > 7 else 0), sum(values)


def worker(index: int, windows: int, barrier: Any, results: Any) -> None:
    """Run ``windows`` windows of each workload, alternating; put ``(index, records)``."""
    configure_process(1)
    units = {"python": python_unit, "torch": mlp_stage_unit()}
    for unit in units.values():  # warm-up
        for _ in range(20):
            unit()
    records: list[dict[str, Any]] = []
    for window in range(2 * windows):
        name = WORKLOADS[window % 2]
        unit = units[name]
        barrier.wait()
        steal0, total0 = steal_and_total()
        walls: list[float] = []
        cpus: list[float] = []
        end = time.perf_counter() + WINDOW_S
        while time.perf_counter() < end:
            wall, cpu = time.perf_counter(), time.thread_time()
            unit()
            walls.append(time.perf_counter() - wall)
            cpus.append(time.thread_time() - cpu)
        steal1, total1 = steal_and_total()
        records.append({"workload": name, "walls": walls, "cpus": cpus,
                        "steal": steal1 - steal0, "total": total1 - total0})
    results.put((index, records))


def run(processes: int, windows: int) -> list[dict[str, Any]]:
    """Every process's windows, in one list."""
    context = mp.get_context("fork")
    barrier, results = context.Barrier(processes), context.Queue()
    workers = [context.Process(target=worker, args=(i, windows, barrier, results)) for i in range(processes)]
    for process in workers:
        process.start()
    found = [results.get() for _ in workers]
    for process in workers:
        process.join()
    return [record for _, records in sorted(found) for record in records]


def chunks(times: list[float], seconds: float) -> list[list[float]]:
    """Consecutive runs of units lasting ``seconds`` together (a trailing shorter run is dropped)."""
    found: list[list[float]] = []
    current: list[float] = []
    for t in times:
        current.append(t)
        if sum(current) >= seconds:
            found.append(current)
            current = []
    return found


def summarize(records: list[dict[str, Any]], workload: str, key: str) -> dict[str, float]:
    """Within-window scatter against the spread of window means, for one workload and wall or CPU time."""
    chosen = [r for r in records if r["workload"] == workload]
    means = [statistics.fmean(r[key]) for r in chosen]
    stdevs = [statistics.stdev(r[key]) for r in chosen]
    counts = [len(r[key]) for r in chosen]
    median_mean = statistics.median(means)
    expected = statistics.median(s / n ** 0.5 for s, n in zip(stdevs, counts))
    spread = statistics.stdev(means)
    short = [statistics.fmean(chunk) for r in chosen for chunk in chunks(r[key], SHORT_S)]
    median_short = statistics.median(short)
    return {
        "unit_ms": 1e3 * median_mean,
        "worst_short": max(abs(m - median_short) for m in short) / median_short,
        "units": statistics.median(counts),
        "within_cv": statistics.median(s / m for s, m in zip(stdevs, means)),
        "between_cv": spread / statistics.fmean(means),
        "worst": max(abs(m - median_mean) for m in means) / median_mean,
        "ratio": spread / expected if expected > 0 else float("inf"),
    }


def report(results: dict[int, list[dict[str, Any]]], windows: int, nice: int, started: str) -> str:
    """The RESULTS.md section."""
    load = os.getloadavg()
    lines = [
        "## Host speed drift (`make bench-variance`)",
        "",
        f"{started}; {machine()}; "
        f"load average {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} at the end; nice {nice}.",
        "",
        "No ranks and no gloo: 1 or 2 processes (one per core) run a fixed unit of work in 1-second "
        f"windows, {windows} windows per workload, alternating python (a pure-Python loop) and torch "
        "(the bench-validate MLP stage's F+B, 1 torch thread) window by window (benchmarks/variance_ab.py). "
        "*Within*: the median over windows of the units' coefficient of variation inside a window. "
        "*Between*: the coefficient of variation of the windows' means, and their worst deviation from "
        "the median window (what identical 1-second runs would show); the same over 0.3-second stretches "
        "of consecutive units (about the steady state of one bench-validate MLP run). *Ratio*: the windows' spread over "
        "the spread that the within-window scatter alone gives (the within-window standard deviation / "
        "sqrt(units)); about 1 on a host of steady speed. Wall: perf_counter; CPU: the thread's CPU time "
        "(a slower core, or caches and memory bandwidth taken by others, show in it; being descheduled "
        "does not).",
        "",
        "| processes | workload | time | unit ms | units per window | within CV | between CV | worst window vs median | worst 0.3 s vs median | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for processes, records in sorted(results.items()):
        for workload in WORKLOADS:
            for key, label in (("walls", "wall"), ("cpus", "CPU")):
                s = summarize(records, workload, key)
                lines.append(f"| {processes} | {workload} | {label} | {s['unit_ms']:.3f} | {s['units']:.0f} | "
                             f"{100 * s['within_cv']:.1f}% | {100 * s['between_cv']:.1f}% | "
                             f"{100 * s['worst']:.1f}% | {100 * s['worst_short']:.1f}% | {s['ratio']:.1f}x |")
    steal = {p: sum(r["steal"] for r in recs) / max(1, sum(r["total"] for r in recs)) for p, recs in results.items()}
    lines += ["", "Steal time (the hypervisor running something else on this VM's CPUs), share of all CPU time "
              "during the windows: " + ", ".join(f"{p} process{'es' if p > 1 else ''} {100 * v:.2f}%"
                                                 for p, v in sorted(steal.items())) + "."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=30, help="1-second windows per workload (default 30)")
    parser.add_argument("--nice", type=int, default=0, help="nice value for every process, as validate --nice")
    parser.add_argument("--no-write", action="store_true", help="print the section, leave RESULTS.md alone")
    args = parser.parse_args(argv)
    if args.windows < 2:
        parser.error(f"--windows: {args.windows}: must be at least 2")
    raise_priority(args.nice)
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    results: dict[int, list[dict[str, Any]]] = {}
    for processes in (1, 2):
        print(f"{processes} process(es): {2 * args.windows} windows of {WINDOW_S:.0f} s ...", flush=True)
        results[processes] = run(processes, args.windows)
    text = report(results, args.windows, args.nice, started)
    print(text)
    if not args.no_write:
        write_section("variance", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
