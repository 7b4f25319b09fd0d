"""Order invariants of a schedule beyond validation: placement, same-rank dependencies, weight versions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pipesim.errors import ScheduleError
from pipesim.schedule.deps import dependencies, gradient_kind, split_backwards
from pipesim.schedule.ir import Op, OpKind, Schedule, WeightPolicy, grid
from pipesim.schedule.validate import (
    Violation,
    find_completeness_violations,
    find_deadlock,
    find_local_order_violations,
)
from pipesim.schedule.versions import assign_versions


@dataclass(frozen=True)
class CheckResult:
    """What ``check_schedule`` found.

    Attributes:
        schedule: the schedule checked.
        violations: every violation found, in the order the checks ran.
    """

    schedule: Schedule
    violations: tuple[Violation, ...]

    @property
    def is_valid(self) -> bool:
        """True when nothing was found."""
        return not self.violations

    def marked_grid(self) -> str:
        """The schedule one row per rank, each violation's cell marked ``>0B3<``."""
        marked = {(v.rank, v.position) for v in self.violations if v.rank >= 0 and v.position >= 0}
        return grid(self.schedule.ranks, marked)


def check_schedule(schedule: Schedule, *, stages_per_rank: int | None = None) -> CheckResult:
    """Check every order invariant that applies to ``schedule``.

    In order: completeness (each op once, on its stage's rank), order on each rank (F before
    B/I, I before W), cross-stage dependencies on one rank (F(s,i) after F(s-1,i), the backward
    of (s,i) after the one of (s+1,i)), stages per rank when ``stages_per_rank`` is given; when
    all of these hold, deadlock freedom under point-to-point send/recv (sends are asynchronous,
    as PyTorch's ``isend``; an op waits until its inputs were sent) and the schedule's
    weight-version policy.
    """
    violations = (
        find_completeness_violations(schedule)
        + find_local_order_violations(schedule)
        + find_same_rank_dependency_violations(schedule)
    )
    if stages_per_rank is not None:
        violations += find_placement_violations(schedule, stages_per_rank)
    if not violations:
        violations = find_deadlock(schedule)
    if not violations:
        if schedule.weights in (WeightPolicy.FLUSH, WeightPolicy.SINGLE):
            # Weights updated in place: every op runs on the current version, so a misplaced
            # update is reported at the op it affects.
            violations = find_weight_violations(schedule, current_versions(schedule))
        else:
            try:
                version_of = assign_versions(schedule).version_of
            except ScheduleError as exc:
                violations = [Violation(-1, -1, "-", exc.reason)]
            else:
                violations = find_weight_violations(schedule, version_of)
    return CheckResult(schedule=schedule, violations=tuple(violations))


def find_same_rank_dependency_violations(schedule: Schedule) -> list[Violation]:
    """An op placed before an op of another stage that it needs, on the same rank.

    Such a rank can never proceed (the op waits for one behind it); naming the pair is clearer
    than the deadlock it causes. Dependencies across ranks are left to ``find_deadlock``.
    """
    grad_kind = gradient_kind(schedule)
    split = split_backwards(schedule)
    found = []
    for rank_index, ops in enumerate(schedule.ranks):
        position_of = {op: position for position, op in enumerate(ops)}
        for position, op in enumerate(ops):
            for dep in dependencies(op, schedule.num_stages, grad_kind, split=split):
                later = position_of.get(dep, -1)
                if dep.stage != op.stage and later > position:
                    found.append(Violation(
                        rank_index, position, str(op),
                        f"runs before {dep}, which it needs and which comes later on the same rank "
                        f"(position {later})",
                    ))
    return found


def find_placement_violations(schedule: Schedule, stages_per_rank: int) -> list[Violation]:
    """Each rank must hold exactly ``stages_per_rank`` stages (its first op is marked)."""
    found = []
    for rank_index, ops in enumerate(schedule.ranks):
        stages = sorted({op.stage for op in ops})
        if len(stages) != stages_per_rank:
            found.append(Violation(
                rank_index, 0 if ops else -1, str(ops[0]) if ops else "-",
                f"rank {rank_index} holds {len(stages)} stage(s) {stages}, expected {stages_per_rank}",
            ))
    return found


