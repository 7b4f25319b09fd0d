"""Prediction against runs, as one table: schedule x (emulated error, replay error, real median error, noise floor,
versions matched, peak memory error), per model and pipeline depth, and where each error comes from, op by op.

For each case (a model on P ranks) one layer profile and one link benchmark are measured, then:
- emulated runs (``--compute emulated``): every op lasts its predicted duration, so the error is
  the schedule model's (order, waits, communication, the runtime's own costs); the prediction adds
  the host's cost per op fed by another rank, measured once per case by separate emulated 1F1B
  runs of the case's m and K (pipesim.harness.overheads.host_cost);
- real runs, whose op times come from separate calibration runs of the real runtime (GPipe and
  1F1B) on the case's partition, with the case's m and K, each op the time of its own context
  (pipesim.harness.calibration, pipesim.harness.op_context; never a validated run), made afresh
  for every partition in every round, so that the calibration drifts with the runs it predicts;
- the replay of every real run: the engine fed each op's measured duration.
All runs of a case are interleaved across schedules (A B C A B C), emulated and real in turn, so
that a machine whose speed drifts weighs on every schedule alike. The noise floor is the largest
relative distance of a real run's iteration time from the runs' median: real errors below it
cannot be judged on this machine. The load average is written beside the figures. Each case's
tables are printed as soon as it is done (and written to ``--out``), then the op-by-op breakdown
(benchmarks/validate_breakdown.py).

A nice value below 0 or the real-time policy that this process may not take is reported and left
at the OS's default; the benchmark goes on.

Usage::

    python benchmarks/bench_validate.py [--cases 4-rank] [--runs 5] [--quick] [--no-write] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_file import machine, write_section  # noqa: E402
from benchmarks.validate_tables import contribution_table, kind_table, misses, row, stage_table  # noqa: E402
from pipesim.errors import ConfigError  # noqa: E402
from pipesim.harness import RunFailedError  # noqa: E402
from pipesim.harness.calibration import Calibrated, CalibrationRun, calibrate  # noqa: E402
from pipesim.harness.comparison import Comparison  # noqa: E402
from pipesim.harness.config import MAX_REALTIME_PRIORITY, ModelSpec, RunConfig  # noqa: E402
from pipesim.harness.linkbench import measure_links  # noqa: E402
from pipesim.harness.overheads import host_cost  # noqa: E402
from pipesim.harness.priority import check_realtime, raise_priority  # noqa: E402
from pipesim.harness.profiler import Timing, measure_profile  # noqa: E402
from pipesim.harness.validate import ScheduleValidation, keep_trace  # noqa: E402
from pipesim.spec.files import save_model  # noqa: E402
from pipesim.spec.profile import Profile  # noqa: E402

SCHEDULES = ("gpipe", "1f1b", "pipedream", "2bw", "pipemare", "interleaved-1f1b", "zb-h1", "zbv")
# Schedules that put two stages on each rank.
TWO_STAGES_PER_RANK = {"interleaved-1f1b", "zbv"}


@dataclass(frozen=True)
class Case:
    """One model on ``num_ranks`` ranks."""

    label: str
    spec: ModelSpec
    microbatch_size: int
    num_ranks: int
    num_microbatches: int = 8
    num_minibatches: int = 4

    @property
    def tags(self) -> tuple[str, ...]:
        """The words ``--cases`` picks this case by: ``N-rank`` and the model's name."""
        return f"{self.num_ranks}-rank", self.spec.name

    @property
    def slug(self) -> str:
        """A file name for the case's tables."""
        return re.sub(r"[^a-z0-9]+", "-", self.label.lower()).strip("-")


