"""``pipesim check`` on the schedule CSVs that PyTorch's pipelining writes, and on broken variants of them.

PyTorch's schedule classes compute ``pipeline_order`` (every rank's actions) in ``__init__`` from
their stage objects, reading only ``num_stages``, ``group_size``, ``group_rank``, ``stage_index``
and ``submod`` (and setting ``stage_index_to_group_rank``). So rank 0's stages are stood in for
by plain objects with those attributes, no process group is started, and the CSV is written by
torch's own ``_dump_csv``: both formats for the multi-stage runtime schedules ("compute_only",
and the default "compute_comms" with SEND/RECV, UNSHARD/RESHARD and REDUCE_GRAD cells), and
``PipelineScheduleMulti._dump_csv`` (which only reads ``pipeline_order``) for GPipe and 1F1B.
"""

from __future__ import annotations

import contextlib
import csv
import io
import types
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
utils = pytest.importorskip("torch.distributed.pipelining._utils")

from pipesim.cli import main  # noqa: E402
from pipesim.schedule.csv_format import read_csv_schedule  # noqa: E402
from pipesim.schedule.invariants import CheckResult, check_schedule  # noqa: E402
from pipesim.schedule.ir import Op, OpKind  # noqa: E402

# (class name, placement style, stages per rank, [(ranks, microbatches), ...])
MULTI = [
    ("ScheduleInterleaved1F1B", "loop", 2, [(2, 4), (3, 6), (4, 8), (4, 6)]),
    ("ScheduleInterleaved1F1B", "loop", 3, [(2, 4)]),
    ("ScheduleLoopedBFS", "loop", 2, [(2, 4), (4, 8)]),
    ("ScheduleLoopedBFS", "loop", 3, [(3, 3)]),
    ("ScheduleInterleavedZeroBubble", "loop", 2, [(2, 4), (4, 8)]),
    ("ScheduleZBVZeroBubble", "v", 2, [(2, 4), (4, 8), (3, 5)]),
    ("ScheduleDualPipeV", "v", 2, [(2, 4), (4, 8), (3, 7)]),
]
MULTI_CASES = [(name, style, v, p, m) for name, style, v, shapes in MULTI for p, m in shapes]


def stand_in_stages(num_ranks: int, stages_per_rank: int, style: str) -> list[Any]:
    """Rank 0's stages as plain objects carrying what the schedule constructors read."""
    num_stages = num_ranks * stages_per_rank
    mine = utils.generate_rank_to_stage_mapping(num_ranks, num_stages, style)[0]
    return [types.SimpleNamespace(stage_index=s, num_stages=num_stages, group_rank=0, group_size=num_ranks,
                                  submod=torch.nn.Identity(), is_first=s == 0, is_last=s == num_stages - 1)
            for s in mine]


def torch_csv(tmp_path: Path, name: str, style: str, v: int, p: int, m: int, fmt: str | None) -> Path:
    """Write PyTorch's schedule ``name`` for p ranks and m microbatches with its own ``_dump_csv``."""
    cls = getattr(schedules, name)
    path = tmp_path / f"{name}_p{p}_m{m}_v{v}_{fmt or 'single'}.csv"
    if name in ("ScheduleGPipe", "Schedule1F1B"):
        schedule = cls(stand_in_stages(p, 1, "loop")[0], m)
        schedules.PipelineScheduleMulti._dump_csv(schedule, str(path))
    else:
        cls(stand_in_stages(p, v, style), m)._dump_csv(str(path), format=fmt)
    return path


def checked(text: str, m: int, v: int) -> tuple[Any, CheckResult]:
    parsed = read_csv_schedule(text, num_microbatches=m, num_minibatches=1, strict=False)
    return parsed, check_schedule(parsed.schedule, stages_per_rank=v)


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main(list(argv))
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue()


@pytest.mark.parametrize(("name", "style", "v", "p", "m"), MULTI_CASES)
@pytest.mark.parametrize("fmt", ["compute_only", "compute_comms"])
def test_torch_multi_stage_schedules_are_accepted(tmp_path: Path, name: str, style: str, v: int, p: int, m: int,
                                                  fmt: str) -> None:
    path = torch_csv(tmp_path, name, style, v, p, m, fmt)
    parsed, result = checked(path.read_text(), m, v)
    assert result.is_valid, [str(x) for x in result.violations]
    assert parsed.schedule.num_stages == p * v and parsed.schedule.num_ranks == p
    expected = utils.generate_stage_to_rank_mapping(p, p * v, style)
    assert parsed.schedule.stage_to_rank == tuple(expected[s] for s in range(p * v))
    assert (parsed.num_skipped > 0) == (fmt == "compute_comms")


