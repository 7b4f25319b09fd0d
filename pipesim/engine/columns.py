"""A schedule as columns: per op its rank, position, stage, kind, microbatch, version and input."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pipesim.errors import ScheduleError
from pipesim.schedule.ir import (B_CODE, F_CODE, I_CODE, KIND_CODES, KIND_ORDER, U_CODE, W_CODE, Op, OpKind, Schedule,
                                 WeightPolicy, grid)

IntArray = npt.NDArray[np.int64]



@dataclass(frozen=True, eq=False)
class ScheduleColumns:
    """Every op of a schedule, ranks one after another, each rank's ops in its order.

    Op ``g`` of the flat layout is op ``position[g]`` of rank ``rank[g]``; rank ``r`` holds
    ``rank_offsets[r]:rank_offsets[r + 1]``. Kinds are codes into ``KIND_ORDER``.
    """

    rank_offsets: IntArray
    rank: IntArray
    position: IntArray
    stage: IntArray
    kind: IntArray
    microbatch: IntArray

    @property
    def num_ops(self) -> int:
        """Number of ops."""
        return int(self.stage.shape[0])


def schedule_columns(schedule: Schedule) -> ScheduleColumns:
    """Read the schedule's ops into columns (one pass over the Op objects)."""
    lengths = [len(ops) for ops in schedule.ranks]
    total = sum(lengths)
    flat = [op for ops in schedule.ranks for op in ops]
    codes = KIND_CODES
    stage = np.fromiter((op.stage for op in flat), np.int64, total)
    kind = np.fromiter((codes[op.kind] for op in flat), np.int64, total)
    microbatch = np.fromiter((op.microbatch for op in flat), np.int64, total)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    rank = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    position = np.arange(total, dtype=np.int64) - offsets[rank]
    return ScheduleColumns(rank_offsets=offsets, rank=rank, position=position, stage=stage, kind=kind,
                           microbatch=microbatch)


def _op(columns: ScheduleColumns, g: int) -> Op:
    return Op(int(columns.stage[g]), KIND_ORDER[int(columns.kind[g])], int(columns.microbatch[g]))


def _fail(schedule: Schedule, columns: ScheduleColumns, g: int, reason: str) -> ScheduleError:
    where = {(int(columns.rank[g]), int(columns.position[g]))}
    return ScheduleError(reason, grid(schedule.ranks, where))


def minibatch_column(schedule: Schedule, columns: ScheduleColumns) -> IntArray:
    """Step index of every op; a U belongs to the minibatch of the last non-U op before it
    on its rank (0 when there is none)."""
    n = columns.num_ops
    is_update = columns.kind == U_CODE
    own = columns.microbatch // schedule.num_microbatches
    last = np.maximum.accumulate(np.where(is_update, -1, np.arange(n, dtype=np.int64))) if n else own
    found = last >= columns.rank_offsets[columns.rank]
    return np.where(found, own[np.maximum(last, 0)], 0)


def _updates_before(columns: ScheduleColumns) -> IntArray:
    """Per op, how many U ops of its stage come before it (its stage's current version).

    A stage lives on one rank, so the flat order restricted to a stage is that rank's order.
    """
    is_update = (columns.kind == U_CODE).astype(np.int64)
    order = np.argsort(columns.stage, kind="stable")
    before = np.cumsum(is_update[order]) - is_update[order]
    stages = columns.stage[order]
    first = np.searchsorted(stages, stages, side="left")
    now: IntArray = np.empty_like(before)
    now[order] = before - before[first]
    return now


