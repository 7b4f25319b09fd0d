"""Data dependencies between ops of different stages: who must finish before an op can start."""

from __future__ import annotations

from collections.abc import Set
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
    use ``backward_kinds`` or ``split_backwards`` there.
    """
    return OpKind.I if schedule.has_split_backward else OpKind.B


def backward_kinds(schedule: Schedule) -> GradientKind:
    """The gradient-sending kind of every (stage, microbatch): one OpKind when the schedule
    uses one kind throughout, else a MixedBackward naming the split pairs."""
    split = split_backwards(schedule)
    if not split:
        return OpKind.B
    if not any(op.kind is OpKind.B for ops in schedule.ranks for op in ops):
        return OpKind.I
    return MixedBackward(split)


def split_backwards(schedule: Schedule) -> frozenset[tuple[int, int]]:
    """The ``(stage, microbatch)`` pairs whose backward is split into I and W.

    Schedules such as DualPipeV split some microbatches' backwards and not others, so the
    op that sends a gradient upstream is chosen per pair, not per schedule.
    """
    return frozenset((op.stage, op.microbatch) for ops in schedule.ranks for op in ops if op.kind is OpKind.I)


def dependencies(
    op: Op, num_stages: int, grad_kind: GradientKind, *, split: Set[tuple[int, int]] | None = None,
) -> tuple[Op, ...]:
    """Ops that must end before ``op`` may start, besides the op before it on its rank.

    F(s, i) needs F(s-1, i) (the activation); B or I(s, i) needs F(s, i) and the gradient
    from stage s+1; W(s, i) needs I(s, i). U depends only on its place in the rank's order.

    Args:
        grad_kind: the kind that sends gradients (``gradient_kind``), or per pair
            (``backward_kinds``); used when ``split`` is None.
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
                upstream = OpKind.I if (stage + 1, microbatch) in split else OpKind.B
            elif isinstance(grad_kind, MixedBackward):
                upstream = grad_kind.kind(stage + 1, microbatch)
            else:
                upstream = grad_kind
            return (own, Op(stage + 1, upstream, microbatch))
        return (own,)
    if kind is OpKind.W:
        return (Op(stage, OpKind.I, microbatch),)
    return ()


def sends_to(op: Op, num_stages: int, grad_kind: GradientKind) -> int | None:
    """The stage that receives ``op``'s output (activation or gradient), or None.

    A microbatch's backward on a stage is either one B or an I/W pair, so whichever of B and I
    runs sends the gradient upstream (``grad_kind`` is kept for the callers that pass it).
    """
    if op.kind is OpKind.F and op.stage + 1 < num_stages:
        return op.stage + 1
    if (op.kind is OpKind.B or op.kind is OpKind.I) and op.stage > 0:
        return op.stage - 1
    return None