@pytest.mark.parametrize(("p", "m"), [(2, 2), (3, 4), (4, 8)])
def test_torch_gpipe_is_accepted_and_1f1b_pipeline_order_is_rejected(tmp_path: Path, p: int, m: int) -> None:
    code, out = cli("check", str(torch_csv(tmp_path, "ScheduleGPipe", "loop", 1, p, m, None)), "--stages-per-rank", "1")
    assert code == 0, out
    # Schedule1F1B's pipeline_order (its drawing; not what it executes) starts the last rank at
    # F1 and ends it at F{m}: off by one when p - s - 1 = 0. The executed order is pipesim's 1f1b
    # (tests/test_torch_executed_order.py), which check accepts (tests/test_check_cli.py).
    code, out = cli("check", str(torch_csv(tmp_path, "Schedule1F1B", "loop", 1, p, m, None)),
                    "--microbatches", str(m))
    assert code == 1
    last = p - 1
    assert f"op {last}F{m}: microbatch {m} is outside 0..{m - 1}" in out
    assert f"rank {last}, no cell, op {last}F0: is missing" in out
    assert f">{last}F{m}<" in out


def cells_of(text: str) -> list[list[str]]:
    """The rows' cells, each OVERLAP_F_B pair written as its two cells (the same order)."""
    rows = []
    for row in csv.reader(io.StringIO(text)):
        cells = []
        for cell in row:
            if cell.startswith("(") and cell.endswith(")OVERLAP_F_B"):
                cells += cell[1:-len(")OVERLAP_F_B")].split(";")
            elif cell.strip():
                cells.append(cell.strip())
        rows.append(cells)
    return rows


def backward_of(rows: list[list[str]], stage: int, microbatch: int) -> str:
    """The text of the op that sends (stage, microbatch)'s gradient: its B, or else its I."""
    full = str(Op(stage, OpKind.B, microbatch))
    return full if any(full in row for row in rows) else str(Op(stage, OpKind.I, microbatch))


def locate(rows: list[list[str]], text: str) -> tuple[int, int]:
    return next((r, row.index(text)) for r, row in enumerate(rows) if text in row)


def deadlocking(rows: list[list[str]], num_stages: int) -> tuple[list[list[str]], str, int]:
    """Move the backward of (s, 0) on its rank to just before F(s, 1), for a stage s whose next
    stage sits on another rank and runs F(s+1, 1) before its own backward of microbatch 0.

    That rank then waits for F(s, 1), which now comes after the backward of (s, 0), which needs
    the gradient of (s+1, 0), which comes after F(s+1, 1): a cycle across two ranks.
    Returns the rows, the moved cell's text and its rank.
    """
    for stage in range(num_stages - 1):
        here, there = locate(rows, f"{stage}F1")[0], locate(rows, f"{stage + 1}F1")[0]
        if here == there:
            continue
        after = rows[there]
        if after.index(f"{stage + 1}F1") > after.index(backward_of(rows, stage + 1, 0)):
            continue
        moved = backward_of(rows, stage, 0)
        row = [cell for cell in rows[here] if cell != moved]
        row.insert(row.index(f"{stage}F1"), moved)
        return [row if r == here else list(cells) for r, cells in enumerate(rows)], moved, here
    raise AssertionError("no stage fits the construction")


def breakages(rows: list[list[str]], num_stages: int) -> dict[str, tuple[list[list[str]], str, str]]:
    """Each class of broken schedule: (rows, the op the report must name, what it must say)."""
    rank, position = locate(rows, backward_of(rows, 1, 0))
    dropped = [list(cells) for cells in rows]
    op = dropped[rank].pop(position)
    duplicated = [list(cells) for cells in rows]
    duplicated[1].append(duplicated[1][0])
    early = [list(cells) for cells in rows]
    _, forward_at = locate(early, "1F0")
    early[rank].remove(op)
    early[rank].insert(forward_at, op)
    locked, moved, _ = deadlocking(rows, num_stages)
    return {
        "missing": (dropped, f"op {op}", "is missing"),
        "duplicate": (duplicated, f"op {rows[1][0]}", "appears more than once"),
        "b-before-f": (early, f"op {op}", "runs before 1F0"),
        "deadlock": (locked, f"op {moved}", "deadlock: waits for"),
    }


@pytest.mark.parametrize(("name", "style", "v", "p", "m"), [
    ("ScheduleGPipe", "loop", 1, 3, 4),
    *[case for case in MULTI_CASES if case[3] in (2, 4)],
])
def test_broken_variants_of_torch_schedules_are_rejected_naming_the_cell(
        tmp_path: Path, name: str, style: str, v: int, p: int, m: int) -> None:
    text = torch_csv(tmp_path, name, style, v, p, m, None if v == 1 else "compute_only").read_text()
    rows = cells_of(text)
    _, result = checked("\n".join(",".join(row) for row in rows) + "\n", m, v)
    assert result.is_valid  # written as plain cells, the schedule is still the same and valid
    for kind, (broken, named, says) in breakages(rows, p * v).items():
        path = tmp_path / f"{kind}.csv"
        path.write_text("\n".join(",".join(row) for row in broken) + "\n")
        code, out = cli("check", str(path), "--stages-per-rank", str(v), "--microbatches", str(m))
        assert code == 1, (kind, out)
        lines = [line for line in out.splitlines() if named in line and says in line]
        assert lines, (kind, named, says, out)
        if kind != "missing":  # a missing op has no cell; every other offender's cell is marked
            assert f">{named[3:]}<" in out, (kind, out)