CASES = [
    Case("MLP 8x512, microbatch 64, 2 ranks", ModelSpec("mlp", depth=8, width=512), 64, 2),
    Case("transformer 4x128 (64 tokens), microbatch 8, 2 ranks",
         ModelSpec("transformer", depth=4, width=128, seq_len=64, heads=4), 8, 2),
    Case("MLP 8x512, microbatch 64, 4 ranks", ModelSpec("mlp", depth=8, width=512), 64, 4),
    # 8 blocks, so that the schedules with two stages per rank have a layer for each of their 8 stages
    Case("transformer 8x128 (64 tokens), microbatch 8, 4 ranks",
         ModelSpec("transformer", depth=8, width=128, seq_len=64, heads=4), 8, 4),
]


def select_cases(selectors: str) -> list[Case]:
    """The cases ``--cases`` names: comma-separated words, each a case's number (1-based), ``N-rank``
    or a model's name; a case runs if any word picks it. Empty: every case.

    Raises:
        ConfigError: a word that picks no case.
    """
    words = [word.strip().lower() for word in selectors.split(",") if word.strip()]
    if not words:
        return list(CASES)
    for word in words:
        if not any(word in case.tags or word == str(number) for number, case in enumerate(CASES, 1)):
            known = sorted({tag for case in CASES for tag in case.tags}) + [str(n) for n in range(1, len(CASES) + 1)]
            raise ConfigError("cases", word, f"must be one of {', '.join(known)}")
    return [case for number, case in enumerate(CASES, 1) if any(w in case.tags or w == str(number) for w in words)]


class PerRound:
    """Calibrations made once per partition (and number of ranks) in every round of runs and reused
    by every real run of that round that cuts the model there, so that the calibration is taken
    beside the runs it predicts; each has the calibrated run's m and K. ``every_run``: a fresh
    calibration right before each real run instead (``--calibrate run``), to tell what the runs
    between a calibration and the run it predicts change."""

    def __init__(self, spec: ModelSpec, run: CalibrationRun, num_ranks: int = 0, folder: Path | None = None,
                 every_run: bool = False) -> None:
        self.spec, self.run, self.num_ranks, self.folder = spec, run, num_ranks, folder
        self.every_run = every_run
        self.made: dict[tuple[object, ...], Calibrated] = {}
        self.count = 0

    def new_round(self) -> None:
        """Forget this round's calibrations."""
        self.made.clear()

    def __call__(self, profile: Profile, config: RunConfig) -> Calibrated:
        counts = (config.num_microbatches, config.num_minibatches)
        key = (config.partition, counts)
        if self.every_run:
            self.made.clear()
        if key not in self.made:
            made = calibrate(profile, self.spec, config.partition, self.run, num_ranks=self.num_ranks, for_run=counts)
            self.made[key] = made
            self.count += 1
            if self.folder is not None:
                for trace in made.traces:
                    keep_trace(trace.to_json(), self.folder / f"calibration-{len(config.partition)}-stages-"
                                                              f"{trace.info.schedule}-{self.count}.json.gz")
        return self.made[key]


