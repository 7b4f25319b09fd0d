"""Prediction against real runs: profile, calibrate, simulate and run the five schedules, repeatedly, into RESULTS.md.

Before every validated run: a fresh layer profile (per-op overheads calibrated), then a separate
calibration run of the real runtime (GPipe, m=4, K=20, same partition; see
pipesim.harness.calibration) whose steady-state op times per stage and kind are the prediction's
op times, then the validated run itself. The layer profile's own prediction is reported beside
the calibrated one. A run's error is the relative difference of the steady-state iteration
times, predicted against measured. This machine is shared: a run, or the measurement its
prediction came from, during which a rank had its core for less than ``--quiet`` of its busy time
(the trace's ``cpu_share``) ran on a loaded machine, whose load no profile can predict; such runs
are reported apart, and the benchmark tries again (up to ``--attempts`` times per run) for a
quiet one. The host's own speed drifts (``make bench-variance``): a speed probe before the profile and
after the run (benchmarks/speed_probe.py) tells the quiet runs during which it held within ``--steady``
from those during which it did not; both are reported, and the tries go on until a run is also steady.
Usage::

    python benchmarks/bench_validate.py [--runs 5] [--quiet 0.9] [--steady 0.05] [--attempts 4] [--quick] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_file import write_section  # noqa: E402
from benchmarks.speed_probe import SpeedProbe  # noqa: E402
from pipesim.harness import RunFailedError  # noqa: E402
from pipesim.harness.calibration import Calibrated, CalibrationRun, calibrate  # noqa: E402
from pipesim.harness.config import ModelSpec  # noqa: E402
from pipesim.harness.linkbench import measure_links  # noqa: E402
from pipesim.harness.process import raise_priority  # noqa: E402
from pipesim.harness.profiler import Timing, measure_profile  # noqa: E402
from pipesim.harness.validate import FreshProfiles, relative_error, validate_schedule  # noqa: E402
from pipesim.harness.variability import expected_iteration_time  # noqa: E402
from pipesim.schedule.registry import SCHEDULES  # noqa: E402
from pipesim.simulation import prepare, simulate  # noqa: E402
from pipesim.spec.profile import Profile  # noqa: E402
from pipesim.spec.topology import Topology  # noqa: E402


FIVE = ("gpipe", "1f1b", "pipedream", "2bw", "pipemare")


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
    Case("MLP, 8 layers of 512, microbatch 64", ModelSpec("mlp", depth=8, width=512), 64),
    Case("transformer, 4 blocks of 128 (64 tokens, 4 heads), microbatch 8",
         ModelSpec("transformer", depth=4, width=128, seq_len=64, heads=4), 8),
]


@dataclass
class Tally:
    """Per schedule, everything measured."""

    quiet: list[float] = field(default_factory=list)
    mean_ops_quiet: list[float] = field(default_factory=list)
    loaded: list[float] = field(default_factory=list)
    other_quiet: list[float] = field(default_factory=list)
    layer_quiet: list[float] = field(default_factory=list)
    layer_loaded: list[float] = field(default_factory=list)
    op_ratios: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)
    predicted_s: list[float] = field(default_factory=list)
    measured_s: list[float] = field(default_factory=list)
    replay: list[float] = field(default_factory=list)
    versions_ok: int = 0
    runs: int = 0
    ops_compared: int = 0
    memory_errors: list[float] = field(default_factory=list)
    utilization_errors: list[float] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    drift_quiet: list[float] = field(default_factory=list)
    steady: list[float] = field(default_factory=list)
    drifted: list[float] = field(default_factory=list)


def machine() -> str:
    """The CPU model and nproc."""
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines()
    model = next((line.split(":", 1)[1].strip() for line in lscpu if line.startswith("Model name")), "?")
    return f"{model}, nproc {os.cpu_count()}"


def load() -> str:
    """The load averages."""
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def commit() -> str:
    """The current commit, short."""
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or "?"


def idle_fraction(seconds: float = 1.0) -> float:
    """The fraction of the machine's CPU time that was idle over the next ``seconds`` (from /proc/stat)."""

    def sample() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return fields[3] + fields[4], sum(fields[:8])

    idle0, total0 = sample()
    time.sleep(seconds)
    idle1, total1 = sample()
    return (idle1 - idle0) / max(1, total1 - total0)


