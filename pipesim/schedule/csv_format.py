"""Schedules as CSV in torch.distributed.pipelining's format: one row per rank, one op per cell."""

from __future__ import annotations

import csv
import io

from pipesim.errors import ConfigError
from pipesim.schedule.ir import Op, OpKind, Schedule, WeightPolicy


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
    name: str = "custom",
    num_microbatches: int | None = None,
    source: str = "<csv>",
) -> Schedule:
    """Parse PyTorch's schedule CSV; empty cells (idle steps) are skipped.

    Stages are placed where their ops appear; ``num_microbatches`` defaults to the largest
    microbatch index plus one (one minibatch).

    Raises:
        ConfigError: a cell that is not an op, a stage on two ranks, or an empty file.
    """
    rows = list(csv.reader(io.StringIO(text)))
    ranks: list[tuple[Op, ...]] = []
    stage_to_rank: dict[int, int] = {}
    for row_index, row in enumerate(rows):
        ops = []
        for column, cell in enumerate(row):
            if not cell.strip():
                continue
            try:
                op = Op.parse(cell)
            except ConfigError:
                raise ConfigError(
                    f"row {row_index + 1} column {column + 1}", cell,
                    'must be an op like "1F0" (stage, F|B|I|W|U, microbatch) or empty', source=source,
                ) from None
            owner = stage_to_rank.setdefault(op.stage, row_index)
            if owner != row_index:
                raise ConfigError(
                    f"row {row_index + 1} column {column + 1}", cell,
                    f"stage {op.stage} already appears on rank {owner}; a stage lives on one rank",
                    source=source,
                )
            ops.append(op)
        ranks.append(tuple(ops))
    while ranks and not ranks[-1]:
        ranks.pop()
    if not stage_to_rank:
        raise ConfigError("csv", source, "holds no ops")
    num_stages = max(stage_to_rank) + 1
    if num_stages != len(stage_to_rank):
        # Stages must be 0..P-1 with none skipped; name the first gap without walking a huge range.
        present = sorted(stage_to_rank)
        gap = next(index for index, stage in enumerate(present) if stage != index)
        raise ConfigError("csv", source, f"has no ops for stage {gap}; stages must be 0..{num_stages - 1} with none skipped")
    compute = [op.microbatch for ops in ranks for op in ops if op.kind is not OpKind.U]
    if not compute:
        raise ConfigError("csv", source, "holds no compute ops (F, B, I or W)")
    largest = max(compute)
    if largest >= len(compute):
        # Every microbatch 0..N-1 needs its own ops, so N cannot exceed the number of ops.
        raise ConfigError("microbatch", largest, f"is too large: {len(compute)} compute ops cannot cover "
                          f"microbatches 0..{largest}", source=source)
    m = largest + 1 if num_microbatches is None else num_microbatches
    total = largest + 1
    num_minibatches = max(1, -(-total // m))
    return Schedule(
        name=name,
        num_stages=num_stages,
        num_microbatches=m,
        num_minibatches=num_minibatches,
        ranks=tuple(ranks),
        stage_to_rank=tuple(stage_to_rank[stage] for stage in range(num_stages)),
        weights=WeightPolicy.FLUSH,
    )
