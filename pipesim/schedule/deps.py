"""Data dependencies between ops of different stages: who must finish before an op can start."""

from __future__ import annotations

from pipesim.schedule.ir import Op, OpKind, Schedule


def gradient_kind(schedule: Schedule) -> OpKind:
    """The kind that sends a gradient upstream: I with split backward, else B."""
    return OpKind.I if schedule.has_split_backward else OpKind.B


def dependencies(op: Op, num_stages: int, grad_kind: OpKind) -> tuple[Op, ...]:
    """Ops that must end before ``op`` may start, besides the op before it on its rank.

    F(s, i) needs F(s-1, i) (the activation); B or I(s, i) needs F(s, i) and the gradient
    from stage s+1; W(s, i) needs I(s, i). U depends only on its place in the rank's order.
    """
    stage, kind, microbatch = op.stage, op.kind, op.microbatch
    if kind is OpKind.F:
        return (Op(stage - 1, OpKind.F, microbatch),) if stage > 0 else ()
    if kind is OpKind.B or kind is OpKind.I:
        own = Op(stage, OpKind.F, microbatch)
        if stage + 1 < num_stages:
            return (own, Op(stage + 1, grad_kind, microbatch))
        return (own,)
    if kind is OpKind.W:
        return (Op(stage, OpKind.I, microbatch),)
    return ()


def sends_to(op: Op, num_stages: int, grad_kind: OpKind) -> int | None:
    """The stage that receives ``op``'s output (activation or gradient), or None."""
    if op.kind is OpKind.F and op.stage + 1 < num_stages:
        return op.stage + 1
    if op.kind is grad_kind and op.stage > 0:
        return op.stage - 1
    return None
