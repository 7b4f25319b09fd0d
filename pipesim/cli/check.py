"""``pipesim check``: read a schedule in PyTorch's CSV format and report every broken invariant."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from pipesim.errors import ConfigError
from pipesim.schedule.csv_format import CsvSchedule, read_csv_schedule
from pipesim.schedule.invariants import CheckResult, check_schedule
from pipesim.schedule.validate import Violation
from pipesim.spec.files import MAX_INPUT_BYTES, decode_utf8, read_text


@click.command("check")
@click.argument("path", metavar="FILE.csv")
@click.option("--stages-per-rank", "stages_per_rank", type=click.IntRange(min=1), default=None,
              help="Require every rank to hold exactly V stages (2 for V schedules such as ZBV, DualPipeV).")
@click.option("--microbatches", "num_microbatches", type=click.IntRange(min=1), default=None,
              help="Microbatches M in the file (default: the largest microbatch index plus one).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
def check_command(path: str, stages_per_rank: int | None, num_microbatches: int | None,
                  as_json: bool) -> None:
    """Check a schedule CSV (one row per rank, cells like 0F0, 1B3, 2I1, 2W1; PyTorch's _dump_csv).

    Checks that every (stage, microbatch) has one F and one B (or one I and one W), F before
    B/I and I before W, each stage on one rank, no deadlock under point-to-point send/recv, and
    with --stages-per-rank the number of stages per rank. Communication cells (SEND/RECV,
    UNSHARD/RESHARD, REDUCE_GRAD) are skipped; OVERLAP_F_B pairs count as their two ops.
    Exit 0: valid; 1: violations (each with rank, position, op, and the grid with the cell
    marked); 2: unreadable input. FILE.csv "-" reads standard input.
    """
    text = _read_stdin() if path == "-" else read_text(path, "schedule")
    if path == "-":
        path = "<stdin>"
    parsed = read_csv_schedule(text, num_microbatches=num_microbatches,
                               num_minibatches=1 if num_microbatches else None, source=path, strict=False)
    result = check_schedule(parsed.schedule, stages_per_rank=stages_per_rank)
    if as_json:
        click.echo(json.dumps(_as_dict(path, parsed, result), sort_keys=True))
    else:
        click.echo(_as_text(path, parsed, result))
    if not result.is_valid:
        # Not click's ctx.exit: the CLI group runs click without standalone mode, which returns
        # an Exit's code instead of exiting with it.
        sys.exit(1)


def _read_stdin() -> str:
    """Standard input as UTF-8 text, at most ``MAX_INPUT_BYTES`` of it (an endless pipe is refused).

    Raises:
        ConfigError: more bytes than that, or bytes that are not UTF-8.
    """
    data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
    if len(data) > MAX_INPUT_BYTES:
        raise ConfigError("schedule", "<stdin>", f"holds more than {MAX_INPUT_BYTES:,} bytes, the most pipesim "
                          "reads from one file")
    return decode_utf8(data, "<stdin>", "schedule")


def _column(parsed: CsvSchedule, violation: Violation) -> int | None:
    """1-based CSV column of the violation's cell, or None when it has none (a missing op)."""
    if 0 <= violation.rank < len(parsed.columns) and 0 <= violation.position < len(parsed.columns[violation.rank]):
        return parsed.columns[violation.rank][violation.position] + 1
    return None


def _summary(parsed: CsvSchedule) -> dict[str, Any]:
    schedule = parsed.schedule
    return {
        "num_ranks": schedule.num_ranks,
        "num_stages": schedule.num_stages,
        "num_microbatches": schedule.num_microbatches,
        "stage_to_rank": list(schedule.stage_to_rank),
        "stages_per_rank": [len({op.stage for op in ops}) for ops in schedule.ranks],
        "num_ops": schedule.num_ops,
        "num_skipped_cells": parsed.num_skipped,
    }


def _as_dict(path: str, parsed: CsvSchedule, result: CheckResult) -> dict[str, Any]:
    return {
        "file": path,
        "valid": result.is_valid,
        **_summary(parsed),
        "violations": [
            {"rank": v.rank, "position": v.position, "column": _column(parsed, v), "op": v.op, "message": v.message}
            for v in result.violations
        ],
        "grid": result.marked_grid(),
    }


def _as_text(path: str, parsed: CsvSchedule, result: CheckResult) -> str:
    summary = _summary(parsed)
    shape = (f"{summary['num_ranks']} ranks, {summary['num_stages']} stages, "
             f"{summary['num_microbatches']} microbatches, {summary['num_ops']} compute ops, "
             f"{summary['num_skipped_cells']} non-compute cells skipped")
    if result.is_valid:
        return f"{path}: valid ({shape})"
    count = len(result.violations)
    lines = [f"{path}: invalid, {count} violation{'s' if count > 1 else ''} ({shape})"]
    for violation in result.violations:
        column = _column(parsed, violation)
        where = f"position {violation.position} (column {column})" if column else "no cell"
        lines.append(f"  rank {violation.rank}, {where}, op {violation.op}: {violation.message}")
    lines.append(result.marked_grid())
    return "\n".join(lines)
