"""DualPipeV (DeepSeek's DualPipe folded into a V), as torch's ScheduleDualPipeV orders it."""

from __future__ import annotations

from collections import deque

from pipesim.errors import ConfigError
from pipesim.schedule.ir import Op, OpKind, Schedule, ScheduleTable
from pipesim.schedule.multi_stage import (
    Counters,
    assemble,
    ranks_and_stages,
    require_stages_per_rank,
    v_placement,
)

F, B, I, W = OpKind.F, OpKind.B, OpKind.I, OpKind.W


class _Rank:
    """Hands out one rank's ops: a full backward takes the I counter and counts as its W too;
    an I queues its W, which ``weight`` later emits oldest first."""

    def __init__(self) -> None:
        self.counters = Counters()
        self.pending: deque[Op] = deque()
        self.ops: list[Op] = []

    def forward(self, stage: int) -> None:
        self.ops.append(self.counters.take(stage, F))

    def backward(self, stage: int, *, split: bool) -> None:
        index = self.counters.take(stage, I).microbatch
        if split:
            self.ops.append(Op(stage, I, index))
            self.pending.append(Op(stage, W, index))
        else:
            self.ops.append(Op(stage, B, index))

    def weight(self) -> None:
        if self.pending:
            self.ops.append(self.pending.popleft())


def dualpipev_order(rank: int, num_ranks: int, num_microbatches: int) -> list[Op]:
    """One minibatch on ``rank`` (stages ``down = rank`` and ``up = 2R-1-rank``).

    torch pairs a forward with a backward of the other stage in one OVERLAP_F_B action and runs
    them one after the other, forward first; here the pair is written as those two ops. The
    eight phases, with k = R-1-rank:
    (1) 2k down F; (2) rank+1 pairs (down F, up F); (3) k triples (up I, pending W, up F);
    (4) m-2R+rank+1 rounds of (down F, up B) and (up F, down B); (5) k pairs (up B, then
    up F + down B); (6) rank+1 pairs (up, down) of B turning into I halfway, the odd ranks one
    op earlier; (7) k pairs (pending W, down B or I); (8) rank+1 pending W.
    """
    R, m = num_ranks, num_microbatches
    down, up = rank, 2 * R - 1 - rank
    k = R - 1 - rank
    out = _Rank()
    for _ in range(2 * k):
        out.forward(down)
    for _ in range(rank + 1):
        out.forward(down)
        out.forward(up)
    for _ in range(k):
        out.backward(up, split=True)
        out.weight()
        out.forward(up)
    for _ in range(m - 2 * R + rank + 1):
        out.forward(down)
        out.backward(up, split=False)
        out.forward(up)
        out.backward(down, split=False)
    for _ in range(k):
        out.backward(up, split=False)
        out.forward(up)
        out.backward(down, split=False)
    split = False
    for i in range(rank + 1):
        if i == (rank + 1) // 2 and rank % 2 == 1:
            split = True
        out.backward(up, split=split)
        if i == (rank + 1) // 2 and rank % 2 == 0:
            split = True
        out.backward(down, split=split)
    for _ in range(k):
        out.weight()
        out.backward(down, split=split)
    for _ in range(rank + 1):
        out.weight()
    return out.ops


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
                    ScheduleTable.from_ranks([dualpipev_order(rank, r, num_microbatches) for rank in range(r)]))
