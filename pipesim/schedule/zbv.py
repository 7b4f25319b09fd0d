"""ZB-V (zero bubble, V placement), as torch's ScheduleZBVZeroBubble orders it."""

from __future__ import annotations

from pipesim.schedule.ir import Op, OpKind, Schedule
from pipesim.schedule.multi_stage import (
    Counters,
    assemble,
    ranks_and_stages,
    require_stages_per_rank,
    v_placement,
)

F, I, W = OpKind.F, OpKind.I, OpKind.W


def zbv_order(rank: int, num_ranks: int, num_microbatches: int) -> list[Op]:
    """One minibatch on ``rank``, which holds the V's down stroke ``rank`` and its up stroke ``2R-1-rank``.

    Warm-up: ``2(R-rank)-1`` forwards of the down stage, ``rank`` pairs (up F, down F), then
    ``R-rank`` triples (up F, I, W). Steady: (down F, I, W, up F, I, W) until the forwards run
    out. Cool-down: ``rank`` pairs (down I, up I), ``R-rank`` pairs (down I, W), then the
    pending W of the up stage and of the down stage. The pattern is built for at least 2R-1
    microbatches; ops of microbatches beyond m are then dropped.
    """
    down, up = rank, 2 * num_ranks - 1 - rank
    n = max(2 * num_ranks - 1, num_microbatches)
    c = Counters()
    ops = [c.take(down, F) for _ in range(2 * (num_ranks - rank) - 1)]
    for _ in range(rank):
        ops += [c.take(up, F), c.take(down, F)]
    for _ in range(num_ranks - rank):
        ops += [c.take(up, F), c.take(up, I), c.take(up, W)]
    while c.peek(up, F) < c.peek(down, F) or c.peek(down, F) < n:
        if c.peek(down, F) < n:
            ops.append(c.take(down, F))
        ops += [c.take(down, I), c.take(down, W), c.take(up, F), c.take(up, I), c.take(up, W)]
    for _ in range(rank):
        ops += [c.take(down, I), c.take(up, I)]
    for _ in range(num_ranks - rank):
        ops += [c.take(down, I), c.take(down, W)]
    for stage in (up, down):
        while c.peek(stage, W) < c.peek(stage, I):
            ops.append(c.take(stage, W))
    return [op for op in ops if op.microbatch < num_microbatches]


def zbv(
    num_stages: int,
    num_microbatches: int,
    *,
    num_minibatches: int = 1,
    num_ranks: int | None = None,
) -> Schedule:
    """ZB-V on ``num_ranks`` ranks with exactly two stages each (rank r: stages r and 2R-1-r).

    Equal to the executed order of torch 2.13's ScheduleZBVZeroBubble; like it, rejects any
    other number of stages per rank. R = 2, m = 2::

        rank 0: 0F0 0F1 3F0 3I0 3W0 3F1 3I1 3W1 0I0 0W0 0I1 0W1
        rank 1: 1F0 2F0 1F1 2F1 2I0 2W0 1I0 1W0 2I1 2W1 1I1 1W1
    """
    r, v = ranks_and_stages("zbv", num_stages, num_ranks)
    require_stages_per_rank("zbv", "ScheduleZBVZeroBubble", v, 2)
    return assemble("zbv", num_stages, num_microbatches, num_minibatches, v_placement(r),
                    lambda rank, m: zbv_order(rank, r, m))
