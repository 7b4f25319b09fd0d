"""PipeDream-2BW (ICML'21): 1F1B across minibatches, double-buffered weights, one-step delay."""

from __future__ import annotations

from pipesim.errors import ConfigError
from pipesim.schedule.ir import Schedule, WeightPolicy
from pipesim.schedule.one_f_one_b import one_f_one_b_schedule


def two_bw(num_stages: int, num_microbatches: int, *, num_minibatches: int = 1) -> Schedule:
    """PipeDream-2BW.

    Gradients accumulate over the m microbatches of a minibatch; ``sUk`` follows the last
    backward of minibatch k. Minibatch t runs forward and backward on version ``max(0, t-1)``,
    so ``W(t+1) = W(t) - lr * grad(W(t-1))`` on every stage, and at most two versions live.

    Raises:
        ConfigError: ``num_microbatches < num_stages``: version t-1 would not exist yet when
            minibatch t starts on stage 0.
    """
    if num_microbatches < num_stages:
        raise ConfigError(
            "num_microbatches", num_microbatches,
            f"must be >= num_stages for 2bw, got {num_microbatches} < {num_stages}",
        )
    return one_f_one_b_schedule("2bw", num_stages, num_microbatches, num_minibatches,
                                update_every=num_microbatches, weights=WeightPolicy.DOUBLE_BUFFER)