def wait_for_idle(wanted: float, patience_s: float) -> float:
    """Wait up to ``patience_s`` for a second in which the machine was at least ``wanted`` idle."""
    deadline = time.perf_counter() + patience_s
    idle = idle_fraction()
    while idle < wanted and time.perf_counter() < deadline:
        idle = idle_fraction()
    return idle


def one_run(case: Case, name: str, topology: Topology, quiet: float, tally: Tally, timing: Timing,
            calibration: CalibrationRun, other: CalibrationRun, probe: SpeedProbe, steady: float) -> bool:
    """Profile, calibrate (with ``calibration``, and with ``other`` for its own column, in turns first),
    simulate and run once, between two speed probes; add it to the tally; True when the calibration and
    the run were both quiet (the layer profile's error counts as quiet when it and the run were) and the
    host's speed held within ``steady`` from the first probe to the second."""
    source = FreshProfiles(lambda: measure_profile(case.spec, case.microbatch_size, timing=timing))
    others: list[Calibrated] = []

    def both(times: Profile, cuts: tuple[tuple[int, int], ...]) -> Calibrated:
        if tally.runs % 2:
            others.append(calibrate(times, case.spec, cuts, other))
            return calibrate(times, case.spec, cuts, calibration)
        primary = calibrate(times, case.spec, cuts, calibration)
        others.append(calibrate(times, case.spec, cuts, other))
        return primary

    before = probe.measure()
    try:
        comparison = validate_schedule(source, topology, case.spec, schedule=name, num_stages=case.num_stages,
                                       num_microbatches=case.num_microbatches, num_minibatches=case.num_minibatches,
                                       repeats=1, calibration=both)
    except RunFailedError as failure:  # a loaded machine can starve a rank past the op timeout
        tally.failed.append(str(failure))
        print(f"  {name}: {failure}", flush=True)
        return False
    drift = probe.measure() / before - 1.0
    report = comparison.to_dict()
    run = comparison.runs[0]
    error, layer_error = run.iteration_time_error, run.layer_profile_error
    assert layer_error is not None
    profile_share = run.profile_cpu_share if run.profile_cpu_share is not None else 1.0
    calibration_share = run.calibration_cpu_share if run.calibration_cpu_share is not None else 1.0
    run_share = min((s for s in run.cpu_share if s is not None), default=1.0)
    is_quiet = calibration_share >= quiet and run_share >= quiet
    (tally.quiet if is_quiet else tally.loaded).append(error)
    is_steady = abs(drift) <= steady
    if is_quiet:
        tally.drift_quiet.append(drift)
        (tally.steady if is_steady else tally.drifted).append(error)
    (tally.layer_quiet if profile_share >= quiet and run_share >= quiet else tally.layer_loaded).append(layer_error)
    other_predicted = simulate(others[0].profile, topology, schedule=name, num_stages=case.num_stages,
                               num_microbatches=case.num_microbatches, num_minibatches=case.num_minibatches,
                               partition=comparison.partition, optimizer_state_multiplier=0.0)
    other_program = prepare(others[0].profile, topology, other_predicted.plan)
    other_time, _ = expected_iteration_time(other_program, others[0].op_spread, draws=32)
    other_error = relative_error(other_time, run.measured.iteration_time_s)
    if others[0].cpu_share >= quiet and run_share >= quiet:
        tally.other_quiet.append(other_error)
    if is_quiet and run.mean_ops_iteration_time_s is not None:
        tally.mean_ops_quiet.append(relative_error(run.mean_ops_iteration_time_s, run.measured.iteration_time_s))
    if is_quiet:
        tally.predicted_s.append(report["predicted"]["iteration_time_s"])
        tally.measured_s.append(report["measured"]["iteration_time_s"])
        times = run.op_times
        for key, wall in times["measured"].items():
            cpu = times["measured_cpu"].get(key, wall)
            tally.op_ratios.setdefault(key, []).append(
                (wall / times["layer_profile"][key], wall / times["predicted"][key], wall / cpu if cpu > 0 else 1.0))
    tally.replay += [abs(e) for e in report["replay_error_runs"]]
    tally.runs += 1
    tally.versions_ok += int(comparison.versions_match)
    tally.ops_compared += report["version_ops_compared"]
    tally.memory_errors += [abs(e) for e in report["peak_memory_error"]]
    if is_quiet:
        tally.utilization_errors += [abs(e) for e in report["utilization_error"]]
    print(f"  {name}: error {error:+.1%} ({other.schedule} calibration {other_error:+.1%}, layer profile alone "
          f"{layer_error:+.1%}; CPU share: profile "
          f"{profile_share:.2f}, calibration {calibration_share:.2f}, run {run_share:.2f}; "
          f"{'quiet' if is_quiet else 'loaded'}; speed probe {drift:+.1%} after against before, "
          f"{'steady' if is_steady else 'drifted'})", flush=True)
    return is_quiet and is_steady