def _forward_index(schedule: Schedule, columns: ScheduleColumns) -> IntArray:
    """Per op, the flat index of the F of its stage and microbatch, or -1."""
    p, total = schedule.num_stages, schedule.total_microbatches
    inside = (columns.stage >= 0) & (columns.stage < p) & (columns.microbatch >= 0) & (columns.microbatch < total)
    key = np.where(inside, columns.stage * total + columns.microbatch, 0)
    table = np.full(max(p * total, 1), -1, dtype=np.int64)
    forwards = np.flatnonzero((columns.kind == F_CODE) & inside)
    table[key[forwards][::-1]] = forwards[::-1]  # the first F wins on a duplicate
    return np.where(inside & (columns.kind != U_CODE), table[key], -1)


def version_column(schedule: Schedule, columns: ScheduleColumns, minibatch: IntArray) -> IntArray:
    """The weight version every op uses, as ``schedule.versions.assign_versions`` gives it.

    Same rules and the same errors, computed by column (a test holds the two together).

    Raises:
        ScheduleError: DOUBLE_BUFFER asks for a version not produced yet, or FLUSH sees a
            backward on a newer version than its forward.
    """
    policy = schedule.weights
    now = _updates_before(columns)
    is_update = columns.kind == U_CODE
    index = np.arange(columns.num_ops, dtype=np.int64)
    forward = _forward_index(schedule, columns)
    seen = (forward >= 0) & (forward < index)  # the F ran earlier on the rank
    if policy is WeightPolicy.DOUBLE_BUFFER:
        version = np.where(is_update, now, np.maximum(0, minibatch - 1))
        bad = np.flatnonzero(version > now)
        if bad.size:
            g = int(bad[0])
            raise _fail(schedule, columns, g,
                        f"{_op(columns, g)} needs weight version {int(version[g])} but stage "
                        f"{int(columns.stage[g])} has only made {int(now[g])}; "
                        f"2bw needs num_microbatches >= num_stages")
        return version
    if policy is WeightPolicy.STASH:
        stashed = seen & (columns.kind != F_CODE)
        return np.where(stashed, now[np.maximum(forward, 0)], now)
    if policy is WeightPolicy.FLUSH:
        check = seen & (columns.kind != F_CODE) & ~is_update
        bad = np.flatnonzero(check & (now[np.maximum(forward, 0)] != now))
        if bad.size:
            g = int(bad[0])
            raise _fail(schedule, columns, g,
                        f"{_op(columns, g)} runs on version {int(now[g])} but its forward ran on "
                        f"{int(now[forward[g]])}: a flush schedule must not update between them")
    return now


def wait_column(schedule: Schedule, columns: ScheduleColumns) -> IntArray:
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
            raise _fail(schedule, columns, g, f"{_op(columns, g)} waits for {dep}, which is not in the schedule")
    awaited = np.sort(wait[wait >= 0])
    twice = awaited[1:][awaited[1:] == awaited[:-1]]
    if twice.size:
        g = int(np.flatnonzero(wait == twice[0])[-1])
        raise _fail(schedule, columns, g, f"{_op(columns, g)} waits for {_op(columns, int(twice[0]))}, "
                    "whose output another op already waits for")
    return wait


def gradient_code(columns: ScheduleColumns) -> int:
    """Code of the kind a missing upstream gradient is named by in errors: I when the schedule
    splits any backward, else B (which op sends a gradient is decided per op, see
    ``send_target_column``)."""
    return I_CODE if bool((columns.kind == I_CODE).any()) else B_CODE


def send_target_column(schedule: Schedule, columns: ScheduleColumns) -> IntArray:
    """Per op, the stage that receives its output (activation or gradient), or -1.

    F sends its activation downstream; B and I send their gradient upstream (a schedule runs
    B or I for each stage and microbatch, never both, so the one it runs sends; W sends nothing).
    """
    p = schedule.num_stages
    stage, kind = columns.stage, columns.kind
    target = np.full(columns.num_ops, -1, dtype=np.int64)
    forward = (kind == F_CODE) & (stage + 1 < p)
    target[forward] = stage[forward] + 1
    backward = ((kind == B_CODE) | (kind == I_CODE)) & (stage > 0)
    target[backward] = stage[backward] - 1
    return target
