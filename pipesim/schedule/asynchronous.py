"""1F1B over a continuous stream of microbatches with no flush, shared by the asynchronous schedules."""

from __future__ import annotations

from pipesim.schedule.ir import Op, OpKind, Schedule, U, WeightPolicy, one_stage_per_rank
from pipesim.schedule.one_f_one_b import one_f_one_b_order


def continuous_1f1b(
    name: str,
    num_stages: int,
    num_microbatches: int,
    num_minibatches: int,
    *,
    update_every: int,
    weights: WeightPolicy,
) -> Schedule:
    """1F1B across all ``K * m`` microbatches, with ``sUk`` after every ``update_every``-th backward.

    ``update_every = 1`` updates after every backward (PipeDream); ``update_every = m`` once per
    minibatch (2BW, PipeMare). Update k on a stage consumes the gradients of the backwards since
    update k-1.
    """
    total = num_microbatches * num_minibatches
    ranks: list[tuple[Op, ...]] = []
    for stage in range(num_stages):
        ops: list[Op] = []
        num_updates = 0
        for op in one_f_one_b_order(num_stages, stage, total):
            ops.append(op)
            if op.kind is OpKind.B and (op.microbatch + 1) % update_every == 0:
                ops.append(U(stage, num_updates))
                num_updates += 1
        ranks.append(tuple(ops))
    return Schedule(
        name=name,
        num_stages=num_stages,
        num_microbatches=num_microbatches,
        num_minibatches=num_minibatches,
        ranks=tuple(ranks),
        stage_to_rank=one_stage_per_rank(num_stages),
        weights=weights,
    )