def run_case(case: Case, runs: int, quiet: float, attempts: int, patience_s: float, deadline: float,
             timing: Timing, calibration: CalibrationRun, other: CalibrationRun, probe: SpeedProbe,
             steady: float) -> tuple[dict[str, Tally], list[str]]:
    """Up to ``runs`` quiet and steady runs per schedule (at most ``attempts`` tries each, none after
    ``deadline``, a ``time.perf_counter`` value); the tallies and notes."""
    tallies = {name: Tally() for name in SCHEDULES if name in FIVE}
    idle = wait_for_idle(0.9, patience_s=patience_s)
    topology, fits = measure_links(case.num_stages, max_bytes=4 << 20)
    notes = [f"links: {1e6 * fits[0].latency_s:.0f} us + bytes / {fits[0].bandwidth_bytes_per_s / 1e9:.2f} GB/s "
             f"(linkbench, 4 B to 4 MB, the machine {idle:.0%} idle just before)"]
    for run_index in range(runs):
        for name, tally in tallies.items():
            for _ in range(attempts):
                if time.perf_counter() > deadline:
                    break
                wait_for_idle(0.9, patience_s=patience_s)
                if one_run(case, name, topology, quiet, tally, timing, calibration, other, probe, steady):
                    break
        print(f"{case.label}: {run_index + 1} of {runs} done, load {load()}", flush=True)
    return tallies, notes


def percent(values: list[float], how: str) -> str:
    """Median or worst absolute value as a percentage, or a dash."""
    if not values:
        return "-"
    magnitudes = [abs(v) for v in values]
    return f"{(statistics.median(magnitudes) if how == 'median' else max(magnitudes)):.1%}"


def signed_median(values: list[float]) -> str:
    """The median of signed values as a percentage, or a dash."""
    return f"{statistics.median(values):+.1%}" if values else "-"


def spread(values: list[float]) -> list[float]:
    """Each value's relative deviation from their median: the errors of the best fixed prediction
    (the noise floor of identical runs)."""
    if not values:
        return []
    middle = statistics.median(values)
    return [(value - middle) / middle for value in values]


