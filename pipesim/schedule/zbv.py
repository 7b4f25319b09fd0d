"""ZB-V (zero bubble, V placement), as torch's ScheduleZBVZeroBubble orders it."""

from __future__ import annotations

from pipesim.schedule.ir import F_CODE, I_CODE, W_CODE, Schedule
from pipesim.schedule.multi_stage import (
    Runs,
    assemble,
    rank_by_rank,
    ranks_and_stages,
    require_stages_per_rank,
    v_placement,
)


def zbv_order(runs: Runs, rank: int, num_ranks: int, num_microbatches: int) -> None:
    """One minibatch on ``rank``, which holds the V's down stroke ``rank`` and its up stroke ``2R-1-rank``.

    Warm-up: ``2(R-rank)-1`` forwards of the down stage, ``rank`` pairs (up F, down F), then
    ``R-rank`` triples (up F, I, W). Steady: (down F, I, W, up F, I, W) until the forwards run
    out. Cool-down: ``rank`` pairs (down I, up I), ``R-rank`` pairs (down I, W), then the
    pending W of the up stage and of the down stage, as runs (``Runs``). The pattern is built
    for n = max(2R-1, m) microbatches (``Runs.table`` drops the ops beyond m); the steady
    phase has n-R rounds, of which the first ``n-2R+rank+1`` still hold a down F.
    """
    r, m = num_ranks, num_microbatches
    down, up = rank, 2 * r - 1 - rank
    n = max(2 * r - 1, m)
    with_forward = n - 2 * r + rank + 1
    runs.repeat(2 * (r - rank) - 1, (down, F_CODE, 0))
    runs.repeat(rank, (up, F_CODE, 0), (down, F_CODE, 2 * (r - rank) - 1))
    runs.repeat(r - rank, (up, F_CODE, rank), (up, I_CODE, 0), (up, W_CODE, 0))
    runs.repeat(with_forward, (down, F_CODE, 2 * r - rank - 1), (down, I_CODE, 0), (down, W_CODE, 0),
                (up, F_CODE, r), (up, I_CODE, r - rank), (up, W_CODE, r - rank))
    j = with_forward
    runs.repeat(r - rank - 1, (down, I_CODE, j), (down, W_CODE, j), (up, F_CODE, r + j), (up, I_CODE, r - rank + j),
                (up, W_CODE, r - rank + j))
    runs.repeat(rank, (down, I_CODE, n - r), (up, I_CODE, n - rank))
    runs.repeat(r - rank, (down, I_CODE, n - r + rank), (down, W_CODE, n - r))
    runs.repeat(rank, (up, W_CODE, n - rank))
    runs.repeat(rank, (down, W_CODE, n - rank))


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
                    rank_by_rank(r, num_microbatches, lambda runs, rank: zbv_order(runs, rank, r, num_microbatches)))
