"""Order facts of a schedule by column: per op its step, the input it waits for and where it sends."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pipesim.errors import ScheduleError
from pipesim.schedule.ir import (B_CODE, F_CODE, I_CODE, KIND_ORDER, NUM_KINDS, U_CODE, Op, Schedule, ScheduleTable, grid,
                                 read_only)

IntArray = npt.NDArray[np.int64]


def op_at(columns: ScheduleTable, g: int) -> Op:
    """The Op of flat index ``g``."""
    return Op(int(columns.stage[g]), KIND_ORDER[int(columns.kind[g])], int(columns.microbatch[g]))


def schedule_error(schedule: Schedule, g: int, reason: str) -> ScheduleError:
    """A ScheduleError for the op of flat index ``g``, with the grid marking it."""
    columns = schedule.table
    where = {(int(columns.rank[g]), int(columns.position[g]))}
    return ScheduleError(reason, grid(schedule.ranks, where))


def minibatch_column(schedule: Schedule) -> IntArray:
    """Step index of every op; a U belongs to the minibatch of the last non-U op before it
    on its rank (0 when there is none)."""
    columns = schedule.table
    n = columns.num_ops
    is_update = columns.kind == U_CODE
    own = columns.microbatch // schedule.num_microbatches
    last = np.maximum.accumulate(np.where(is_update, -1, np.arange(n, dtype=np.int64))) if n else own
    found = last >= columns.rank_offsets[columns.rank]
    return np.where(found, own[np.maximum(last, 0)], 0)


def wait_column(schedule: Schedule) -> IntArray:
    """Per op, the flat index of the op of another stage whose output it waits for, or -1.

    As ``schedule.deps.dependencies`` less same-stage inputs (the rank's order covers those):
    F(s, i) waits for F(s-1, i); B or I(s, i) for the op that sends (s+1, i)'s gradient:
    I(s+1, i) where the schedule has it, else B(s+1, i). Looking the kind up per
    (stage, microbatch) serves schedules that mix B and I/W (DualPipeV) as well as those
    with one kind throughout (``schedule.deps.backward_kinds``).

    Each output is awaited by at most one op (the engines rely on it).

    Raises:
        ScheduleError: the op it waits for is not in the schedule, or two ops wait for one output.
    """
    columns = schedule.table
    p, total = schedule.num_stages, schedule.total_microbatches
    stage, kind, micro = columns.stage, columns.kind, columns.microbatch
    inside = (stage >= 0) & (stage < p) & (micro >= 0) & (micro < total) & (kind != U_CODE)
    table = np.full(max(U_CODE * p * total, 1), -1, dtype=np.int64)
    known = np.flatnonzero(inside)
    table[(kind[known] * p + stage[known]) * total + micro[known]] = known
    wait = np.full(columns.num_ops, -1, dtype=np.int64)
    needs_forward = np.flatnonzero(inside & (kind == F_CODE) & (stage > 0))
    wait[needs_forward] = table[(F_CODE * p + stage[needs_forward] - 1) * total + micro[needs_forward]]
    needs_gradient = np.flatnonzero(inside & ((kind == B_CODE) | (kind == I_CODE)) & (stage + 1 < p))
    upstream = (stage[needs_gradient] + 1) * total + micro[needs_gradient]
    split = table[I_CODE * p * total + upstream]
    wait[needs_gradient] = np.where(split >= 0, split, table[B_CODE * p * total + upstream])
    for group, dep_kind, step in ((needs_forward, F_CODE, -1), (needs_gradient, gradient_code(columns), 1)):
        missing = group[wait[group] < 0]
        if missing.size:
            g = int(missing[0])
            dep = Op(int(stage[g]) + step, KIND_ORDER[dep_kind], int(micro[g]))
            raise schedule_error(schedule, g, f"{op_at(columns, g)} waits for {dep}, which is not in the schedule")
    twice = np.flatnonzero(np.bincount(wait[wait >= 0], minlength=1) > 1)
    if twice.size:
        g = int(np.flatnonzero(wait == twice[0])[-1])
        raise schedule_error(schedule, g, f"{op_at(columns, g)} waits for {op_at(columns, int(twice[0]))}, "
                             "whose output another op already waits for")
    return wait


def gradient_code(columns: ScheduleTable) -> int:
    """Code of the kind a missing upstream gradient is named by in errors: I when the schedule
    splits any backward, else B (which op sends a gradient is decided per op, see
    ``send_links``)."""
    return I_CODE if bool((columns.kind == I_CODE).any()) else B_CODE


@dataclass(frozen=True)
class SendLinks:
    """The (stage, direction) pairs that ops send over, numbered for a schedule of p stages.

    F of stage s < p - 1 sends its activation to s + 1 over link s; B or I of stage s > 0
    sends its gradient (the size of stage s-1's output) to s - 1 over link p - 1 + s - 1 (a
    schedule runs B or I for each stage and microbatch, never both, so the one it runs
    sends); every other op uses the last link, 2 (p - 1), which sends nothing. Per link:

    Attributes:
        stage: the sending stage (0 for the last link).
        target: the receiving stage, or -1.
        is_forward: True for the activation links.
        boundary: the stage whose output size the send carries, or -1.
        rank: the receiving rank, or -1.
        is_remote: True where the receiving rank is not the sending stage's.
        pair: the directed rank pair a remote link crosses, numbered in order of (sending rank,
            receiving rank) over the pairs that remote links cross; -1 for the others.
    """

    stage: IntArray
    target: IntArray
    is_forward: npt.NDArray[np.bool_]
    boundary: IntArray
    rank: IntArray
    is_remote: npt.NDArray[np.bool_]
    pair: IntArray


def send_links(schedule: Schedule) -> SendLinks:
    """The schedule's send links (``SendLinks``), with the ranks at both ends."""
    p = schedule.num_stages
    inner = np.arange(p - 1, dtype=np.int64)
    stage = np.concatenate([inner, inner + 1, [0]])
    target = np.concatenate([inner + 1, inner, [-1]])
    is_forward = np.arange(2 * p - 1) < p - 1
    stage_to_rank = np.asarray(schedule.stage_to_rank, dtype=np.int64)
    rank = np.where(target >= 0, stage_to_rank[np.maximum(target, 0)], -1)
    is_remote = (rank >= 0) & (rank != stage_to_rank[stage])
    num_ranks = max(schedule.num_ranks, 1)
    key = stage_to_rank[stage] * num_ranks + rank
    # Pairs numbered in order of (sending rank, receiving rank), in memory of the links' count (a
    # ranks x ranks table took 6.4 GB at 20,000 ranks).
    pair = np.full(len(key), -1, dtype=np.int64)
    pair[is_remote] = np.unique(key[is_remote], return_inverse=True)[1]
    return SendLinks(stage=stage, target=target, is_forward=is_forward,
                     boundary=np.concatenate([inner, inner, [-1]]), rank=rank, is_remote=is_remote, pair=pair)


def send_link_column(schedule: Schedule) -> IntArray:
    """Per op, the index of the link its output goes over (``send_links``)."""
    p = schedule.num_stages
    link = np.full((p, NUM_KINDS), 2 * (p - 1), dtype=np.int64)
    inner = np.arange(p - 1, dtype=np.int64)
    link[:-1, F_CODE] = inner
    link[1:, B_CODE] = link[1:, I_CODE] = p - 1 + inner
    return link.ravel().take(schedule.stage_kind)