def progress(message: str) -> None:
    """A line on stderr, so that a long case shows where it is."""
    print(f"[bench-validate {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class CaseResult:
    """One case's table lines, the acceptance figures it missed, and its comparisons."""

    lines: list[str]
    missed: list[str]
    comparisons: list[tuple[str, Comparison]]


def run_case(case: Case, runs: int, names: tuple[str, ...], realtime: int, deadline: float = float("inf"),
             folder: Path | None = None, calibrate: str = "round") -> CaseResult:
    """Every schedule of one case, emulated and real, interleaved; its tables and notes. The emulated
    ranks (host-cost runs included) run under SCHED_RR at priority ``realtime`` (0: not). A round
    that would end after ``deadline`` (``time.perf_counter``; judged by the time per run so far,
    calibrations included) is not started: the case then has fewer runs, and says so. With ``folder``,
    the profile, the links and every trace (runs and calibrations, gzipped) are kept there."""
    started = time.perf_counter()
    load_before = os.getloadavg()
    timing = Timing(repeats=30, processes=case.num_ranks)
    profile = measure_profile(case.spec, case.microbatch_size, timing=timing).profile
    largest = int(max(layer.activation_bytes for layer in profile.layers))
    topology, fits = measure_links(case.num_ranks, max_bytes=max(4, largest))
    host_cost_s = host_cost(profile, topology, case.spec, case.num_ranks, realtime_priority=realtime,
                            num_microbatches=case.num_microbatches, num_minibatches=case.num_minibatches)
    progress(f"{case.label}: profile, links and host cost in {time.perf_counter() - started:.0f} s")
    if folder is not None:
        save_model(profile, folder / "profile.json")
        save_model(topology, folder / "topology.json")
    every_run = calibrate == "run"
    calibration = PerRound(case.spec, CalibrationRun(), folder=folder, every_run=every_run)
    looped_calibration = PerRound(case.spec, CalibrationRun(), case.num_ranks, folder, every_run)  # two stages per rank
    lines = [f"### {case.label}, m={case.num_microbatches}, K={case.num_minibatches}", "",
             f"Links: {fits[0].latency_s * 1e6:.0f} us + bytes / {fits[0].bandwidth_bytes_per_s / 1e9:.2f} GB/s. "
             f"Emulated host cost: {host_cost_s * 1e6:.0f} us per F and B op fed by another rank, added to the "
             "emulated predictions (3 separate emulated 1F1B runs). "
             f"Load average before: {', '.join(f'{v:.2f}' for v in load_before)}.", "",
             "| schedule | emulated error, median (worst run) | emulated replay (worst) | real replay (worst) "
             "| real median error | noise floor | versions matched | peak memory error (emulated / real) |",
             "|---|---|---|---|---|---|---|---|"]
    validations: dict[str, dict[str, ScheduleValidation]] = {}
    skipped = []
    for name in names:
        shared = name in TWO_STAGES_PER_RANK
        common = {"schedule": name, "num_stages": 2 * case.num_ranks if shared else case.num_ranks,
                  "num_microbatches": case.num_microbatches, "num_minibatches": case.num_minibatches,
                  "num_ranks": case.num_ranks if shared else 0, "trace_folder": folder}
        try:
            validations[name] = {
                "emulated": ScheduleValidation(profile, topology, case.spec, compute="emulated",
                                               host_cost_s=host_cost_s, realtime_priority=realtime, **common),
                "real": ScheduleValidation(profile, topology, case.spec,
                                           calibration=looped_calibration if shared else calibration, **common)}
            validations[name]["emulated"].run_once()
        except (RunFailedError, ValueError) as error:
            skipped.append(f"- {name}: not run: {str(error).splitlines()[0]}")
            validations.pop(name, None)
    if not validations:
        return CaseResult(lines + skipped, [], [])
    # Interleaved: every schedule's real run, then (from the second round) each schedule's real and
    # emulated runs in turn, A B C A B C; a run that fails is noted and the others go on. Each round
    # calibrates every partition afresh.
    rounds = [[pair["real"] for pair in validations.values()]] + [
        [v for pair in validations.values() for v in (pair["real"], pair["emulated"])]] * (runs - 1)
    spent, ran = 0.0, 0
    for number, round_ in enumerate(rounds, 1):
        if number > 1 and time.perf_counter() + spent / ran * len(round_) > deadline:
            skipped.append(f"- rounds {number}..{len(rounds)} not run: the time limit (--time-limit) came first")
            break
        round_started = time.perf_counter()
        calibration.new_round()
        looped_calibration.new_round()
        for validation in round_:
            try:
                validation.run_once()
            except RunFailedError as error:
                skipped.append(f"- {validation.schedule} ({validation.compute}): a run failed: {error}")
        spent, ran = spent + time.perf_counter() - round_started, ran + len(round_)
        progress(f"{case.label}: round {number} of {len(rounds)} done at {time.perf_counter() - started:.0f} s")
    missed = []
    done: list[tuple[str, Comparison]] = []
    for name, pair in validations.items():
        if not (pair["emulated"].runs and pair["real"].runs):
            continue
        emulated, real = pair["emulated"].comparison(), pair["real"].comparison()
        done += [(name, real), (name, emulated)]
        lines.append(row(name, emulated, real))
        missed += misses(case.label, name, emulated, real)
    real_only = [(name, c) for name, c in done if c.compute == "real"]
    lines += ["", f"Load average after: {', '.join(f'{v:.2f}' for v in os.getloadavg())}; "
              f"{calibration.count + looped_calibration.count} calibration runs; "
              f"took {time.perf_counter() - started:.0f} s.", *skipped, "",
              "Where each error comes from (median over the runs): the error as a sum of each op kind's busy time "
              "per minibatch, the waits between ops and the spread term, predicted less measured, over the "
              "measured iteration time.", "", *contribution_table(done), "",
              "Real runs per op kind, pooled over the stages: the calibrated duration of the steady-state ops "
              "against their measured spans, and the spans' parts in the calibration run and in the run "
              "(receive: taking the input; send: handing the output on and the records).", "",
              *kind_table(real_only), "",
              "Real runs per stage and kind: measured over calibrated op duration.", "", *stage_table(real_only)]
    return CaseResult(lines, missed, done)


def take_priority(nice: int, realtime: int) -> tuple[int, int, list[str]]:
    """The nice value and real-time priority this process may take, trying each (a refusal is
    noted, and that one left at the OS's default: 0)."""
    notes = []
    if realtime:
        try:
            check_realtime(realtime)
        except ConfigError as error:
            notes.append(f"SCHED_RR refused, emulated ranks at the default policy: {error}")
            realtime = 0
    if nice:
        with contextlib.suppress(OSError):
            os.setsid()  # a session of its own, so that the priority applies to this benchmark alone
        try:
            raise_priority(nice)
        except ConfigError as error:
            notes.append(f"nice {nice} refused, at the default priority: {error}")
            nice = 0
    return nice, realtime, notes


def write_case(folder: Path, number: int, case: Case, result: CaseResult) -> None:
    """The case's tables (markdown) and every comparison (``validate --json``'s objects) under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / f"case{number}-{case.slug}"
    stem.with_suffix(".md").write_text("\n".join(result.lines) + "\n", encoding="utf-8")
    reports = [comparison.to_dict() for _, comparison in result.comparisons]
    stem.with_suffix(".json").write_text(json.dumps(reports, sort_keys=True, default=str) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """Run the cases; print each case's tables when it is done; write RESULTS.md unless told not to."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="", help="comma-separated: 2-rank, 4-rank, mlp, transformer or a case's "
                                                    "number (1-4); default every case")
    parser.add_argument("--runs", type=int, default=5, help="runs per schedule and compute mode (at least 1)")
    parser.add_argument("--quick", action="store_true", help="the first case, 1f1b and 2bw, 2 runs")
    parser.add_argument("--no-write", action="store_true", help="print, do not write RESULTS.md")
    parser.add_argument("--out", type=Path, help="also write each case's tables and comparisons (JSON) here, and the "
                                                 "whole section as validate.md, as each case is done")
    parser.add_argument("--time-limit", type=float, default=0.0,
                        help="seconds for the whole benchmark: each case gets an equal share of what is left, and "
                             "stops starting rounds (fewer runs, said in its notes) when the next would not fit; "
                             "0: no limit")
    parser.add_argument("--nice", type=int, default=-20,
                        help="nice value of this benchmark's own session (ranks must wake on time; below 0 needs "
                             "root, and is left at the default where refused); 0 leaves it")
    parser.add_argument("--calibrate", default="round",
                        help="round: one calibration per partition in every round, used by every real run of the "
                             "round (default); run: a fresh calibration right before each real run")
    parser.add_argument("--realtime-priority", type=int, default=10,
                        help="SCHED_RR priority of the emulated runs' ranks (needs root; the default policy where "
                             "refused; 0: the normal policy)")
    args = parser.parse_args(argv)
    try:
        cases = CASES[:1] if args.quick else select_cases(args.cases)
        if args.runs < 1:
            raise ConfigError("runs", args.runs, "must be >= 1")
        if not args.time_limit >= 0:
            raise ConfigError("time_limit", args.time_limit, "must be >= 0 seconds")
        if not -20 <= args.nice <= 19:
            raise ConfigError("nice", args.nice, "must be in -20..19")
        if args.calibrate not in ("round", "run"):
            raise ConfigError("calibrate", args.calibrate, "must be round or run")
        if not 0 <= args.realtime_priority <= MAX_REALTIME_PRIORITY:
            raise ConfigError("realtime_priority", args.realtime_priority, f"must be in 0..{MAX_REALTIME_PRIORITY}")
    except ConfigError as error:
        print(f"bench_validate: {error}", file=sys.stderr)
        return 2
    nice, realtime, notes = take_priority(args.nice, args.realtime_priority)
    for note in notes:
        print(f"bench_validate: {note}; going on", file=sys.stderr, flush=True)
    names = ("1f1b", "2bw") if args.quick else SCHEDULES
    runs = 2 if args.quick else args.runs
    started = time.perf_counter()
    # A run of some of the cases gets a section of its own, so that it never replaces the table of all.
    picked = "quick" if args.quick else args.cases
    some = "" if cases == CASES else "-" + "-".join(re.sub(r"[^a-z0-9]+", "", word.lower())
                                                    for word in picked.split(",") if word.strip())
    some += "-calibrate-run" if args.calibrate == "run" else ""
    title = (f": cases {picked}" if cases != CASES or args.quick else "") + (
        ", calibrated before each run" if args.calibrate == "run" else "")
    lines = [f"## Prediction against runs{title} "
             "(issues 21 and 34: emulated device, replay, real runs and their noise floor)", "",
             f"Written by `make bench-validate` (benchmarks/bench_validate.py) on "
             f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {machine()}, gloo on CPU, nice {nice}, {runs} runs per "
             f"schedule and compute mode, interleaved across schedules. Emulated: each op lasts its predicted "
             f"duration (`--compute emulated`), the ranks under SCHED_RR at priority {realtime} "
             f"(`--realtime-priority`; 0: the normal policy). Real: op times from a separate calibration run per "
             f"partition {'right before each real run' if args.calibrate == 'run' else 'in every round'} "
             f"(a GPipe and a 1F1B run with the case's m and K, their looped-bfs and "
             f"interleaved-1f1b forms on the same ranks for two stages per rank; each op the time of its own "
             f"context, the kind of the op before it). Replay: the engine fed each run's measured op durations. Noise floor: the "
             f"largest distance of a real run's iteration time from the runs' median; real errors below it "
             f"cannot be judged here. Errors are (predicted - measured) / measured of the steady-state "
             f"iteration time.", *(f"{note}." for note in notes), ""]
    missed: list[str] = []
    for index, case in enumerate(cases):
        number = CASES.index(case) + 1
        deadline = float("inf")
        if args.time_limit:
            left = started + args.time_limit - time.perf_counter()
            deadline = time.perf_counter() + left / (len(cases) - index)
        folder = None if args.out is None else args.out / f"case{number}-traces"
        result = run_case(case, runs, names, realtime, deadline, folder, args.calibrate)
        lines += result.lines + [""]
        missed += result.missed
        print("\n".join(result.lines) + "\n", flush=True)
        if args.out:
            write_case(args.out, number, case, result)
            (args.out / "validate.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    ending = [f"Took {time.perf_counter() - started:.0f} s.", "",
              "Acceptance (issues 21 and 34) not met:" if missed else "Acceptance (issues 21 and 34): every figure met.",
              *missed]
    lines += ending
    text = "\n".join(lines)
    print("\n".join(ending), flush=True)
    if args.out:
        (args.out / "validate.md").write_text(text + "\n", encoding="utf-8")
    if not args.no_write:
        write_section("validate" + some, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
