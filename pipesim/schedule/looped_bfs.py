"""Looped BFS (breadth-first pipeline), as torch's ScheduleLoopedBFS orders it."""

from __future__ import annotations

import numpy as np

from pipesim.schedule.ir import B_CODE, F_CODE, Schedule, ScheduleTable
from pipesim.schedule.multi_stage import assemble, loop_placement, ranks_and_stages


def looped_bfs_table(num_ranks: int, stages_per_rank: int, num_microbatches: int) -> ScheduleTable:
    """One minibatch on every rank: every forward of its first stage, then of its next, ...; then
    the backwards of its last stage, then of the one before, each in falling microbatch order."""
    r, v, m = num_ranks, stages_per_rank, num_microbatches
    local = np.repeat(np.arange(v, dtype=np.int64), m)
    stage = np.arange(r, dtype=np.int64)[:, None] + r * np.concatenate([local, local[::-1]])[None, :]
    micro = np.tile(np.arange(m, dtype=np.int64), v)
    kind = np.repeat(np.array([F_CODE, B_CODE], dtype=np.int64), v * m)
    return ScheduleTable(rank_offsets=np.arange(r + 1, dtype=np.int64) * 2 * v * m, stage=stage.ravel(),
                         kind=np.tile(kind, r), microbatch=np.tile(np.concatenate([micro, micro[::-1]]), r))


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
    return assemble("looped-bfs", num_stages, num_microbatches, num_minibatches, loop_placement(r, num_stages),
                    looped_bfs_table(r, v, num_microbatches))
