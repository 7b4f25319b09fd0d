"""GPipe: every forward of a minibatch, then every backward, then the update (a flush)."""

from __future__ import annotations

from pipesim.schedule.ir import B, F, Op, Schedule, U, WeightPolicy, one_stage_per_rank


def gpipe(num_stages: int, num_microbatches: int, *, num_minibatches: int = 1) -> Schedule:
    """GPipe's order, as PyTorch's ScheduleGPipe runs it, repeated per minibatch.

    Stage s, one minibatch of m microbatches (p = 3, m = 3; time runs right)::

        0F0 0F1 0F2                 0B0 0B1 0B2 0U0
            1F0 1F1 1F2         1B0 1B1 1B2 1U0
                2F0 2F1 2F2 2B0 2B1 2B2 2U0
    """
    m = num_microbatches
    ranks: list[tuple[Op, ...]] = []
    for stage in range(num_stages):
        ops: list[Op] = []
        for step in range(num_minibatches):
            first = step * m
            ops += [F(stage, first + i) for i in range(m)]
            ops += [B(stage, first + i) for i in range(m)]
            ops.append(U(stage, step))
        ranks.append(tuple(ops))
    return Schedule(
        name="gpipe",
        num_stages=num_stages,
        num_microbatches=m,
        num_minibatches=num_minibatches,
        ranks=tuple(ranks),
        stage_to_rank=one_stage_per_rank(num_stages),
        weights=WeightPolicy.FLUSH,
    )
