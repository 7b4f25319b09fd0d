"""GPipe: every forward of a minibatch, then every backward, then the update (a flush)."""

from __future__ import annotations

from pipesim.schedule.ir import Schedule, WeightPolicy
from pipesim.schedule.one_f_one_b import one_f_one_b_schedule


def gpipe(num_stages: int, num_microbatches: int, *, num_minibatches: int = 1) -> Schedule:
    """GPipe's order, as PyTorch's ScheduleGPipe runs it, repeated per minibatch.

    Stage s, one minibatch of m microbatches (p = 3, m = 3; time runs right)::

        0F0 0F1 0F2                 0B0 0B1 0B2 0U0
            1F0 1F1 1F2         1B0 1B1 1B2 1U0
                2F0 2F1 2F2 2B0 2B1 2B2 2U0
    """
    return one_f_one_b_schedule("gpipe", num_stages, num_microbatches, num_minibatches,
                                weights=WeightPolicy.FLUSH, warmup_all=True)
