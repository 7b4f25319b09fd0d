"""Schedules as CSV in torch.distributed.pipelining's format: one row per rank, one op per cell."""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass

from pipesim.errors import ConfigError
from pipesim.schedule.ir import Op, OpKind, Schedule, WeightPolicy
from pipesim.spec.plan import CUSTOM_SCHEDULE

# PyTorch's actions that move data or manage memory rather than compute; the microbatch is optional.
_NON_COMPUTE = re.compile(r"([0-9]+)(UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)([0-9]*)")
# DualPipeV's overlapped pair, e.g. "(0F3;3B1)OVERLAP_F_B".
_OVERLAP = re.compile(r"\(([^()]*)\)OVERLAP_F_B")

# Placeholder rank of a stage no cell mentions (only in lenient reads; validation reports it).
NO_RANK = -1


@dataclass(frozen=True)
class CsvSchedule:
    """A schedule read from CSV, with where each of its ops came from.

    Attributes:
        schedule: the compute ops per rank (stages placed where their ops appear).
        columns: per rank, per op, the 0-based CSV column of its cell (the two ops of an
            OVERLAP_F_B pair share one).
        num_skipped: non-compute cells skipped (SEND/RECV, UNSHARD/RESHARD, REDUCE_GRAD).
    """

    schedule: Schedule
    columns: tuple[tuple[int, ...], ...]
    num_skipped: int


def to_csv(schedule: Schedule, *, include_updates: bool = False) -> str:
    """Render ``schedule`` as CSV text, one row per rank.

    Args:
        include_updates: keep U cells; PyTorch has no U action, so they are dropped by default.
    """
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for ops in schedule.ranks:
        writer.writerow([str(op) for op in ops if include_updates or op.kind is not OpKind.U])
    return out.getvalue()


def from_csv(
    text: str,
    *,
    name: str = CUSTOM_SCHEDULE,
    num_microbatches: int | None = None,
    source: str = "<csv>",
) -> Schedule:
    """Parse PyTorch's schedule CSV (as ``_dump_csv`` writes it, either format) into a Schedule.

    Cells are read as follows:

    - empty cells (idle steps) are skipped;
    - compute actions ``F``, ``B``, ``I``, ``W`` (and our ``U``) become ops;
    - ``(0F1;1B0)OVERLAP_F_B`` (DualPipeV's overlapped pair) becomes its sub-actions, in order;
    - ``SEND_F``, ``RECV_F``, ``SEND_B``, ``RECV_B``, ``UNSHARD``, ``RESHARD`` and
      ``REDUCE_GRAD`` (with or without a microbatch number) are skipped: pipesim derives
      communication from the compute order, and has no FSDP sharding.

    A rank may hold several stages (interleaved and V schedules); stages are placed where their
    ops appear. ``num_microbatches`` defaults to the largest microbatch index plus one (one
    minibatch).

    Raises:
        ConfigError: a cell that is not an action, a stage on two ranks, a stage number with
            no ops below the largest one, a stage or microbatch number (or ``num_microbatches``)
            larger than the number of compute ops (no schedule could cover it), or a file without
            compute ops.
    """
    return read_csv_schedule(
        text, name=name, num_microbatches=num_microbatches, source=source, strict=True,
    ).schedule


