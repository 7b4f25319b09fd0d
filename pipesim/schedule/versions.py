"""Weight versions: which version every op uses, derived from the order alone (no timing)."""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.errors import ScheduleError
from pipesim.schedule.ir import Op, OpKind, Schedule, WeightPolicy, grid


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
    """Walk each rank's order and give every op the weight version the schedule's policy says.

    A stage's version is the number of its U ops already run; which version an F or B picks
    depends on ``schedule.weights``:

    - FLUSH and SINGLE: the current version.
    - STASH: F takes the current version; B, I and W take their F's.
    - DOUBLE_BUFFER: minibatch t takes version ``max(0, t - 1)`` for F, B, I and W.

    Raises:
        ScheduleError: DOUBLE_BUFFER asks for a version not produced yet (too few microbatches),
            or FLUSH sees a backward on a newer version than its forward.
    """
    policy = schedule.weights
    version_of: dict[Op, int] = {}
    last_use: dict[tuple[int, int], Op] = {}
    consumed_by: dict[tuple[int, int], Op] = {}
    for rank_index, ops in enumerate(schedule.ranks):
        current: dict[int, int] = {}
        pending: dict[int, list[int]] = {}
        for position, op in enumerate(ops):
            stage = op.stage
            now = current.get(stage, 0)
            if op.kind is OpKind.U:
                version_of[op] = now
                current[stage] = now + 1
                for microbatch in pending.pop(stage, []):
                    consumed_by[(stage, microbatch)] = op
                continue
            if policy is WeightPolicy.DOUBLE_BUFFER:
                version = max(0, schedule.minibatch_of(op.microbatch) - 1)
                if version > now:
                    raise ScheduleError(
                        f"{op} needs weight version {version} but stage {stage} has only made {now}; "
                        f"2bw needs num_microbatches >= num_stages",
                        grid(schedule.ranks, {(rank_index, position)}),
                    )
            elif policy is WeightPolicy.STASH and op.kind is not OpKind.F:
                version = version_of.get(Op(stage, OpKind.F, op.microbatch), now)
            else:
                version = now
            if policy is WeightPolicy.FLUSH and op.kind is not OpKind.F:
                forward_version = version_of.get(Op(stage, OpKind.F, op.microbatch), version)
                if forward_version != version:
                    raise ScheduleError(
                        f"{op} runs on version {version} but its forward ran on {forward_version}: "
                        "a flush schedule must not update between them",
                        grid(schedule.ranks, {(rank_index, position)}),
                    )
            version_of[op] = version
            last_use[(stage, version)] = op
            if op.kind is OpKind.B or op.kind is OpKind.W:
                pending.setdefault(stage, []).append(op.microbatch)
    return VersionPlan(version_of=version_of, last_use=last_use, consumed_by=consumed_by)