def table(tallies: dict[str, Tally]) -> list[str]:
    """The per-schedule rows of the results table."""
    rows = ["| schedule | quiet runs | predicted ms | measured ms | median error | worst error | quiet and steady: "
            "runs, median / worst error | speed probe, after against before (quiet runs): median / worst | mean op times "
            "alone (no spread): median signed / worst error | loaded runs: "
            "median / worst error | 1F1B calibration instead: quiet runs, median / worst error "
            "| layer profile alone: quiet runs, median / worst error | measured: worst "
            "deviation from its median | replay error (median) | versions exact | peak memory error | "
            "utilization error (max) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, t in tallies.items():
        quiet_ms = (f"{1e3 * statistics.median(t.predicted_s):.2f} | {1e3 * statistics.median(t.measured_s):.2f}"
                    if t.quiet else "- | -")
        rows.append(
            f"| {name} | {len(t.quiet)} | {quiet_ms} | {percent(t.quiet, 'median')} | {percent(t.quiet, 'worst')} "
            f"| {len(t.steady)}: {percent(t.steady, 'median')} / {percent(t.steady, 'worst')} "
            f"| {percent(t.drift_quiet, 'median')} / {percent(t.drift_quiet, 'worst')} "
            f"| {signed_median(t.mean_ops_quiet)} / {percent(t.mean_ops_quiet, 'worst')} "
            f"| {len(t.loaded)}: {percent(t.loaded, 'median')} / {percent(t.loaded, 'worst')} "
            f"| {len(t.other_quiet)}: {percent(t.other_quiet, 'median')} / {percent(t.other_quiet, 'worst')} "
            f"| {len(t.layer_quiet)}: {percent(t.layer_quiet, 'median')} / {percent(t.layer_quiet, 'worst')} "
            f"| {percent(spread(t.measured_s), 'worst')} "
            f"| {percent(t.replay, 'median')} | {t.versions_ok}/{t.runs} runs ({t.ops_compared} ops) "
            f"| {max(t.memory_errors, default=0.0):.2%} | {max(t.utilization_errors, default=0.0):.1%} |")
    failures = [f"- {name}: a try failed: {reason}" for name, t in tallies.items() for reason in t.failed]
    return rows + ([""] + failures if failures else [])


def op_table(tallies: dict[str, Tally]) -> list[str]:
    """Per stage and kind, over the quiet runs of each schedule: the measured op time against the layer
    profile's and the calibration's, and its wall time against its thread CPU time (means of the ratios)."""
    keys = sorted({key for t in tallies.values() for key in t.op_ratios})
    if not keys:
        return []
    names = [name for name, t in tallies.items() if t.op_ratios]
    rows = ["Op times in the quiet runs, per stage and kind (mean over runs of the mean op in the steady state): "
            "measured / layer profile, measured / calibration run, measured wall / its thread CPU time.", "",
            "| op | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for key in keys:
        cells = []
        for name in names:
            ratios = tallies[name].op_ratios.get(key, [])
            cells.append(" / ".join(f"{statistics.fmean(r[i] for r in ratios):.2f}" for i in range(3))
                         if ratios else "-")
        rows.append(f"| {key[:-1]}{key[-1]} | " + " | ".join(cells) + " |")
    return rows + [""]


def acceptance(verdicts: list[tuple[list[float], int]]) -> tuple[bool, bool]:
    """Whether every schedule has its wanted runs, and whether, with them, every schedule's errors have a
    median under 5% and a worst under 10%."""
    enough = all(len(errors) >= wanted for errors, wanted in verdicts)
    met = enough and all(errors and statistics.median([abs(e) for e in errors]) < 0.05
                         and max(abs(e) for e in errors) < 0.10 for errors, _ in verdicts)
    return enough, met


def verdict(met: bool, enough: bool) -> str:
    """The acceptance line's verdict."""
    return "met" if met else "NOT met" + ("" if enough else " (too few runs to judge)")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write its section of RESULTS.md."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5, help="quiet and steady runs wanted per schedule and case")
    parser.add_argument("--quiet", type=float, default=0.9,
                        help="least CPU share of a quiet run and of the measurement its prediction came from")
    parser.add_argument("--attempts", type=int, default=4, help="tries per wanted run")
    parser.add_argument("--patience", type=float, default=5.0,
                        help="seconds to wait, before each try, for the machine to be 90%% idle")
    parser.add_argument("--budget", type=float, default=120.0, help="minutes after which no new try starts")
    parser.add_argument("--statistic", choices=["mean", "median"], default="mean", help="the profile's statistic")
    parser.add_argument("--repeats", type=int, default=30, help="the profile's timed repeats per layer")
    parser.add_argument("--nice", type=int, default=-20,
                        help="nice value of every process of the benchmark (0: as started; below 0 needs root)")
    parser.add_argument("--steady", type=float, default=0.05,
                        help="most change of the speed probe from before a run's measurements to after the run "
                             "for the run to count as steady")
    parser.add_argument("--quick", action="store_true", help="one run, one attempt, the first case")
    parser.add_argument("--no-write", action="store_true", help="print, do not write RESULTS.md")
    args = parser.parse_args(argv)
    runs, attempts, cases = (1, 1, CASES[:1]) if args.quick else (args.runs, args.attempts, CASES)
    calibration = CalibrationRun(statistic=args.statistic)
    other = CalibrationRun(statistic=args.statistic, schedule="1f1b")
    raise_priority(args.nice)
    load_start, started = load(), time.perf_counter()
    lines = [
        "## Prediction against real runs (issue 6, the torch harness)",
        "",
        "Written by `make bench-validate` (benchmarks/bench_validate.py).",
        "",
        f"- date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; commit {commit()}",
        f"- machine: {machine()}; load average at start {load_start}",
        f"- torch {__import__('torch').__version__}, gloo, 1 torch thread per rank, CPU; p = 2, m = 8, K = 8 "
        "(the steady-state window drops the first and the last minibatch, as `metrics.steady_window` does)",
        f"- before every validated run, measured just before it: a layer profile (2 processes timing the layers "
        f"at once, the {args.statistic} of {args.repeats} repeats, per-op overheads from a run of null layers), "
        f"then {calibration.describe()}, on the same partition; the prediction takes its op times from the "
        "calibration run (`pipesim validate --op-times calibrated`, the default); the layer profile's own "
        "prediction (`--op-times layers`) is in its own column, and so is the prediction from a second "
        f"calibration run, {other.describe()} (`--calibration-schedule 1f1b`), made just before or after the "
        "first in turns; the validated run's own times are never used; the predicted iteration time (both "
        "calibrations) is the mean over 32 seeded draws of op times with the calibration run's spread "
        "(`--spread-draws 32`, the default; pipesim.harness.variability), the mean op times' own prediction "
        "in its own column",
        f"- every process of the benchmark ran at nice {args.nice} (`--nice`; on this machine's per-session CPU "
        "groups, for the whole session), so that the other users of the shared machine take less of the two "
        "cores from the ranks",
        f"- a run is *quiet* when every rank of the run, and of the calibration run its prediction came from (of "
        f"the layer profile, for the layer profile's column), had its CPU for at least {args.quiet:.0%} of its "
        f"busy time; the others are counted apart as loaded; a quiet run is also *steady* when a speed probe "
        f"(benchmarks/speed_probe.py: the MLP stage's F+B on both cores for 0.3 s, mean thread CPU time) taken "
        f"after the run is within {args.steady:.0%} of one taken before its layer profile, i.e. the host's "
        f"speed held from the measurements the prediction came from to the run (`make bench-variance` shows "
        f"that it drifts); {runs} quiet and steady runs wanted per schedule, {attempts} "
        f"tries each, each try after waiting up to {args.patience:.0f} s for a second in which the machine was "
        "90% idle; every quiet run is in the quiet columns, steady or not",
        "- measured: worst deviation from its median: how far the quiet runs' own iteration times stray from "
        "their median, i.e. the worst error of the best fixed prediction (the noise floor of identical runs)",
        "- replay error: the engine re-run with each op lasting as long as it did in the run, against the run "
        "(the engine's model of order and communication alone)",
        "",
        "What the calibrated prediction models: each stage's F, B and U as long as the mean of that stage's ops "
        "of that kind, and varying independently by their standard deviation (the expectation over 32 draws), "
        "in the steady state of a separate GPipe run of the real runtime (same model, partition, "
        "microbatch size, threads, gloo), so that the peer rank computing, gloo's copying threads and the cache "
        "state of a running pipeline are in the op times; transfers as latency + bytes / bandwidth fitted by "
        "linkbench; the schedule's order, dependencies and weight policy from the Schedule IR. Nothing is fitted "
        "to the validated runs. Not modelled: other processes taking the CPU or the memory bandwidth (the reason "
        "runs are split into quiet and loaded), and differences between the op times of GPipe's order and the "
        "other schedules' orders.",
        "",
    ]
    verdicts = []
    steady_verdicts = []
    everything: list[Tally] = []
    probe = SpeedProbe()
    for case in cases:
        print(case.label, flush=True)
        timing = Timing(repeats=args.repeats, statistic=args.statistic, processes=case.num_stages)
        tallies, notes = run_case(case, runs, args.quiet, attempts, args.patience,
                                  started + 60 * args.budget * (cases.index(case) + 1) / len(cases), timing,
                                  calibration, other, probe, args.steady)
        lines += [f"### {case.label}", "", *table(tallies), "", *op_table(tallies),
                  *[f"- {note}" for note in notes], ""]
        verdicts += [(t.quiet, runs) for t in tallies.values()]
        steady_verdicts += [(t.steady, runs) for t in tallies.values()]
        everything += list(tallies.values())
    probe.close()
    elapsed = time.perf_counter() - started
    lines.append(f"- load average at end {load()}; {elapsed / 60:.0f} min in all")
    enough, met = acceptance(verdicts)
    steady_enough, steady_met = acceptance(steady_verdicts)
    steady_all = [abs(e) for t in everything for e in t.steady]
    drifted_all = [abs(e) for t in everything for e in t.drifted]
    drift_all = [abs(e) for t in everything for e in t.drift_quiet]
    quiet_all = [abs(e) for t in everything for e in t.quiet]
    layer_all = [abs(e) for t in everything for e in t.layer_quiet]
    floor_all = [abs(e) for t in everything for e in spread(t.measured_s)]
    signed = [e for t in everything for e in t.quiet]
    layer_signed = [e for t in everything for e in t.layer_quiet]
    other_all = [abs(e) for t in everything for e in t.other_quiet]
    other_signed = [e for t in everything for e in t.other_quiet]
    mean_ops_signed = [e for t in everything for e in t.mean_ops_quiet]
    if quiet_all and layer_all:
        lines += ["", f"Pooled over every quiet run of both models: calibrated op times {statistics.median(signed):+.1%} "
                  f"median signed error ({statistics.median(quiet_all):.1%} median, {max(quiet_all):.1%} worst "
                  f"absolute, {len(quiet_all)} runs); the same calibrations' mean op times alone (no spread) "
                  f"{signed_median(mean_ops_signed)} median signed "
                  f"({percent(mean_ops_signed, 'median')} median, {percent(mean_ops_signed, 'worst')} worst absolute); "
                  f"the layer profile alone {statistics.median(layer_signed):+.1%} "
                  f"median signed ({statistics.median(layer_all):.1%} median, {max(layer_all):.1%} worst absolute, "
                  f"{len(layer_all)} runs); 1F1B calibration instead "
                  f"{statistics.median(other_signed) if other_signed else 0.0:+.1%} median signed "
                  f"({statistics.median(other_all) if other_all else 0.0:.1%} median, {max(other_all, default=0.0):.1%} "
                  f"worst absolute, {len(other_all)} runs); identical runs' own spread around their median: "
                  f"{statistics.median(floor_all):.1%} median, {max(floor_all, default=0.0):.1%} worst.",
                  "", f"The speed probe over the quiet runs' measurements (from before the layer profile to after "
                  f"the run): {percent(drift_all, 'median')} median, {percent(drift_all, 'worst')} worst change. "
                  f"Quiet runs during which the host's speed held within {args.steady:.0%} (steady): "
                  f"{len(steady_all)} runs, {percent(steady_all, 'median')} median, {percent(steady_all, 'worst')} "
                  f"worst error; the quiet runs during which it did not (drifted): {len(drifted_all)} runs, "
                  f"{percent(drifted_all, 'median')} median, {percent(drifted_all, 'worst')} worst error."]
    lines += ["", "Reading the figures. The replay error (the engine fed each run's own op times) is the engine's "
              "share of the error; the rest is in the op times. *Bias*: the layer profile predicts too short on "
              "the pooled median (its column), because an op inside a running pipeline is not the layer timed "
              "alone: (1) gloo moving the activations while the rank computes makes the same F+B a few percent "
              "longer, mostly in the compute thread's own CPU time (copies and receive buffers evicting the "
              "layers' data), see `benchmarks/gloo_traffic_ab.py`; (2) the op's cache state depends on the "
              "schedule's order (the op table: the same stage's op is a different multiple of the layer profile "
              "under each schedule); (3) the op's wall time exceeds its thread CPU time (the op table's last "
              "figure), the other rank's and gloo's threads and other processes taking the core. A calibration "
              "run has (1) and (3) in its op times, and (2) for its own order. *Noise*: the column 'measured: "
              "worst deviation from its median' is the floor: identical runs, every one quiet by the CPU-share "
              "test, stray that far from their own median, because on this shared machine an op's thread CPU "
              "time itself changes from run to run (other processes share the caches and the memory bandwidth "
              "even when they get little CPU time) and the host's own speed drifts (section 'Host speed drift': the "
              "same fixed work with no ranks running), which neither the CPU-share test nor any prediction made "
              "before the run can see; the speed probe sees the part of the drift that comes between the "
              "measurements and the run, and the steady runs are those without it. Where that floor is above "
              "10%, no prediction can meet the worst-error target."]
    lines += ["", "Acceptance (quiet runs: median < 5%, worst < 10% for every schedule): "
              + verdict(met, enough) + " in this run. On the quiet and steady runs alone: "
              + verdict(steady_met, steady_enough) + "."]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section("validate", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