def read_csv_schedule(
    text: str,
    *,
    name: str = CUSTOM_SCHEDULE,
    num_microbatches: int | None = None,
    num_minibatches: int | None = None,
    source: str = "<csv>",
    strict: bool = True,
) -> CsvSchedule:
    """Parse a schedule CSV as ``from_csv`` does, keeping each op's column.

    Args:
        num_minibatches: K; default: enough minibatches of ``num_microbatches`` to cover the
            largest microbatch index (a larger index then reads as out of range).
        strict: raise on a stage found on two ranks or a stage without ops. When false (what
            ``pipesim check`` uses), a stage stays on the first rank it appears on and a stage
            without ops gets rank ``NO_RANK``, so that validation reports them as violations.

    Raises:
        ConfigError: see ``from_csv``; in lenient mode not for a stage on two ranks or a skipped
            stage number; with both counts given, a large microbatch index reads as out of range.
    """
    # Excel's "CSV UTF-8" starts the file with a byte-order mark.
    rows = list(csv.reader(io.StringIO(text.removeprefix("\ufeff"))))
    ranks: list[tuple[Op, ...]] = []
    columns: list[tuple[int, ...]] = []
    stage_to_rank: dict[int, int] = {}
    num_skipped = 0
    for row_index, row in enumerate(rows):
        ops: list[Op] = []
        where: list[int] = []
        for column, cell in enumerate(row):
            parsed = _parse_cell(cell, f"row {row_index + 1} column {column + 1}", source)
            if parsed is None:
                num_skipped += bool(cell.strip())
                continue
            for op in parsed:
                owner = stage_to_rank.setdefault(op.stage, row_index)
                if owner != row_index and strict:
                    raise ConfigError(
                        f"row {row_index + 1} column {column + 1}", cell,
                        f"stage {op.stage} already appears on rank {owner}; a stage lives on one rank",
                        source=source,
                    )
                ops.append(op)
                where.append(column)
        ranks.append(tuple(ops))
        columns.append(tuple(where))
    while ranks and not ranks[-1]:
        ranks.pop()
        columns.pop()
    if not stage_to_rank:
        raise ConfigError("csv", source, "holds no compute ops (F, B, I or W)")
    num_stages = max(stage_to_rank) + 1
    compute = [op.microbatch for ops in ranks for op in ops if op.kind is not OpKind.U]
    if not compute:
        raise ConfigError("csv", source, "holds no compute ops (F, B, I or W)")
    if num_stages > len(compute):
        # Each stage needs ops of its own; refuse before walking a huge range of stage numbers.
        raise ConfigError("stage", num_stages - 1, f"is too large: {len(compute)} compute ops cannot cover "
                          f"stages 0..{num_stages - 1}", source=source)
    if num_stages != len(stage_to_rank) and strict:
        # Stages must be 0..P-1 with none skipped; name the first gap.
        present = sorted(stage_to_rank)
        gap = next(index for index, stage in enumerate(present) if stage != index)
        raise ConfigError("csv", source, f"has no ops for stage {gap}; stages must be 0..{num_stages - 1} "
                          "with none skipped")
    largest = max(compute)
    if largest >= len(compute) and (num_microbatches is None or num_minibatches is None):
        # Every microbatch 0..N-1 needs its own ops, so N cannot exceed the number of ops.
        raise ConfigError("microbatch", largest, f"is too large: {len(compute)} compute ops cannot cover "
                          f"microbatches 0..{largest}", source=source)
    if num_microbatches is not None and num_microbatches > len(compute):
        # As for the file's own indices: microbatches 0..M-1 each need ops of their own.
        raise ConfigError("microbatches", num_microbatches, f"is too large: {len(compute)} compute ops cannot "
                          f"cover microbatches 0..{num_microbatches - 1}", source=source)
    m = largest + 1 if num_microbatches is None else num_microbatches
    if num_minibatches is None:
        num_minibatches = max(1, -(-(largest + 1) // m))
    schedule = Schedule.from_ranks(
        name=name,
        num_stages=num_stages,
        num_microbatches=m,
        num_minibatches=num_minibatches,
        ranks=tuple(ranks),
        stage_to_rank=tuple(stage_to_rank.get(stage, NO_RANK) for stage in range(num_stages)),
        weights=WeightPolicy.FLUSH,
    )
    return CsvSchedule(schedule=schedule, columns=tuple(columns), num_skipped=num_skipped)


def _parse_cell(cell: str, field: str, source: str) -> tuple[Op, ...] | None:
    """The compute ops of one cell, or None for an empty or non-compute cell; numbers are ASCII
    digits only (``int`` would read other scripts' digits, ``"1B١"`` as microbatch 1)."""
    text = cell.strip()
    if not text or _NON_COMPUTE.fullmatch(text):
        return None
    overlap = _OVERLAP.fullmatch(text)
    parts = overlap.group(1).split(";") if overlap else [text]
    try:
        if not text.isascii():
            raise ConfigError("op", text, "must be ASCII")
        return tuple(Op.parse(part) for part in parts)
    except ConfigError:
        raise ConfigError(
            field, cell,
            'must be an action like "1F0" (stage, F|B|I|W|U, microbatch), "(0F1;1B0)OVERLAP_F_B", '
            "a SEND/RECV/UNSHARD/RESHARD/REDUCE_GRAD action, or empty",
            source=source,
        ) from None