def current_versions(schedule: Schedule) -> dict[Op, int]:
    """Per op, its stage's weight version when the op runs: the U ops of the stage before it."""
    current: dict[Op, int] = {}
    for ops in schedule.ranks:
        updates: dict[int, int] = {}
        for op in ops:
            current[op] = updates.get(op.stage, 0)
            if op.kind is OpKind.U:
                updates[op.stage] = current[op] + 1
    return current


def find_weight_violations(schedule: Schedule, version_of: Mapping[Op, int]) -> list[Violation]:
    """Check the weight version each op ran on against the schedule's policy.

    ``version_of`` comes from ``assign_versions`` or from a trace (what an engine or a real run
    recorded). With c the stage's current version when the op runs and t its minibatch:

    - FLUSH (gpipe, 1f1b): an F runs on c (never stale) and, when the schedule has U ops, on
      version t; its B, I and W run on the F's version (no update in between); 1 version held.
    - STASH (pipedream): an F runs on c; its B, I and W run on exactly the F's version.
    - DOUBLE_BUFFER (2bw): every op of minibatch t runs on ``max(0, t-1)``, at most 2 versions held.
    - SINGLE (pipemare): every op runs on c; 1 version held.
    """
    policy = schedule.weights
    current = current_versions(schedule)
    has_updates = any(op.kind is OpKind.U for ops in schedule.ranks for op in ops)
    found: list[Violation] = []
    for rank_index, ops in enumerate(schedule.ranks):
        for position, op in enumerate(ops):
            if op.kind is OpKind.U:
                continue
            used = version_of.get(op)
            forward = version_of.get(Op(op.stage, OpKind.F, op.microbatch))
            if used is None:
                problem: str | None = "has no weight version"
            else:
                problem = _version_problem(policy, op, used, current[op], forward,
                                           schedule.minibatch_of(op.microbatch), has_updates)
            if problem is not None:
                found.append(Violation(rank_index, position, str(op), problem))
    limit = {WeightPolicy.FLUSH: 1, WeightPolicy.SINGLE: 1, WeightPolicy.DOUBLE_BUFFER: 2}.get(policy)
    if limit is not None:
        for stage, (held, rank_index, position) in enumerate(_versions_held(schedule, version_of)):
            if held > limit:
                op = schedule.ranks[rank_index][position]
                found.append(Violation(rank_index, position, str(op),
                                       f"stage {stage} holds {held} weight versions here, at most {limit} allowed"))
    return found


def _version_problem(
    policy: WeightPolicy, op: Op, used: int, current: int, forward: int | None, minibatch: int,
    has_updates: bool,
) -> str | None:
    """What is wrong with ``op`` running on version ``used`` under ``policy``, or None."""
    if policy is WeightPolicy.DOUBLE_BUFFER:
        expected = max(0, minibatch - 1)
        if used != expected:
            return f"runs on version {used}, but minibatch {minibatch} must run on version {expected}"
        if used > current:
            return f"runs on version {used}, which the stage has not made yet (current {current})"
        return None
    if policy is WeightPolicy.SINGLE or op.kind is OpKind.F:
        if used != current:
            return f"runs on version {used}, but the stage's current version is {current} (stale)"
        if policy is WeightPolicy.FLUSH and has_updates and used != minibatch:
            return f"runs on version {used}, but minibatch {minibatch} must see {minibatch} updates (flush)"
        return None
    if forward is None:
        return None
    if policy is WeightPolicy.FLUSH and current != forward:
        return f"an update ran between its forward (version {forward}) and it; a flush schedule must not"
    if used != forward:
        return f"runs on version {used}, but its forward ran on {forward}"
    return None


