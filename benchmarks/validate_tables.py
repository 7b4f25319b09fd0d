"""bench_validate's tables: each schedule's line of the main table, the acceptance figures it missed, and
where each schedule's error comes from, op by op (pipesim.harness.breakdown).

Three breakdown tables per case, each cell the median over a schedule's runs:
- contributions: the iteration-time error as a sum over op kinds, the waits between ops and the
  spread term (what the expectation over the calibration's op-time spread added);
- per kind, pooled over the stages: the calibrated op duration against the measured one, and the
  parts of the spans (taking the input, the work, handing the output on) in the calibration run
  and in the validated run, the thread's CPU time, and the wait before each op;
- per stage and kind: measured over calibrated duration, one column per schedule.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

from pipesim.harness.breakdown import KINDS, OpRow, by_kind
from pipesim.harness.comparison import Comparison

CONTRIBUTION_KEYS = (*KINDS, "waits", "spread")


def _median(values: Sequence[float]) -> float:
    known = [v for v in values if not math.isnan(v)]
    return statistics.median(known) if known else math.nan


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value * 1e3:.3f}"


def pct(value: float) -> str:
    """A signed percentage ("-" for NaN)."""
    return "-" if math.isnan(value) else f"{value:+.1%}"


def contribution_table(comparisons: Sequence[tuple[str, Comparison]]) -> list[str]:
    """One row per (schedule, compute mode): the median error and the median of each part of it."""
    lines = ["| schedule | compute | error | " + " | ".join(CONTRIBUTION_KEYS) + " |",
             "|---|---|---|" + "---|" * len(CONTRIBUTION_KEYS)]
    for name, comparison in comparisons:
        cells = [name, comparison.compute, pct(comparison.median_error)]
        for key in CONTRIBUTION_KEYS:
            values = [run.contributions[key] for run in comparison.runs if key in run.contributions]
            cells.append(pct(_median(values)) if values else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _pooled(rows_of_run: Callable[[int], Sequence[OpRow]], num_runs: int, kind: str,
            field: str) -> float:
    """The median over runs of a kind's pooled value of ``field`` (NaN where absent)."""
    values = []
    for run in range(num_runs):
        pooled = [row for row in by_kind(rows_of_run(run)) if row.kind == kind]
        if pooled:
            values.append(getattr(pooled[0], field))
    return _median(values)


def kind_table(comparisons: Sequence[tuple[str, Comparison]]) -> list[str]:
    """Per schedule and kind, pooled over stages: calibrated against measured durations and the spans' parts."""
    lines = ["| schedule | kind | ops per run | calibrated, ms | measured, ms | measured / calibrated "
             "| receive, ms (calibration / run) | work, ms (calibration / run) | send, ms (calibration / run) "
             "| CPU, ms (run) | wait before, ms (predicted / run) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, comparison in comparisons:
        runs = comparison.runs
        kinds = [kind for kind in KINDS if any(row.kind == kind for run in runs for row in run.op_rows)]
        for kind in kinds:
            def run_value(field: str, kind: str = kind) -> float:
                return _pooled(lambda i: runs[i].op_rows, len(runs), kind, field)

            def calibration_value(field: str, kind: str = kind) -> float:
                return _pooled(lambda i: runs[i].calibration_rows, len(runs), kind, field)

            count = _median([float(row.count) for run in runs for row in by_kind(run.op_rows) if row.kind == kind])
            predicted, measured = run_value("predicted_s"), run_value("measured_s")
            lines.append(
                f"| {name} | {kind} | {count:.0f} | {_ms(predicted)} | {_ms(measured)} | "
                f"{measured / predicted if predicted > 0 else math.nan:.3f} | "
                + " | ".join(f"{_ms(calibration_value(part))} / {_ms(run_value(part))}"
                             for part in ("receive_s", "work_s", "send_s"))
                + f" | {_ms(run_value('cpu_s'))} | {_ms(run_value('predicted_wait_s'))} / {_ms(run_value('wait_s'))} |")
    return lines


def stage_table(comparisons: Sequence[tuple[str, Comparison]]) -> list[str]:
    """Per stage and kind, measured over calibrated duration: one column per schedule."""
    names = [name for name, _ in comparisons]
    keys = sorted({(row.stage, row.kind) for _, c in comparisons for run in c.runs for row in run.op_rows},
                  key=lambda key: (key[0], KINDS.index(key[1])))
    lines = ["| stage | kind | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for stage, kind in keys:
        cells = []
        for _, comparison in comparisons:
            ratios = [row.ratio for run in comparison.runs for row in run.op_rows
                      if (row.stage, row.kind) == (stage, kind)]
            cells.append(f"{_median(ratios):.3f}" if ratios else "")
        lines.append(f"| {stage} | {kind} | " + " | ".join(cells) + " |")
    return lines


def row(name: str, emulated: Comparison | None, real: Comparison | None) -> str:
    """One schedule's line of the table."""
    cells = [name]
    if emulated is None:
        cells += ["not run"] * 2
    else:
        errors = [run.iteration_time_error for run in emulated.runs]
        cells.append(f"{pct(emulated.median_error)} (worst {pct(max(errors, key=abs))})")
        cells.append(pct(max((e for e in emulated.to_dict()["replay_error_runs"]), key=abs)))
    if real is None:
        cells += ["not run"] * 3
    else:
        cells.append(pct(max(real.to_dict()["replay_error_runs"], key=abs)))
        cells.append(pct(real.median_error))
        cells.append(f"{real.noise_floor:.1%}")
    done = [c for c in (emulated, real) if c is not None]
    ops = sum(run.versions.num_ops for c in done for run in c.runs)
    bad = sum(len(run.versions.mismatches) for c in done for run in c.runs)
    cells.append(f"{(ops - bad) / ops:.0%} of {ops}" if ops else "-")
    memory = [max(abs(e) for e in c.to_dict()["peak_memory_error"]) for c in done]
    cells.append(" / ".join(f"{m:.2%}" for m in memory) if memory else "-")
    return "| " + " | ".join(cells) + " |"


def misses(label: str, name: str, emulated: Comparison, real: Comparison) -> list[str]:
    """Which acceptance figures this schedule missed, one line each: issue 21's for the emulated device,
    the replays, versions and memory; issue 34's for the real runs (within 5%, or within the noise
    floor where that is larger)."""
    found = []
    errors = [run.iteration_time_error for run in emulated.runs]
    if max(abs(e) for e in errors) > 0.03 or abs(emulated.median_error) > 0.02:
        found.append(f"emulated error {pct(emulated.median_error)} median, {pct(max(errors, key=abs))} worst "
                     "(wanted within 2% and 3%)")
    replays = real.to_dict()["replay_error_runs"] + emulated.to_dict()["replay_error_runs"]
    if max(abs(e) for e in replays) > 0.02:
        found.append(f"replay error {pct(max(replays, key=abs))} (wanted within 2%)")
    if abs(real.median_error) > max(0.05, real.noise_floor):
        found.append(f"real median error {pct(real.median_error)} with a noise floor of {real.noise_floor:.1%} "
                     "(wanted within 5%, or within the noise floor where that is larger)")
    if not (emulated.versions_match and real.versions_match):
        found.append("weight versions differ")
    memory = max(abs(e) for e in emulated.to_dict()["peak_memory_error"])
    if memory > 0.01:
        found.append(f"emulated peak memory error {memory:.2%} (wanted within 1%)")
    return [f"- {label}, {name}: {miss}" for miss in found]
