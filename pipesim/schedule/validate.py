"""Checking a schedule: every op once, legal order on each rank, and no cross-rank deadlock."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from pipesim.errors import ScheduleError
from pipesim.schedule.deps import dependencies, gradient_kind, split_backwards
from pipesim.schedule.ir import Op, OpKind, Schedule, grid


@dataclass(frozen=True)
class Violation:
    """One broken invariant: where (rank, position), which op, and what is wrong."""

    rank: int
    position: int
    op: str
    message: str

    def __str__(self) -> str:
        return f"rank {self.rank}, position {self.position}, op {self.op}: {self.message}"


def find_violations(schedule: Schedule) -> list[Violation]:
    """Every structural violation, then (if there are none) the first deadlock found."""
    violations = find_completeness_violations(schedule) + find_local_order_violations(schedule)
    if not violations:
        violations = find_deadlock(schedule)
    return violations


def validate(schedule: Schedule) -> None:
    """Check ``schedule``; return nothing when it is valid (so the REPL echoes nothing).

    Raises:
        ScheduleError: naming the first violation, with the grid and the failing cell marked.
    """
    violations = find_violations(schedule)
    if violations:
        marked = {(v.rank, v.position) for v in violations if v.position >= 0}
        first = violations[0]
        more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
        raise ScheduleError(f"invalid schedule {schedule.name!r}: {first}{more}", grid(schedule.ranks, marked))


def find_completeness_violations(schedule: Schedule) -> list[Violation]:
    """Every (stage, microbatch) has exactly one F and one B (or one I and one W), on its rank.

    Reports, in this order: ops that appear twice (at the second cell), stages or microbatches
    out of range, ops on a rank that does not hold their stage, U ops out of sequence, a stage
    without any op, then each missing op (at position -1: it has no cell).
    """
    found: list[Violation] = []
    p = schedule.num_stages
    total = schedule.total_microbatches
    counts: Counter[Op] = Counter()
    for rank_index, ops in enumerate(schedule.ranks):
        updates_seen: dict[int, int] = {}
        for position, op in enumerate(ops):
            def bad(message: str, op: Op = op, position: int = position) -> None:
                found.append(Violation(rank_index, position, str(op), message))

            counts[op] += 1
            if counts[op] == 2:
                bad("appears more than once")
            if not 0 <= op.stage < p:
                bad(f"stage {op.stage} is outside 0..{p - 1}")
                continue
            if schedule.stage_to_rank[op.stage] != rank_index:
                bad(f"stage {op.stage} belongs to rank {schedule.stage_to_rank[op.stage]}")
            if op.kind is OpKind.U:
                expected = updates_seen.get(op.stage, 0)
                if op.microbatch != expected:
                    bad(f"update index should be {expected}")
                updates_seen[op.stage] = expected + 1
                continue
            if not 0 <= op.microbatch < total:
                bad(f"microbatch {op.microbatch} is outside 0..{total - 1}")
    for stage in range(p):
        rank_index = schedule.stage_to_rank[stage]
        if rank_index < 0:
            found.append(Violation(rank_index, -1, f"{stage}F*", f"stage {stage} has no ops on any rank"))
            continue
        for microbatch in range(total):
            has_b = counts[Op(stage, OpKind.B, microbatch)] > 0
            has_i = counts[Op(stage, OpKind.I, microbatch)] > 0
            has_w = counts[Op(stage, OpKind.W, microbatch)] > 0
            missing: list[str] = []
            if counts[Op(stage, OpKind.F, microbatch)] == 0:
                missing.append(str(Op(stage, OpKind.F, microbatch)))
            if has_b and (has_i or has_w):
                found.append(Violation(rank_index, -1, str(Op(stage, OpKind.B, microbatch)),
                                       "both a full backward and a split one"))
            elif not has_b:
                if not has_i and not has_w:
                    missing.append(f"{Op(stage, OpKind.B, microbatch)} (or I/W)")
                if has_i and not has_w:
                    missing.append(str(Op(stage, OpKind.W, microbatch)))
                if has_w and not has_i:
                    missing.append(str(Op(stage, OpKind.I, microbatch)))
            for text in missing:
                found.append(Violation(rank_index, -1, text, "is missing"))
    return found


def find_local_order_violations(schedule: Schedule) -> list[Violation]:
    """On each rank, F before the B or I of its microbatch, and I before its W."""
    found: list[Violation] = []
    where: dict[Op, tuple[int, int]] = {}
    for rank_index, ops in enumerate(schedule.ranks):
        for position, op in enumerate(ops):
            where.setdefault(op, (rank_index, position))
    for rank_index, ops in enumerate(schedule.ranks):
        for position, op in enumerate(ops):
            before = _MUST_FOLLOW.get(op.kind)
            if before is None:
                continue
            need = Op(op.stage, before, op.microbatch)
            need_rank, need_position = where.get(need, (-1, -1))
            if need_rank == rank_index and need_position > position:
                found.append(Violation(rank_index, position, str(op), f"runs before {need}"))
    return found


# The op of the same stage and microbatch that must come earlier on the rank.
_MUST_FOLLOW = {OpKind.B: OpKind.F, OpKind.I: OpKind.F, OpKind.W: OpKind.I}


def find_deadlock(schedule: Schedule) -> list[Violation]:
    """Run the order with unlimited speed; if no rank can advance, name each stuck op.

    Returns:
        one Violation per rank that is stuck (its next op and the op it waits for), or ``[]``.
    """
    grad_kind = gradient_kind(schedule)
    split = split_backwards(schedule)
    p = schedule.num_stages
    done: set[Op] = set()
    next_position = [0] * schedule.num_ranks
    remaining = schedule.num_ops
    progressed = True
    while remaining and progressed:
        progressed = False
        for rank_index, ops in enumerate(schedule.ranks):
            position = next_position[rank_index]
            while position < len(ops):
                op = ops[position]
                if any(dep not in done for dep in dependencies(op, p, grad_kind, split=split)):
                    break
                done.add(op)
                position += 1
                remaining -= 1
                progressed = True
            next_position[rank_index] = position
    if not remaining:
        return []
    stuck = []
    for rank_index, ops in enumerate(schedule.ranks):
        position = next_position[rank_index]
        if position < len(ops):
            op = ops[position]
            waits = [str(dep) for dep in dependencies(op, p, grad_kind, split=split) if dep not in done]
            stuck.append(Violation(rank_index, position, str(op), f"deadlock: waits for {', '.join(waits)}"))
    return stuck
