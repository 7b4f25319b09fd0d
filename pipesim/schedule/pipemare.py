"""PipeMare (MLSys'20): 1F1B across minibatches, one weight version, no stashing; or the paper's pipeline."""

from __future__ import annotations

from typing import Literal

from pipesim.errors import ConfigError
from pipesim.schedule.ir import Schedule, WeightPolicy
from pipesim.schedule.one_f_one_b import one_f_one_b_schedule

PIPEMARE_MODELS = ("1f1b", "paper")


def pipemare(
    num_stages: int,
    num_microbatches: int,
    *,
    num_minibatches: int = 1,
    update: Literal["minibatch", "microbatch"] = "minibatch",
    model: Literal["1f1b", "paper"] = "1f1b",
) -> Schedule:
    """PipeMare on a 1F1B order (``model="1f1b"``) or on the PipeMare paper's pipeline (``"paper"``).

    One version per stage: each F and each B uses the weights current when it runs. On a 1F1B
    order stage s runs ``p - s - 1`` other backwards between the F and the B of a microbatch, so
    with one update per minibatch the discrepancy ``version(B) - version(F)`` averages
    ``(p - s - 1) / m`` updates and never exceeds ``ceil((p - s - 1) / m)``; with one update
    per microbatch it is exactly ``p - s - 1`` in steady state.

    The paper (Yang et al., "PipeMare: Asynchronous Pipeline Parallel DNN Training", MLSys 2021)
    has a stage run one forward and one backward in every time step. Its order is 1F1B's with a
    warm-up of ``2(p - s) - 1`` forwards: F(i + w) and B(i) are the two ops of one step, which
    lowering times as one op of max(F, B) (``engine.chunks``). F of a step precedes the step's
    update, so the discrepancy is ``2(p - s) - 1`` updates per microbatch and at most
    ``ceil((2(p - s) - 1) / m)`` per minibatch.

    Raises:
        ConfigError: an unknown model.
    """
    if model not in PIPEMARE_MODELS:
        raise ConfigError("pipemare_model", model, f"must be one of {', '.join(PIPEMARE_MODELS)}")
    update_every = num_microbatches if update == "minibatch" else 1
    return one_f_one_b_schedule("pipemare", num_stages, num_microbatches, num_minibatches,
                                update_every=update_every, weights=WeightPolicy.SINGLE,
                                warmup_rounds=2 if model == "paper" else 1)
