"""Several stages on each rank: placements, one minibatch's order written by column, and its K repeats."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from pipesim.errors import ConfigError
from pipesim.schedule.ir import B_CODE, I_CODE, U_CODE, W_CODE, Schedule, ScheduleTable, WeightPolicy, read_only

IntArray = npt.NDArray[np.int64]
Cell = tuple[int, int, int]  # (stage, kind code, microbatch)


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
                          f"(simulate --ranks R --stages-per-rank {wanted}; run and validate --stages {wanted}R "
                          "--ranks R)")


class Runs:
    """Every rank's ops for one minibatch, written rank after rank as runs of repeated cells.

    ``repeat(n, (s, F_CODE, i), (t, I_CODE, j))`` appends n rounds of the two cells; round r
    runs each cell's microbatch plus r (``sFi+r``, then ``tIj+r``). The phases of the
    zero-bubble and V schedules are such runs: a fixed group of ops, each counter advancing
    by one per round. ``end_rank`` closes a rank; ``table`` expands every run at once.
    """

    def __init__(self) -> None:
        self._counts: list[int] = []
        self._widths: list[int] = []
        self._cells: list[Cell] = []
        self._rank_runs: list[int] = [0]

    def repeat(self, count: int, *cells: Cell) -> None:
        """Append ``count`` rounds of ``cells`` (none when ``count <= 0``)."""
        if count > 0:
            self._counts.append(count)
            self._widths.append(len(cells))
            self._cells.extend(cells)

    def end_rank(self) -> None:
        """Close the current rank: later runs belong to the next."""
        self._rank_runs.append(len(self._counts))

    def table(self, num_microbatches: int) -> ScheduleTable:
        """The ranks' ops by column, less any of a microbatch beyond ``num_microbatches``."""
        counts = np.array(self._counts, dtype=np.int64)
        widths = np.array(self._widths, dtype=np.int64)
        cells = np.array(self._cells, dtype=np.int64).reshape(-1, 3)
        sizes = counts * widths
        ends = np.cumsum(sizes)
        run = np.repeat(np.arange(counts.shape[0], dtype=np.int64), sizes)
        inside = np.arange(int(ends[-1]) if ends.size else 0, dtype=np.int64) - (ends - sizes)[run]
        width = widths[run]
        rounds = inside // width
        cell = (np.cumsum(widths) - widths)[run] + inside - rounds * width
        stage, kind, microbatch = (column.take(cell) for column in np.ascontiguousarray(cells.T))
        microbatch += rounds
        offsets = np.concatenate([[0], ends])[self._rank_runs]
        kept = microbatch < num_microbatches
        if not kept.all():
            offsets = np.concatenate([[0], np.cumsum(kept)])[offsets]
            stage, kind, microbatch = stage[kept], kind[kept], microbatch[kept]
        return ScheduleTable(rank_offsets=offsets.astype(np.int64), stage=stage, kind=kind, microbatch=microbatch)


def rank_by_rank(num_ranks: int, num_microbatches: int, write: Callable[[Runs, int], None]) -> ScheduleTable:
    """One minibatch's table, ``write(runs, rank)`` writing each rank's runs (``Runs``), less
    the ops of microbatches beyond ``num_microbatches``."""
    runs = Runs()
    for rank in range(num_ranks):
        write(runs, rank)
        runs.end_rank()
    return runs.table(num_microbatches)


def follow_inputs(one: ScheduleTable) -> ScheduleTable:
    """``one`` with the j-th W of each rank given the stage and microbatch of its j-th I: a rank
    that queues each split backward's weight half and runs them oldest first (every rank
    runs as many W as I, so the j-th W of the table is its j-th I)."""
    inputs = np.flatnonzero(one.kind == I_CODE)
    weights = np.flatnonzero(one.kind == W_CODE)
    stage, microbatch = one.stage.copy(), one.microbatch.copy()
    stage[weights] = stage[inputs]
    microbatch[weights] = microbatch[inputs]
    return dataclasses.replace(one, stage=stage, microbatch=microbatch)


