"""PipeDream-Flush (1F1B): 1F1B within each minibatch, then a flush and the update."""

from __future__ import annotations

from pipesim.schedule.ir import Schedule, WeightPolicy
from pipesim.schedule.one_f_one_b import one_f_one_b_schedule


def one_f_one_b(num_stages: int, num_microbatches: int, *, num_minibatches: int = 1) -> Schedule:
    """PipeDream-Flush, as PyTorch's Schedule1F1B runs it, one flush per minibatch.

    Each minibatch on stage s is the 1F1B order of its m microbatches followed by ``sUk``;
    activations of at most ``min(m, p - s)`` microbatches are held at once. Stage s, p = 3, m = 4::

        s=0: 0F0 0F1 0F2 0B0 0F3 0B1     0B2 0B3 0U0
        s=1:     1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3 1U0
        s=2:         2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3 2U0

    PyTorch counts the warm-up as ``min(m, p - s)`` forwards followed by backward/forward
    pairs: the same sequence.
    """
    return one_f_one_b_schedule("1f1b", num_stages, num_microbatches, num_minibatches, weights=WeightPolicy.FLUSH)
