"""Placing several stages on each rank (loop and V styles) and assembling per-rank orders into a Schedule."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pipesim.errors import ConfigError
from pipesim.schedule.ir import Op, OpKind, Schedule, U, WeightPolicy

def ranks_and_stages(name: str, num_stages: int, num_ranks: int | None) -> tuple[int, int]:
    """``(num_ranks, stages_per_rank)`` for ``num_stages`` stages; ``num_ranks=None`` means one
    stage per rank.

    Raises:
        ConfigError: ``num_ranks`` below 1 or not dividing ``num_stages``.
    """
    if num_ranks is None:
        return num_stages, 1
    if not isinstance(num_ranks, int) or isinstance(num_ranks, bool) or num_ranks < 1:
        raise ConfigError("num_ranks", num_ranks, "must be an integer >= 1")
    if num_stages % num_ranks:
        raise ConfigError("num_stages", num_stages, f"must be a multiple of num_ranks for {name} "
                          f"(num_stages: {num_stages}, num_ranks: {num_ranks})")
    return num_ranks, num_stages // num_ranks


def loop_placement(num_ranks: int, num_stages: int) -> tuple[int, ...]:
    """Stage s on rank ``s % R``: rank r holds stages r, r+R, r+2R, ... (interleaved schedules)."""
    return tuple(stage % num_ranks for stage in range(num_stages))


def v_placement(num_ranks: int) -> tuple[int, ...]:
    """Two stages per rank in a V: rank r holds stages r and 2R-1-r (ZBV, DualPipeV)::

        stage: 0 1 2 3 | 4 5 6 7        (R = 4)
        rank:  0 1 2 3 | 3 2 1 0
    """
    return tuple(range(num_ranks)) + tuple(reversed(range(num_ranks)))


def require_stages_per_rank(name: str, torch_name: str, stages_per_rank: int, wanted: int) -> None:
    """Reject a stages-per-rank count the schedule (and torch's class of the same name) refuses.

    Raises:
        ConfigError: ``stages_per_rank != wanted``.
    """
    if stages_per_rank != wanted:
        raise ConfigError("stages_per_rank", stages_per_rank,
                          f"{name} needs exactly {wanted} stages per rank, as torch's {torch_name} does "
                          "(give --ranks R --stages-per-rank 2)")


def assemble(
    name: str,
    num_stages: int,
    num_microbatches: int,
    num_minibatches: int,
    stage_to_rank: tuple[int, ...],
    rank_order: Callable[[int, int], Sequence[Op]],
) -> Schedule:
    """Repeat each rank's one-minibatch order ``rank_order(rank, m)`` for K minibatches, with a flush.

    Microbatch i of minibatch k becomes ``k*m + i``. Each stage's update ``sUk`` follows the op
    that ends the stage's last backward of minibatch k (its m-th B or W), which is where
    torch's runtime places the stage's REDUCE_GRAD.
    """
    m = num_microbatches
    num_ranks = max(stage_to_rank) + 1
    ranks: list[tuple[Op, ...]] = []
    for rank in range(num_ranks):
        one = rank_order(rank, m)
        ops: list[Op] = []
        for step in range(num_minibatches):
            first = step * m
            finished: dict[int, int] = {}
            for op in one:
                ops.append(Op(op.stage, op.kind, op.microbatch + first))
                if op.kind is OpKind.B or op.kind is OpKind.W:
                    finished[op.stage] = finished.get(op.stage, 0) + 1
                    if finished[op.stage] == m:
                        ops.append(U(op.stage, step))
        ranks.append(tuple(ops))
    return Schedule.from_ranks(
        name=name,
        num_stages=num_stages,
        num_microbatches=m,
        num_minibatches=num_minibatches,
        ranks=tuple(ranks),
        stage_to_rank=stage_to_rank,
        weights=WeightPolicy.FLUSH,
    )


class Counters:
    """Next microbatch index per (stage, kind), as the interleaved generators hand them out."""

    def __init__(self) -> None:
        self._next: dict[tuple[int, OpKind], int] = {}

    def take(self, stage: int, kind: OpKind) -> Op:
        """The op of ``kind`` on ``stage`` for the next microbatch, advancing the counter."""
        index = self._next.get((stage, kind), 0)
        self._next[(stage, kind)] = index + 1
        return Op(stage, kind, index)

    def peek(self, stage: int, kind: OpKind) -> int:
        """The next microbatch index of ``kind`` on ``stage``, without advancing."""
        return self._next.get((stage, kind), 0)
