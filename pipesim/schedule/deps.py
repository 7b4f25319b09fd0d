"""Data dependencies between ops of different stages: who must finish before an op can start."""

from __future__ import annotations

from collections.abc import Set

from pipesim.schedule.ir import Op, OpKind, Schedule


def gradient_kind(schedule: Schedule) -> OpKind:
    """The kind that sends a gradient upstream: I with split backward, else B."""
    return OpKind.I if schedule.has_split_backward else OpKind.B


def split_backwards(schedule: Schedule) -> frozenset[tuple[int, int]]:
    """The ``(stage, microbatch)`` pairs whose backward is split into I and W.

    Schedules such as DualPipeV split some microbatches' backwards and not others, so the
    op that sends a gradient upstream is chosen per pair, not per schedule.
    """
    return frozenset((op.stage, op.microbatch) for ops in schedule.ranks for op in ops if op.kind is OpKind.I)


def dependencies(
    op: Op, num_stages: int, grad_kind: OpKind, *, split: Set[tuple[int, int]] | None = None,
) -> tuple[Op, ...]:
    """Ops that must end before ``op`` may start, besides the op before it on its rank.

    F(s, i) needs F(s-1, i) (the activation); B or I(s, i) needs F(s, i) and the gradient
    from stage s+1; W(s, i) needs I(s, i). U depends only on its place in the rank's order.

    Args:
        grad_kind: the kind that sends gradients (``gradient_kind``), used when ``split`` is None.
        split: the pairs whose backward is split (``split_backwards``); when given, the gradient
            of (s+1, i) comes from I(s+1, i) if the pair is split and from B(s+1, i) otherwise.
    """
    stage, kind, microbatch = op.stage, op.kind, op.microbatch
    if kind is OpKind.F:
        return (Op(stage - 1, OpKind.F, microbatch),) if stage > 0 else ()
    if kind is OpKind.B or kind is OpKind.I:
        own = Op(stage, OpKind.F, microbatch)
        if stage + 1 < num_stages:
            if split is not None:
                grad_kind = OpKind.I if (stage + 1, microbatch) in split else OpKind.B
            return (own, Op(stage + 1, grad_kind, microbatch))
        return (own,)
    if kind is OpKind.W:
        return (Op(stage, OpKind.I, microbatch),)
    return ()


def sends_to(op: Op, num_stages: int, grad_kind: OpKind) -> int | None:
    """The stage that receives ``op``'s output (activation or gradient), or None.

    A microbatch's backward on a stage is either one B or an I/W pair, so whichever of B and I
    runs sends the gradient upstream (``grad_kind`` is kept for the callers that pass it).
    """
    if op.kind is OpKind.F and op.stage + 1 < num_stages:
        return op.stage + 1
    if (op.kind is OpKind.B or op.kind is OpKind.I) and op.stage > 0:
        return op.stage - 1
    return None