def assemble(name: str, num_stages: int, num_microbatches: int, num_minibatches: int,
             stage_to_rank: tuple[int, ...], one: ScheduleTable) -> Schedule:
    """Repeat one minibatch's table ``one`` (no U's) for K minibatches, with a flush.

    Microbatch i of minibatch k becomes ``k*m + i``. Each stage's update ``sUk`` follows the op
    that ends the stage's backwards of minibatch k (its last B or W, the m-th), which is where
    torch's runtime places the stage's REDUCE_GRAD. Every op of a stage in minibatch k comes
    before that last B or W on its rank (a forward before its backward, an I before its W), so
    minibatch k runs on version k: the table carries both columns.
    """
    m, k, p = num_microbatches, num_minibatches, num_stages
    ends = np.flatnonzero((one.kind == B_CODE) | (one.kind == W_CODE))
    last = np.full(p, -1, dtype=np.int64)
    np.maximum.at(last, one.stage[ends], ends)  # each stage's last B or W
    anchors = np.sort(last[last >= 0])
    # One minibatch with its U's: each op moves right by the U's before it.
    num_updates = anchors.shape[0]
    width = one.num_ops + num_updates
    moved = np.arange(one.num_ops, dtype=np.int64)
    moved += np.searchsorted(anchors, moved, side="left")
    update_at = anchors + np.arange(1, num_updates + 1, dtype=np.int64)
    stage, kind, microbatch = (np.empty(width, dtype=np.int64) for _ in range(3))
    stage[moved], kind[moved], microbatch[moved] = one.stage, one.kind, one.microbatch
    stage[update_at], kind[update_at], microbatch[update_at] = one.stage[anchors], U_CODE, 0
    offsets = one.rank_offsets + np.searchsorted(anchors, one.rank_offsets, side="left")
    minibatch = np.zeros(width, dtype=np.int64)
    if k > 1:  # rank r's block of L_r ops K times in its place: its op j is op j mod L_r, minibatch j // L_r
        lengths = np.diff(offsets)
        rank = np.repeat(np.arange(one.num_ranks, dtype=np.int64), lengths * k)
        inside = np.arange(k * width, dtype=np.int64) - (offsets[:-1] * k)[rank]
        length = lengths[rank]
        minibatch = inside // length
        source = offsets[:-1][rank] + inside - minibatch * length
        stage, kind = stage.take(source), kind.take(source)
        microbatch = microbatch.take(source) + minibatch * np.where(kind == U_CODE, 1, m)  # a U's number counts steps
    table = ScheduleTable(rank_offsets=read_only(offsets * k), stage=read_only(stage), kind=read_only(kind),
                          microbatch=read_only(microbatch), minibatch=read_only(minibatch), updates_before=minibatch)
    return Schedule(name=name, num_stages=p, num_microbatches=m, num_minibatches=k, table=table,
                    stage_to_rank=stage_to_rank, weights=WeightPolicy.FLUSH)


def order_by_key(num_ranks: int, span: int, *groups: tuple[IntArray, IntArray, int, IntArray]) -> ScheduleTable:
    """One minibatch's table from groups of ops placed by key: each rank runs its ops in rising key.

    A group is ``(key, stage, kind, microbatch)``: per rank (rows) the keys in ``0..span-1``,
    distinct within a rank, of ops of one kind code; every rank has as many ops. The key is an
    op's slot in its rank's order (a step and a place in the step), so that the order is a
    formula; an op's flat index is then the number of ops with a smaller key, counted in one
    pass over the rank's key space.
    """
    ranks = np.arange(num_ranks, dtype=np.int64)[:, None] * span
    flat = [(key + ranks).ravel() for key, _, _, _ in groups]
    taken = np.zeros(num_ranks * span, dtype=np.bool_)
    for key in flat:
        taken[key] = True
    place = np.cumsum(taken, dtype=np.int64)
    num_ops = int(place[-1]) if place.size else 0
    stage, kind, microbatch = (np.empty(num_ops, dtype=np.int64) for _ in range(3))
    for key, (_, group_stage, code, group_micro) in zip(flat, groups, strict=True):
        at = place[key] - 1
        stage[at] = np.broadcast_to(group_stage, (num_ranks, group_stage.shape[-1])).ravel()
        kind[at] = code
        microbatch[at] = np.broadcast_to(group_micro, (num_ranks, group_micro.shape[-1])).ravel()
    offsets = np.arange(num_ranks + 1, dtype=np.int64) * (num_ops // max(num_ranks, 1))
    return ScheduleTable(rank_offsets=offsets, stage=stage, kind=kind, microbatch=microbatch)

