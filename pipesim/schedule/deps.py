"""Data dependencies between ops of different stages: who must finish before an op can start."""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.schedule.ir import Op, OpKind, Schedule


@dataclass(frozen=True)
class MixedBackward:
    """Which (stage, microbatch) pairs run a split backward (I then W) in a schedule that also
    runs full backwards (B), as DualPipeV does; every other pair runs B."""

    split: frozenset[tuple[int, int]]

    def kind(self, stage: int, microbatch: int) -> OpKind:
        """The op kind that sends (stage, microbatch)'s gradient upstream: I or B."""
        return OpKind.I if (stage, microbatch) in self.split else OpKind.B


GradientKind = OpKind | MixedBackward


def gradient_kind(schedule: Schedule) -> OpKind:
    """The kind that sends a gradient upstream: I with split backward, else B.

    For schedules that mix B and I (``backward_kinds`` returns a MixedBackward) this is I;
    use ``backward_kinds`` there.
    """
    return OpKind.I if schedule.has_split_backward else OpKind.B


def backward_kinds(schedule: Schedule) -> GradientKind:
    """The gradient-sending kind of every (stage, microbatch): one OpKind when the schedule
    uses one kind throughout, else a MixedBackward naming the split pairs."""
    split: set[tuple[int, int]] = set()
    has_full = False
    for ops in schedule.ranks:
        for op in ops:
            if op.kind is OpKind.I:
                split.add((op.stage, op.microbatch))
            elif op.kind is OpKind.B:
                has_full = True
    if not split:
        return OpKind.B
    if not has_full:
        return OpKind.I
    return MixedBackward(frozenset(split))


def _upstream_gradient(stage: int, microbatch: int, grad_kind: GradientKind) -> Op:
    kind = grad_kind if isinstance(grad_kind, OpKind) else grad_kind.kind(stage, microbatch)
    return Op(stage, kind, microbatch)


def dependencies(op: Op, num_stages: int, grad_kind: GradientKind) -> tuple[Op, ...]:
    """Ops that must end before ``op`` may start, besides the op before it on its rank.

    F(s, i) needs F(s-1, i) (the activation); B or I(s, i) needs F(s, i) and the gradient
    from stage s+1 (its B or I, per ``grad_kind``); W(s, i) needs I(s, i). U depends only on
    its place in the rank's order.
    """
    stage, kind, microbatch = op.stage, op.kind, op.microbatch
    if kind is OpKind.F:
        return (Op(stage - 1, OpKind.F, microbatch),) if stage > 0 else ()
    if kind is OpKind.B or kind is OpKind.I:
        own = Op(stage, OpKind.F, microbatch)
        if stage + 1 < num_stages:
            return (own, _upstream_gradient(stage + 1, microbatch, grad_kind))
        return (own,)
    if kind is OpKind.W:
        return (Op(stage, OpKind.I, microbatch),)
    return ()


def sends_to(op: Op, num_stages: int, grad_kind: GradientKind) -> int | None:
    """The stage that receives ``op``'s output (activation or gradient), or None."""
    if op.kind is OpKind.F and op.stage + 1 < num_stages:
        return op.stage + 1
    if op.stage > 0 and (op.kind is grad_kind or (
        isinstance(grad_kind, MixedBackward) and op.kind in (OpKind.B, OpKind.I)
    )):
        return op.stage - 1
    return None
