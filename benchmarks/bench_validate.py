"""Prediction against real runs: profile, simulate and run the five schedules, repeatedly, into RESULTS.md.

Each round measures the links once, then for every schedule a fresh profile (with its per-op
overheads; right before the runs, so that a machine whose load drifts is measured in the same
conditions as the runs it predicts), simulates once and runs it for real ``--runs`` times; a
run's error is the relative difference of the steady-state iteration times. Rounds repeat the
whole measurement, so the figures include the spread of profiling too. Usage::

    python benchmarks/bench_validate.py [--rounds 3] [--runs 3] [--quick] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_file import write_section  # noqa: E402
from pipesim.harness.config import ModelSpec  # noqa: E402
from pipesim.harness.linkbench import measure_links  # noqa: E402
from pipesim.harness.profiler import Timing, profile_model  # noqa: E402
from pipesim.harness.validate import validate_schedule  # noqa: E402
from pipesim.schedule.registry import SCHEDULES  # noqa: E402


@dataclass(frozen=True)
class Case:
    """One model and pipeline shape to validate."""

    label: str
    spec: ModelSpec
    microbatch_size: int
    num_stages: int = 2
    num_microbatches: int = 8
    num_minibatches: int = 8


CASES = [
    Case("MLP 8 x 512, microbatch 64", ModelSpec("mlp", depth=8, width=512), 64),
    Case("transformer 4 blocks of 128 (64 tokens, 4 heads), microbatch 8",
         ModelSpec("transformer", depth=4, width=128, seq_len=64, heads=4), 8),
]


@dataclass
class Tally:
    """Per schedule, everything measured over the rounds."""

    errors: list[float] = field(default_factory=list)
    predicted_s: list[float] = field(default_factory=list)
    measured_s: list[float] = field(default_factory=list)
    versions_ok: int = 0
    versions_total: int = 0
    ops_compared: int = 0
    memory_errors: list[float] = field(default_factory=list)
    utilization_errors: list[float] = field(default_factory=list)
    cpu_share: list[float] = field(default_factory=list)
    replay_errors: list[float] = field(default_factory=list)


def machine() -> str:
    """nproc and the head of lscpu, on one line."""
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines()
        model = next((line.split(":", 1)[1].strip() for line in lscpu if line.startswith("Model name")), "?")
    except OSError:
        model = platform.processor() or "?"
    return f"{model}, nproc {os.cpu_count()}"


def load() -> str:
    """The load averages, formatted."""
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def commit() -> str:
    """The current commit, short."""
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or "?"


def run_case(case: Case, schedules: list[str], rounds: int, runs: int) -> tuple[dict[str, Tally], list[str]]:
    """Measure ``case`` for every schedule; return the tallies and one line per round about its profile."""
    tallies = {name: Tally() for name in schedules}
    notes = []
    for round_index in range(rounds):
        started = time.perf_counter()
        timing = Timing(repeats=30, processes=case.num_stages)
        largest = int(max(layer.activation_bytes for layer in profile_model(
            case.spec, case.microbatch_size, timing=Timing(repeats=1, processes=1), calibrate=False).layers))
        topology, fits = measure_links(case.num_stages, max_bytes=max(4, largest))
        notes.append(f"round {round_index + 1}: link {1e6 * fits[0].latency_s:.0f} us + bytes / "
                     f"{fits[0].bandwidth_bytes_per_s / 1e9:.2f} GB/s; load {load()}")
        for name in schedules:
            profile = profile_model(case.spec, case.microbatch_size, timing=timing)
            notes.append(f"round {round_index + 1}, {name}: per-op overheads F "
                         f"{1e6 * (profile.forward_overhead_s or 0):.0f} us, B {1e6 * (profile.backward_overhead_s or 0):.0f}"
                         f" us, U {1e6 * (profile.update_overhead_s or 0):.0f} us")
            comparison = validate_schedule(
                profile, topology, case.spec, schedule=name, num_stages=case.num_stages,
                num_microbatches=case.num_microbatches, num_minibatches=case.num_minibatches, repeats=runs)
            report = comparison.to_dict()
            tally = tallies[name]
            tally.errors += report["iteration_time_errors_runs"]
            tally.predicted_s.append(report["predicted"]["iteration_time_s"])
            tally.measured_s += report["measured"]["iteration_time_s_runs"]
            tally.versions_ok += sum(check.matches for check in comparison.versions)
            tally.versions_total += len(comparison.versions)
            tally.ops_compared += report["version_ops_compared"]
            tally.memory_errors += [abs(e) for e in report["peak_memory_error"]]
            tally.utilization_errors += [abs(e) for e in report["utilization_error"]]
            tally.replay_errors += [abs(e) for e in report["replay_error_runs"]]
            tally.cpu_share += [s for m in comparison.cpu_shares for s in m if s is not None]
            print(f"  {case.label} round {round_index + 1} {name}: errors "
                  + ", ".join(f"{e:+.1%}" for e in report["iteration_time_errors_runs"]), flush=True)
        print(f"{case.label}: round {round_index + 1} took {time.perf_counter() - started:.0f} s", flush=True)
    return tallies, notes


def table(tallies: dict[str, Tally]) -> list[str]:
    """The per-schedule rows of the results table."""
    rows = ["| schedule | predicted ms | measured ms (median) | median abs error | worst abs error | "
            "runs | replay error (median) | versions exact | peak memory error | utilization error (max) | "
            "rank CPU share |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, t in tallies.items():
        errors = [abs(e) for e in t.errors]
        rows.append(
            f"| {name} | {1e3 * statistics.median(t.predicted_s):.2f} | {1e3 * statistics.median(t.measured_s):.2f} "
            f"| {statistics.median(errors):.1%} | {max(errors):.1%} | {len(errors)} "
            f"| {statistics.median(t.replay_errors):.1%} "
            f"| {t.versions_ok}/{t.versions_total} runs ({t.ops_compared} ops) "
            f"| {max(t.memory_errors):.2%} | {max(t.utilization_errors):.1%} "
            f"| {statistics.median(t.cpu_share):.2f} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write its section of RESULTS.md."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3, help="fresh profile + link benchmark per round")
    parser.add_argument("--runs", type=int, default=3, help="real runs per schedule per round")
    parser.add_argument("--quick", action="store_true", help="one round, one run, the first case only")
    parser.add_argument("--no-write", action="store_true", help="print, do not write RESULTS.md")
    args = parser.parse_args(argv)
    rounds, runs, cases = (1, 1, CASES[:1]) if args.quick else (args.rounds, args.runs, CASES)
    schedules = list(SCHEDULES)
    load_start, started = load(), time.perf_counter()
    lines = [
        "## Prediction against real runs (issue 6, the torch harness)",
        "",
        "Written by `make bench-validate` (benchmarks/bench_validate.py).",
        "",
        f"- date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; commit {commit()}",
        f"- machine: {machine()}; load average at start {load_start}",
        f"- torch {__import__('torch').__version__}, gloo, 1 torch thread per rank, CPU",
        f"- {rounds} rounds x {runs} runs per schedule and case; p = 2, m = 8, K = 8 (the steady-state window "
        "drops the first and the last minibatch, as `metrics.steady_window` does); a fresh profile (2 processes "
        "timing at once, mean of 30 repeats, per-op overheads calibrated) right before each schedule's runs",
        "",
    ]
    verdicts = []
    for case in cases:
        tallies, notes = run_case(case, schedules, rounds, runs)
        lines += [f"### {case.label}", "", *table(tallies), "", *[f"- {note}" for note in notes], ""]
        for name, t in tallies.items():
            errors = [abs(e) for e in t.errors]
            verdicts.append((case.label, name, statistics.median(errors), max(errors)))
    lines.append(f"- load average at end {load()}; {time.perf_counter() - started:.0f} s in all")
    met = all(median < 0.05 and worst < 0.10 for _, _, median, worst in verdicts)
    lines += ["", f"Acceptance (median < 5%, worst < 10% for every schedule): {'met' if met else 'NOT met'} in this run."]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section("validate", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
