"""Weight versions: which version every op uses, derived from the order alone (no timing)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pipesim.schedule.columns import op_at, schedule_error
from pipesim.schedule.ir import B_CODE, F_CODE, U_CODE, W_CODE, Op, Schedule, ScheduleTable, WeightPolicy

IntArray = npt.NDArray[np.int64]


def version_column(schedule: Schedule) -> IntArray:
    """The weight version every op uses (for U: the version it updates), by the schedule's policy.

    A stage's version is the number of its U ops already run (``Schedule.updates_before``);
    which version an F, B, I or W picks depends on ``schedule.weights``:

    - FLUSH and SINGLE: the current version.
    - STASH: F takes the current version; B, I and W take their F's.
    - DOUBLE_BUFFER: minibatch t takes version ``max(0, t - 1)`` (``Schedule.minibatch``).

    Raises:
        ScheduleError: DOUBLE_BUFFER asks for a version not produced yet (too few microbatches),
            or FLUSH sees a backward on a newer version than its forward.
    """
    columns = schedule.table
    policy = schedule.weights
    now = schedule.updates_before
    if policy is WeightPolicy.SINGLE:
        return now  # read only: the same column
    if policy is WeightPolicy.DOUBLE_BUFFER:
        version = schedule.minibatch - 1  # off a U, the minibatch is the microbatch's
        np.maximum(version, 0, out=version)
        np.copyto(version, now, where=columns.kind == U_CODE)
        bad = np.flatnonzero(version > now)
        if bad.size:
            g = int(bad[0])
            raise schedule_error(schedule, g,
                                 f"{op_at(columns, g)} needs weight version {int(version[g])} but stage "
                                 f"{int(columns.stage[g])} has only made {int(now[g])}; "
                                 f"2bw needs num_microbatches >= num_stages")
        return version
    # Per op, its stage's F of the same microbatch (itself if none). A stage's ``now`` never
    # falls along its rank, so ``now`` at that F is below an op's own ``now`` exactly when an
    # update ran between the F and the op (after it): the stashed version, or a broken flush.
    forward = schedule.forward
    forward_version = now.take(forward)
    if policy is WeightPolicy.STASH:
        return np.minimum(now, forward_version, out=forward_version)
    bad = np.flatnonzero(forward_version < now)
    if bad.size:
        g = int(bad[0])
        raise schedule_error(schedule, g,
                             f"{op_at(columns, g)} runs on version {int(now[g])} but its forward ran on "
                             f"{int(now[forward[g]])}: a flush schedule must not update between them")
    return now


def updates_before_column(columns: ScheduleTable) -> IntArray:
    """Per op, how many U ops of its stage come before it (its stage's current version).

    A stage lives on one rank, so the flat order restricted to a stage is that rank's order:
    with the ops grouped by stage (no sort where the stages already rise, as with one stage
    per rank), a running count of U's less its value where the op's group starts.
    """
    stage = columns.stage
    is_update = columns.kind == U_CODE
    order = None if not (stage[1:] < stage[:-1]).any() else np.argsort(stage, kind="stable")
    stages, updates = (stage, is_update) if order is None else (stage[order], is_update[order])
    before = np.cumsum(updates, dtype=np.int64)
    before -= updates
    starts = np.flatnonzero(stages[1:] != stages[:-1]) + 1
    lengths = np.diff(starts, prepend=0, append=stages.shape[0])
    now: IntArray = before - np.repeat(before[np.concatenate([[0], starts])] if stages.size else before, lengths)
    if order is None:
        return now
    unsorted: IntArray = np.empty_like(now)
    unsorted[order] = now
    return unsorted


def forward_column(schedule: Schedule) -> IntArray:
    """Per op, the flat index of the F of its stage and microbatch (the first, if several);
    the op's own index for a U or an op without one."""
    columns = schedule.table
    p, total = schedule.num_stages, schedule.total_microbatches
    stage, micro, kind = columns.stage, columns.microbatch, columns.kind
    is_update = kind == U_CODE
    table = np.full(max(p * total, 1), -1, dtype=np.int64)
    if stage.size and 0 <= stage.min() and stage.max() < p and 0 <= micro.min() and micro.max() < total:
        key = stage * total + micro  # every op in range (U's are masked below)
        has_forward = ~is_update
    else:
        inside = (stage >= 0) & (stage < p) & (micro >= 0) & (micro < total)
        key = np.where(inside, stage * total + micro, 0)
        has_forward = inside & ~is_update
    forwards = np.flatnonzero(kind == F_CODE)
    forwards = forwards[has_forward[forwards]]
    table[key[forwards][::-1]] = forwards[::-1]  # the first F wins on a duplicate
    found = table.take(key, mode="clip")
    return np.where(has_forward & (found >= 0), found, np.arange(columns.num_ops, dtype=np.int64))


@dataclass(frozen=True)
class VersionPlan:
    """Per op, the weight version it runs on, and how long each version must be kept.

    Attributes:
        version_of: version used by each F, B, I and W op; for U, the version it updates
            (it produces ``version + 1``).
        last_use: per (stage, version), the last op in its rank's order that uses it.
        consumed_by: per (stage, microbatch), the U op that consumes its gradient, if any.
    """

    version_of: dict[Op, int]
    last_use: dict[tuple[int, int], Op]
    consumed_by: dict[tuple[int, int], Op]


def assign_versions(schedule: Schedule) -> VersionPlan:
    """The schedule's versions (``Schedule.version``) as per-op dicts, with each version's last
    use and the update that consumes each backward's gradient (a B or W gives its gradient to
    the next U of its stage on the rank).

    Raises:
        ScheduleError: as ``version_column``.
    """
    version = schedule.version.tolist()
    columns = schedule.table
    version_of: dict[Op, int] = {}
    last_use: dict[tuple[int, int], Op] = {}
    consumed_by: dict[tuple[int, int], Op] = {}
    offsets = columns.rank_offsets.tolist()
    flat = [op for ops in schedule.ranks for op in ops]
    kinds = columns.kind.tolist()
    for rank_index in range(columns.num_ranks):
        pending: dict[int, list[int]] = {}
        for g in range(offsets[rank_index], offsets[rank_index + 1]):
            op = flat[g]
            version_of[op] = version[g]
            if kinds[g] == U_CODE:
                for microbatch in pending.pop(op.stage, []):
                    consumed_by[(op.stage, microbatch)] = op
                continue
            last_use[(op.stage, version[g])] = op
            if kinds[g] in (B_CODE, W_CODE):
                pending.setdefault(op.stage, []).append(op.microbatch)
    return VersionPlan(version_of=version_of, last_use=last_use, consumed_by=consumed_by)