def versions_held(schedule: Schedule, version_of: Mapping[Op, int]) -> list[int]:
    """Per stage, the most weight versions that must exist at once, from the order alone.

    Before each op of a stage: its current version, plus every older version that this op or a
    later op of the stage still runs on.
    """
    return [held for held, _, _ in _versions_held(schedule, version_of)]


def _versions_held(schedule: Schedule, version_of: Mapping[Op, int]) -> list[tuple[int, int, int]]:
    """Per stage: (most versions held, rank and position of the op where that is first reached).

    Version v of a stage is held from the position where it becomes current until the later of
    the position before the next update and its last use; one sweep over each rank counts them.
    """
    current = current_versions(schedule)
    result = [(1, max(schedule.stage_to_rank[stage], 0), 0) for stage in range(schedule.num_stages)]
    for rank_index, ops in enumerate(schedule.ranks):
        made: dict[tuple[int, int], int] = {}  # (stage, version) -> position where it becomes current
        last_use: dict[tuple[int, int], int] = {}
        for position, op in enumerate(ops):
            made.setdefault((op.stage, current[op]), position)
            if op.kind is not OpKind.U and op in version_of:
                last_use[(op.stage, version_of[op])] = position
        changes: dict[int, list[tuple[int, int]]] = {}  # position -> (stage, +1 or -1)
        for (stage, version), start in made.items():
            superseded = made.get((stage, version + 1), len(ops))
            end = max(superseded - 1, last_use.get((stage, version), -1))
            changes.setdefault(start, []).append((stage, 1))
            changes.setdefault(end + 1, []).append((stage, -1))
        counts: dict[int, int] = {}
        for position, op in enumerate(ops):
            for stage, delta in changes.get(position, ()):
                counts[stage] = counts.get(stage, 0) + delta
            if 0 <= op.stage < schedule.num_stages and counts.get(op.stage, 0) > result[op.stage][0]:
                result[op.stage] = (counts[op.stage], rank_index, position)
    return result


def pipemare_discrepancy(
    num_stages: int, stage: int, microbatch: int, total_microbatches: int, update_every: int,
    warmup_rounds: int = 1,
) -> int:
    """PipeMare's discrepancy ``version(B) - version(F)`` of one microbatch on a 1F1B order
    (``warmup_rounds=1``) or on the PipeMare paper's pipeline (``warmup_rounds=2``).

    Stage s runs a warm-up of ``w = min(p - s - 1, N)`` forwards (the paper's pipeline:
    ``min(2(p - s) - 1, N)``), then F(i) right after the backward of microbatch ``i - w - 1``;
    with an update after every ``u``-th backward, F(i) runs on ``floor(max(0, i - w) / u)`` and
    B(i), after the backwards of microbatches 0..i-1, on ``floor(i / u)``. The difference is
    ``min(i, w)`` for ``u = 1`` and at most ``ceil(w / u)``.
    """
    warmup = min(warmup_rounds * (num_stages - stage) - 1, total_microbatches)
    return microbatch // update_every - max(0, microbatch - warmup) // update_every


def find_pipemare_violations(schedule: Schedule, version_of: Mapping[Op, int], update_every: int,
                             warmup_rounds: int = 1) -> list[Violation]:
    """Each B's version minus its F's must equal ``pipemare_discrepancy`` (cadence ``u``; the
    paper's pipeline with ``warmup_rounds=2``)."""
    found = []
    for rank_index, ops in enumerate(schedule.ranks):
        for position, op in enumerate(ops):
            if op.kind is not OpKind.B and op.kind is not OpKind.I:
                continue
            expected = pipemare_discrepancy(schedule.num_stages, op.stage, op.microbatch,
                                            schedule.total_microbatches, update_every, warmup_rounds)
            forward = version_of.get(Op(op.stage, OpKind.F, op.microbatch), -1)
            actual = version_of.get(op, -1) - forward
            if actual != expected:
                found.append(Violation(rank_index, position, str(op),
                                       f"discrepancy {actual}, the closed form gives {expected}"))
    return found
