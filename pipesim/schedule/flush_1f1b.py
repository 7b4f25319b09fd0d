"""PipeDream-Flush (1F1B): 1F1B within each minibatch, then a flush and the update."""

from __future__ import annotations

from pipesim.schedule.ir import Op, Schedule, U, WeightPolicy, one_stage_per_rank
from pipesim.schedule.one_f_one_b import one_f_one_b_order


def one_f_one_b(num_stages: int, num_microbatches: int, *, num_minibatches: int = 1) -> Schedule:
    """PipeDream-Flush, as PyTorch's Schedule1F1B runs it, one flush per minibatch.

    Each minibatch on stage s is the 1F1B order of its m microbatches followed by ``sUk``;
    activations of at most ``min(m, p - s)`` microbatches are held at once.
    """
    m = num_microbatches
    ranks: list[tuple[Op, ...]] = []
    for stage in range(num_stages):
        ops: list[Op] = []
        for step in range(num_minibatches):
            first = step * m
            for op in one_f_one_b_order(num_stages, stage, m):
                ops.append(Op(op.stage, op.kind, op.microbatch + first))
            ops.append(U(stage, step))
        ranks.append(tuple(ops))
    return Schedule(
        name="1f1b",
        num_stages=num_stages,
        num_microbatches=m,
        num_minibatches=num_minibatches,
        ranks=tuple(ranks),
        stage_to_rank=one_stage_per_rank(num_stages),
        weights=WeightPolicy.FLUSH,
    )
