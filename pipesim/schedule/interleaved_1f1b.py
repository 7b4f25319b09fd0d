"""Interleaved 1F1B (Megatron's virtual pipeline), as torch's ScheduleInterleaved1F1B orders it."""

from __future__ import annotations

import numpy as np

from pipesim.errors import ConfigError
from pipesim.schedule.ir import B_CODE, F_CODE, I_CODE, W_CODE, Schedule, ScheduleTable
from pipesim.schedule.multi_stage import assemble, loop_placement, order_by_key, ranks_and_stages


def rounds_of(name: str, num_ranks: int, num_microbatches: int) -> int:
    """Microbatches per round, ``m // max(1, m // R)``; m must split into whole rounds.

    Raises:
        ConfigError: m is not a multiple of its number of rounds (torch raises there too).
    """
    num_rounds = max(1, num_microbatches // num_ranks)
    if num_microbatches % num_rounds:
        raise ConfigError("num_microbatches", num_microbatches,
                          f"{name} needs a multiple of its number of rounds max(1, m // num_ranks) = "
                          f"{num_rounds}, as torch's schedule does")
    return num_microbatches // num_rounds


def interleaved_table(
    num_ranks: int,
    stages_per_rank: int,
    num_microbatches: int,
    per_round: int,
    *,
    zero_bubble: bool,
) -> ScheduleTable:
    """One minibatch on every rank of the depth-first interleaved schedules.

    Rank r's ops are counted in steps. The first ``warmup`` steps are forwards; then each
    step is a forward and a backward (1F1B); the last ``warmup`` steps are backwards only.
    Forwards walk the rank's stages in blocks of ``per_round`` microbatches, rising
    (r, r+R, ..., then r again); backwards walk them falling, starting from the rank's last
    stage. The warm-up covers the later local stages of one round plus ``factor`` steps for
    each rank downstream: factor 2 for interleaved 1F1B (a forward and a backward per hop),
    1 for the zero-bubble variant, which runs I in place of B and adds the W of the oldest
    pending backward after each step once r backwards are pending.

    So the j-th forward runs in step j and the j-th backward in step ``warmup + j``, both on
    local stage ``j // per_round % V`` (counted down for backwards) and microbatch
    ``j // (per_round V) * per_round + j % per_round``; the j-th W follows the backward of
    step ``warmup + j + r``, or closes the order when there is none. In a step the forward
    comes first, then the backward, then the W.
    """
    v, m = stages_per_rank, num_microbatches
    n = m * v
    rank = np.arange(num_ranks, dtype=np.int64)[:, None]
    warmup = np.minimum((v - 1) * per_round + (1 if zero_bubble else 2) * (num_ranks - 1 - rank), n)
    j = np.arange(n, dtype=np.int64)[None, :]
    local = j // per_round % v
    microbatch = j // (per_round * v) * per_round + j % per_round
    backward_stage = (v - 1 - local) * num_ranks + rank
    groups = [(3 * j, local * num_ranks + rank, F_CODE, microbatch),
              (3 * (warmup + j) + 1, backward_stage, I_CODE if zero_bubble else B_CODE, microbatch)]
    if zero_bubble:
        after = np.where(j + rank < n, 3 * (warmup + j + rank) + 2, 3 * (warmup + n) + j)
        groups.append((after, backward_stage, W_CODE, microbatch))
    span = 3 * (int(warmup.max()) + n) + n
    return order_by_key(num_ranks, span, *groups)


def interleaved_1f1b(
    num_stages: int,
    num_microbatches: int,
    *,
    num_minibatches: int = 1,
    num_ranks: int | None = None,
) -> Schedule:
    """Interleaved 1F1B over ``num_ranks`` ranks holding ``num_stages / num_ranks`` stages each.

    Rank r holds stages r, r+R, ... (loop placement). Equal to the executed order of torch
    2.13's ScheduleInterleaved1F1B for the same R, stages per rank and m; like it, rejects an
    m that is not a multiple of ``max(1, m // R)``. R = 2, V = 2, m = 4::

        rank 0: 0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3
        rank 1: 1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3
    """
    r, v = ranks_and_stages("interleaved-1f1b", num_stages, num_ranks)
    per_round = rounds_of("interleaved-1f1b", r, num_microbatches)
    return assemble("interleaved-1f1b", num_stages, num_microbatches, num_minibatches, loop_placement(r, num_stages),
                    interleaved_table(r, v, num_microbatches, per_round, zero_bubble=False))
