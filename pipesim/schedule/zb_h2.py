"""ZB-H2, the zero-bubble paper's zero-bubble handcrafted schedule (one stage per rank, more memory)."""

from __future__ import annotations

from pipesim.schedule.ir import Schedule
from pipesim.schedule.multi_stage import assemble, rank_by_rank
from pipesim.schedule.zb_h1 import one_stage_per_rank_only, split_1f1b_order


def zb_h2(
    num_stages: int,
    num_microbatches: int,
    *,
    num_minibatches: int = 1,
    num_ranks: int | None = None,
) -> Schedule:
    """ZB-H2 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, section 2.2).

    Stage s warms up with ``2(p-1-s)`` forwards, which fills the wait for its first gradient,
    and runs its W ``2s`` microbatches behind its I, which lets the I's of the tail flow up
    without waiting: each stage is busy for one unbroken stretch and the minibatch is a
    parallelogram, so consecutive minibatches interlock. Every stage holds 2p-1 microbatches
    between F and W. With uniform stages, m >= 2p-1, ``tW <= min(tF, tI)`` and no
    synchronisation between minibatches, the steady-state iteration time is
    ``m(tF+tI+tW) + (p-1)(tF+tI-2tW)``: zero bubble when the three are equal. p = 3, m = 5::

        stage 0: 0F0 0F1 0F2 0F3 0F4 0I0 0W0 0I1 0W1 0I2 0W2 0I3 0W3 0I4 0W4
        stage 1: 1F0 1F1 1F2 1I0 1F3 1I1 1F4 1I2 1W0 1I3 1W1 1I4 1W2 1W3 1W4
        stage 2: 2F0 2I0 2F1 2I1 2F2 2I2 2F3 2I3 2F4 2I4 2W0 2W1 2W2 2W3 2W4
    """
    one_stage_per_rank_only("zb-h2", num_stages, num_ranks)
    p = num_stages
    m = num_microbatches
    return assemble("zb-h2", p, m, num_minibatches, tuple(range(p)), rank_by_rank(
        p, m, lambda runs, s: split_1f1b_order(runs, s, m, warmup=2 * (p - 1 - s), weight_lag=2 * s)))
