"""Interleaved 1F1B (Megatron's virtual pipeline), as torch's ScheduleInterleaved1F1B orders it."""

from __future__ import annotations

from pipesim.errors import ConfigError
from pipesim.schedule.ir import Op, OpKind, Schedule
from pipesim.schedule.multi_stage import Counters, assemble, loop_placement, ranks_and_stages


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


def interleaved_order(
    rank: int,
    num_ranks: int,
    stages_per_rank: int,
    num_microbatches: int,
    per_round: int,
    *,
    zero_bubble: bool,
) -> list[Op]:
    """One minibatch on ``rank`` of the depth-first interleaved schedules.

    The rank's ops are counted in steps. The first ``warmup`` steps are forwards; then each
    step is a forward and a backward (1F1B); the last ``warmup`` steps are backwards only.
    Forwards walk the rank's stages in blocks of ``per_round`` microbatches, rising
    (r, r+R, ..., then r again); backwards walk them falling, starting from the rank's last
    stage. The warm-up covers the later local stages of one round plus ``factor`` steps for
    each rank downstream: factor 2 for interleaved 1F1B (a forward and a backward per hop),
    1 for the zero-bubble variant, which runs I in place of B and adds the W of the oldest
    pending backward after each step once ``rank`` backwards are pending.
    """
    r, v, m = rank, stages_per_rank, num_microbatches
    factor = 1 if zero_bubble else 2
    warmup = min((v - 1) * per_round + factor * (num_ranks - 1 - r), m * v)
    total_steps = m * v + warmup
    backward_kind = OpKind.I if zero_bubble else OpKind.B

    def forward_stage(step: int) -> int:
        return (step // per_round) % v * num_ranks + r

    def backward_stage(step: int) -> int:
        return (v - 1 - (step - warmup) // per_round % v) * num_ranks + r

    counters = Counters()
    ops: list[Op] = []
    backward_steps: list[int] = []
    weights_done = 0
    for step in range(total_steps):
        if step < m * v:
            ops.append(counters.take(forward_stage(step), OpKind.F))
        if step >= warmup:
            ops.append(counters.take(backward_stage(step), backward_kind))
            backward_steps.append(step)
            if zero_bubble and step - warmup >= r:
                ops.append(counters.take(backward_stage(backward_steps[weights_done]), OpKind.W))
                weights_done += 1
    while zero_bubble and weights_done < len(backward_steps):
        ops.append(counters.take(backward_stage(backward_steps[weights_done]), OpKind.W))
        weights_done += 1
    return ops


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
    return assemble(
        "interleaved-1f1b", num_stages, num_microbatches, num_minibatches, loop_placement(r, num_stages),
        lambda rank, m: interleaved_order(rank, r, v, m, per_round, zero_bubble=False),
    )
