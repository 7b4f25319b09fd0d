"""Looped BFS (breadth-first pipeline), as torch's ScheduleLoopedBFS orders it."""

from __future__ import annotations

from pipesim.schedule.ir import B, F, Op, Schedule
from pipesim.schedule.multi_stage import assemble, loop_placement, ranks_and_stages


def looped_bfs_order(rank: int, num_ranks: int, stages_per_rank: int, num_microbatches: int) -> list[Op]:
    """One minibatch on ``rank``: every forward of its first stage, then of its next, ...; then the
    backwards of its last stage, then of the one before, each in falling microbatch order."""
    stages = [rank + local * num_ranks for local in range(stages_per_rank)]
    ops = [F(stage, i) for stage in stages for i in range(num_microbatches)]
    ops += [B(stage, i) for stage in reversed(stages) for i in reversed(range(num_microbatches))]
    return ops


def looped_bfs(
    num_stages: int,
    num_microbatches: int,
    *,
    num_minibatches: int = 1,
    num_ranks: int | None = None,
) -> Schedule:
    """Looped BFS over ``num_ranks`` ranks (loop placement: rank r holds r, r+R, ...).

    Equal to the executed order of torch 2.13's ScheduleLoopedBFS. R = 2, V = 2, m = 2::

        rank 0: 0F0 0F1 2F0 2F1 2B1 2B0 0B1 0B0
        rank 1: 1F0 1F1 3F0 3F1 3B1 3B0 1B1 1B0
    """
    r, v = ranks_and_stages("looped-bfs", num_stages, num_ranks)
    return assemble(
        "looped-bfs", num_stages, num_microbatches, num_minibatches, loop_placement(r, num_stages),
        lambda rank, m: looped_bfs_order(rank, r, v, m),
    )
