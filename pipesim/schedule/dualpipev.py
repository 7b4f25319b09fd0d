"""DualPipeV (DeepSeek's DualPipe folded into a V), as torch's ScheduleDualPipeV orders it."""

from __future__ import annotations

from pipesim.errors import ConfigError
from pipesim.schedule.ir import B_CODE, F_CODE, I_CODE, W_CODE, Op, Schedule, ScheduleTable
from pipesim.schedule.multi_stage import (
    Runs,
    assemble,
    follow_inputs,
    rank_by_rank,
    ranks_and_stages,
    require_stages_per_rank,
    v_placement,
)


def dualpipev_runs(runs: Runs, rank: int, num_ranks: int, num_microbatches: int) -> None:
    """One minibatch on ``rank`` (stages ``down = rank`` and ``up = 2R-1-rank``), as runs (``Runs``).

    torch pairs a forward with a backward of the other stage in one OVERLAP_F_B action and runs
    them one after the other, forward first; here the pair is written as those two ops. A full
    backward (B) and a split one (I) count on one counter per stage; each I queues its W, which
    runs later, oldest first (``follow_inputs`` names them). The eight phases, with k = R-1-rank:
    (1) 2k down F; (2) rank+1 pairs (down F, up F); (3) k triples (up I, its W, up F);
    (4) m-2R+rank+1 rounds of (down F, up B) and (up F, down B); (5) k pairs (up B, then
    up F + down B); (6) rank+1 pairs (up, down) of B turning into I halfway, the odd ranks one
    op earlier; (7) k pairs (pending W, down I); (8) rank+1 pending W.
    """
    r, m = num_ranks, num_microbatches
    down, up = rank, 2 * r - 1 - rank
    k = r - 1 - rank
    pending = (down, W_CODE, 0)  # a W named by follow_inputs
    runs.repeat(2 * k, (down, F_CODE, 0))
    runs.repeat(rank + 1, (down, F_CODE, 2 * k), (up, F_CODE, 0))
    runs.repeat(k, (up, I_CODE, 0), (up, W_CODE, 0), (up, F_CODE, rank + 1))
    steady = m - 2 * r + rank + 1
    runs.repeat(steady, (down, F_CODE, 2 * r - rank - 1), (up, B_CODE, k), (up, F_CODE, r), (down, B_CODE, 0))
    runs.repeat(k, (up, B_CODE, m - r), (up, F_CODE, m - r + rank + 1), (down, B_CODE, steady))
    up_next, down_next, half = m - rank - 1, m - r, (rank + 1) // 2
    runs.repeat(half, (up, B_CODE, up_next), (down, B_CODE, down_next))
    if rank % 2:
        runs.repeat(rank + 1 - half, (up, I_CODE, up_next + half), (down, I_CODE, down_next + half))
    else:
        runs.repeat(1, (up, B_CODE, up_next + half), (down, I_CODE, down_next + half))
        runs.repeat(rank - half, (up, I_CODE, up_next + half + 1), (down, I_CODE, down_next + half + 1))
    runs.repeat(k, pending, (down, I_CODE, down_next + rank + 1))
    runs.repeat(rank + 1, pending)


def dualpipev_table(num_ranks: int, num_microbatches: int) -> ScheduleTable:
    """One minibatch on every rank (``dualpipev_runs``), each W named after its I."""
    return follow_inputs(rank_by_rank(num_ranks, num_microbatches,
                                      lambda runs, rank: dualpipev_runs(runs, rank, num_ranks, num_microbatches)))


def dualpipev_order(rank: int, num_ranks: int, num_microbatches: int) -> list[Op]:
    """One minibatch on ``rank`` as Op objects (a view of ``dualpipev_runs``)."""
    one = rank_by_rank(1, num_microbatches, lambda runs, _: dualpipev_runs(runs, rank, num_ranks, num_microbatches))
    return list(follow_inputs(one).to_ranks()[0])


def dualpipev(
    num_stages: int,
    num_microbatches: int,
    *,
    num_minibatches: int = 1,
    num_ranks: int | None = None,
) -> Schedule:
    """DualPipeV on ``num_ranks`` ranks with two stages each (rank r: stages r and 2R-1-r).

    Mixes full backwards (B) and split ones (I, W) per microbatch. Equal to the executed order
    of torch 2.13's ScheduleDualPipeV with every OVERLAP_F_B expanded into its forward and
    its backward; like it, needs exactly 2 stages per rank and m >= the number of stages.
    R = 2, m = 4::

        rank 0: 0F0 0F1 0F2 3F0 3I0 3W0 3F1 0F3 3B1 3F2 0B0 3B2 3F3 0B1 3B3 0I2 0W2 0I3 0W3
        rank 1: 1F0 2F0 1F1 2F1 1F2 2B0 2F2 1B0 1F3 2B1 2F3 1B1 2B2 1B2 2I3 1I3 2W3 1W3

    Raises:
        ConfigError: not 2 stages per rank, or fewer microbatches than stages.
    """
    r, v = ranks_and_stages("dualpipev", num_stages, num_ranks)
    require_stages_per_rank("dualpipev", "ScheduleDualPipeV", v, 2)
    if num_microbatches < num_stages:
        raise ConfigError("num_microbatches", num_microbatches,
                          f"must be >= the number of stages for dualpipev, got {num_microbatches} < {num_stages}")
    return assemble("dualpipev", num_stages, num_microbatches, num_minibatches, v_placement(r),
                    dualpipev_table(r, num_microbatches))
