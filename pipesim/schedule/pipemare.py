"""PipeMare (MLSys'20): 1F1B across minibatches, one weight version, no stashing."""

from __future__ import annotations

from typing import Literal

from pipesim.schedule.ir import Schedule, WeightPolicy
from pipesim.schedule.one_f_one_b import one_f_one_b_schedule


def pipemare(
    num_stages: int,
    num_microbatches: int,
    *,
    num_minibatches: int = 1,
    update: Literal["minibatch", "microbatch"] = "minibatch",
) -> Schedule:
    """PipeMare on a 1F1B order.

    One version per stage: each F and each B uses the weights current when it runs. Stage s
    runs ``p - s - 1`` other backwards between the F and the B of a microbatch, so with one
    update per minibatch the discrepancy ``version(B) - version(F)`` averages ``(p - s - 1) / m``
    updates and never exceeds ``ceil((p - s - 1) / m)``; with one update per microbatch it is
    exactly ``p - s - 1`` in steady state. (The paper's hardware model, where a stage runs one
    forward and one backward per step, gives ``ceil((2(p - s) - 1) / m)`` instead.)
    """
    update_every = num_microbatches if update == "minibatch" else 1
    return one_f_one_b_schedule("pipemare", num_stages, num_microbatches, num_minibatches,
                                update_every=update_every, weights=WeightPolicy.SINGLE)
