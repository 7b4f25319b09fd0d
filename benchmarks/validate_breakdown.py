"""bench_validate's op-by-op tables: where each schedule's error comes from (pipesim.harness.breakdown).

Three tables per case, each cell the median over a schedule's runs:
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


def _pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:+.1%}"


def contribution_table(comparisons: Sequence[tuple[str, Comparison]]) -> list[str]:
    """One row per (schedule, compute mode): the median error and the median of each part of it."""
    lines = ["| schedule | compute | error | " + " | ".join(CONTRIBUTION_KEYS) + " |",
             "|---|---|---|" + "---|" * len(CONTRIBUTION_KEYS)]
    for name, comparison in comparisons:
        cells = [name, comparison.compute, _pct(comparison.median_error)]
        for key in CONTRIBUTION_KEYS:
            values = [run.contributions[key] for run in comparison.runs if key in run.contributions]
            cells.append(_pct(_median(values)) if values else "-")
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
