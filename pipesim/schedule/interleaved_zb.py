"""Interleaved zero bubble (ZB1P), as torch's ScheduleInterleavedZeroBubble orders it."""

from __future__ import annotations

from pipesim.schedule.interleaved_1f1b import interleaved_table, rounds_of
from pipesim.schedule.ir import Schedule
from pipesim.schedule.multi_stage import assemble, loop_placement, ranks_and_stages


def interleaved_zb(
    num_stages: int,
    num_microbatches: int,
    *,
    num_minibatches: int = 1,
    num_ranks: int | None = None,
) -> Schedule:
    """The interleaved 1F1B order with backward split into I and W, and a one-step warm-up per hop.

    Rank r runs I where interleaved 1F1B runs B and, once r backwards are pending, adds the W
    of the oldest one after each step; the remaining W close the minibatch. Equal to the
    executed order of torch 2.13's ScheduleInterleavedZeroBubble (same arguments, same
    rejection of m not a multiple of ``max(1, m // R)``). R = 2, V = 2, m = 2::

        rank 0: 0F0 0F1 2F0 2F1 2I0 2W0 2I1 2W1 0I0 0W0 0I1 0W1
        rank 1: 1F0 1F1 3F0 3I0 3F1 3I1 3W0 1I0 3W1 1I1 1W0 1W1
    """
    r, v = ranks_and_stages("interleaved-zb", num_stages, num_ranks)
    per_round = rounds_of("interleaved-zb", r, num_microbatches)
    return assemble("interleaved-zb", num_stages, num_microbatches, num_minibatches, loop_placement(r, num_stages),
                    interleaved_table(r, v, num_microbatches, per_round, zero_bubble=True))
