"""The one-stage-per-rank registry schedules as numpy columns, by index arithmetic (no Op objects)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from pipesim.schedule.ir import Op, Schedule, WeightPolicy, one_stage_per_rank

IntArray = npt.NDArray[np.int64]

# Kind codes: the index of the kind in OpKind (F, B, I, W, U), as engine.columns.KIND_ORDER.
F_CODE, B_CODE, U_CODE = 0, 1, 4
NUM_KINDS = 5

# Schedules built here, with their weight policy; every other name keeps the Op path.
POLICIES = {
    "gpipe": WeightPolicy.FLUSH,
    "1f1b": WeightPolicy.FLUSH,
    "pipedream": WeightPolicy.STASH,
    "2bw": WeightPolicy.DOUBLE_BUFFER,
    "pipemare": WeightPolicy.SINGLE,
}


def is_columnar(name: str, num_stages: int, num_microbatches: int, num_ranks: int | None = None) -> bool:
    """True when ``columnar_order`` builds this schedule: one of ``POLICIES``, one stage per
    rank, and counts the Op generator accepts (2bw needs m >= p). Anything else goes the Op
    way, which also raises the errors."""
    return (name in POLICIES and min(num_stages, num_microbatches) >= 1 and num_ranks in (None, num_stages)
            and not (name == "2bw" and num_microbatches < num_stages))


@dataclass(frozen=True, eq=False)
class ColumnarOrder:
    """Every op of a schedule by column, ranks one after another (rank r = stage r), each rank's
    ops in its order; equal, column by column, to what lowering reads from the Op schedule.

    Attributes:
        schedule: the schedule's description; its ``ranks`` are built only when read.
        ops_per_rank: L, the length of every rank's order (rank r holds ``r*L:(r+1)*L``).
        stage, kind, microbatch: per op (kind codes in ``OpKind``'s order; the update index for U).
        minibatch: step index (a U counts in the minibatch of the backward before it).
        version: weight version used (for U: the version it updates), as ``assign_versions``.
        wait: flat index of the op of another stage whose output it waits for, or -1.
        previous_send: flat index of the previous op sending over the same rank pair, or -1.
        forward_at, backward_at: ``(p, K*m)``, flat index of F(s, i) and of B(s, i).
        update_at: ``(p, updates per stage)``, flat index of the stage's U number j.
        derived: values that later stages derive from the order alone, kept with it so that
            every program lowered from it shares them (lowering keeps the Trace's span columns
            other than times and bytes here; see ``pipesim.reuse``).
    """

    schedule: Schedule
    ops_per_rank: int
    stage: IntArray
    kind: IntArray
    microbatch: IntArray
    minibatch: IntArray
    version: IntArray
    wait: IntArray
    previous_send: IntArray
    forward_at: IntArray
    backward_at: IntArray
    update_at: IntArray
    derived: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def num_ops(self) -> int:
        """Number of ops."""
        return int(self.stage.shape[0])

    @cached_property
    def position(self) -> IntArray:
        """Per op, its index in its rank's order (read only)."""
        return _read_only(np.tile(np.arange(self.ops_per_rank, dtype=np.int64), self.schedule.num_stages))

    @cached_property
    def stage_kind(self) -> IntArray:
        """Per op, ``stage * NUM_KINDS + kind``: its row in a (stage, kind) table (read only)."""
        return _read_only(self.stage * NUM_KINDS + self.kind)

    @cached_property
    def send_link(self) -> IntArray:
        """Per op, the link it sends over: ``s`` for F(s) to s + 1 (s < p - 1), ``p - 1 + s - 1``
        for B(s) to s - 1 (s > 0), and ``2 (p - 1)`` for an op that sends nothing (read only)."""
        p = self.schedule.num_stages
        link = np.full(self.num_ops, 2 * (p - 1), dtype=np.int64)
        link[self.forward_at[:-1]] = np.arange(p - 1, dtype=np.int64)[:, None]
        link[self.backward_at[1:]] = p - 1 + np.arange(p - 1, dtype=np.int64)[:, None]
        return _read_only(link)


def columnar_order(
    name: str,
    num_stages: int,
    num_microbatches: int,
    num_minibatches: int,
    *,
    update: Literal["minibatch", "microbatch"] = "minibatch",
) -> ColumnarOrder:
    """The schedule ``build_schedule(name, p, m, num_minibatches=K)`` describes, as columns.

    Flush schedules (gpipe, 1f1b) repeat one minibatch's order K times (blocks of n = m
    microbatches), a U after its last backward; the asynchronous ones run one block of
    n = K*m microbatches with a U after every e-th backward (e = 1 for pipedream and
    per-microbatch pipemare, else m). Within a block, stage s runs the 1F1B order
    (``one_f_one_b_order``): w = min(p - s - 1, n) warm-up forwards, then F(i + w), B(i)
    pairs, then the cool-down backwards; GPipe is the same with w = n::

        t:      0   1   2   3   4   5   6   7          p = 3, n = 4, no U
        s=0:   F0  F1  F2  B0  F3  B1  B2  B3          w = 2
        s=2:   F0  B0  F1  B1  F2  B2  F3  B3          w = 0

    So F(i) sits at t = i (i < w) or 2i - w, and B(i) at w + 2i + 1 (i < n - w) or i + n;
    each op then moves right by the U's before it: one per e backwards already run, and
    max(0, i - w) backwards run before F(i), i before B(i). Call only where ``is_columnar``
    holds.
    """
    assert is_columnar(name, num_stages, num_microbatches), (name, num_stages, num_microbatches)
    p, m = num_stages, num_microbatches
    policy = POLICIES[name]
    if policy is WeightPolicy.FLUSH:
        num_blocks, n, every = num_minibatches, m, m
    else:
        num_blocks, n = 1, num_minibatches * m
        every = 1 if name == "pipedream" or (name == "pipemare" and update == "microbatch") else m
    per_block = n // every  # U's in a block (n is a multiple of e)
    width = 2 * n + per_block
    length = num_blocks * width
    stages = np.arange(p, dtype=np.int64)[:, None]
    warmup = np.full_like(stages, n) if name == "gpipe" else np.minimum(p - 1 - stages, n)
    i = np.arange(n, dtype=np.int64)[None, :]
    forward_updates = np.maximum(i - warmup, 0) // every
    backward_updates = np.broadcast_to(i // every, (p, n))
    forward_pos = np.where(i < warmup, i, 2 * i - warmup) + forward_updates
    backward_pos = np.where(i < n - warmup, warmup + 2 * i + 1, i + n) + backward_updates
    update_pos = backward_pos[:, every - 1::every] + 1
    # Flat index: rank offset + block offset + position in the block.
    base = stages[:, :, None] * length + np.arange(num_blocks, dtype=np.int64)[None, :, None] * width
    forward_at = (base + forward_pos[:, None, :]).reshape(p, -1)
    backward_at = (base + backward_pos[:, None, :]).reshape(p, -1)
    update_at = (base + update_pos[:, None, :]).reshape(p, -1)

    total = p * length
    num_micro, num_updates = num_blocks * n, num_blocks * per_block
    micro_index = np.arange(num_micro, dtype=np.int64)
    update_index = np.arange(num_updates, dtype=np.int64)
    kind = np.full(total, B_CODE, dtype=np.int64)
    kind[forward_at] = F_CODE
    kind[update_at] = U_CODE
    microbatch = np.empty(total, dtype=np.int64)
    microbatch[forward_at] = micro_index
    microbatch[backward_at] = micro_index
    microbatch[update_at] = update_index
    minibatch = np.empty(total, dtype=np.int64)
    step = micro_index // m
    minibatch[forward_at] = step
    minibatch[backward_at] = step
    minibatch[update_at] = ((update_index + 1) * every - 1) // m  # the backward before it
    if policy is WeightPolicy.FLUSH:
        version = minibatch  # minibatch k runs on version k: its stage has made k updates
    else:
        version = np.empty(total, dtype=np.int64)
        version[update_at] = update_index
        if policy is WeightPolicy.DOUBLE_BUFFER:
            version[forward_at] = version[backward_at] = np.maximum(step - 1, 0)
        else:  # one block: the updates before an op are its stage's current version
            version[forward_at] = forward_updates
            # STASH: a backward on its forward's version; SINGLE: the current one.
            version[backward_at] = forward_updates if policy is WeightPolicy.STASH else backward_updates
    # Inputs from other stages: F(s, i) <- F(s-1, i), B(s, i) <- B(s+1, i); a rank's sends
    # over one link are its forwards (or its backwards) in microbatch order.
    wait = np.full(total, -1, dtype=np.int64)
    wait[forward_at[1:]] = forward_at[:-1]
    wait[backward_at[:-1]] = backward_at[1:]
    previous_send = np.full(total, -1, dtype=np.int64)
    previous_send[forward_at[:-1, 1:]] = forward_at[:-1, :-1]
    previous_send[backward_at[1:, 1:]] = backward_at[1:, :-1]
    stage = np.repeat(np.arange(p, dtype=np.int64), length)
    for column in (stage, kind, microbatch, minibatch, version, wait, previous_send, forward_at, backward_at,
                   update_at):
        _read_only(column)  # columns may be shared (version is minibatch under FLUSH; pipesim.reuse)
    schedule = deferred_schedule(name, p, m, num_minibatches, update, policy, total)
    return ColumnarOrder(
        schedule=schedule, ops_per_rank=length, stage=stage, kind=kind, microbatch=microbatch, minibatch=minibatch,
        version=version, wait=wait, previous_send=previous_send, forward_at=forward_at, backward_at=backward_at,
        update_at=update_at,
    )


def _read_only(column: IntArray) -> IntArray:
    column.flags.writeable = False
    return column


def _registry_ranks(name: str, num_stages: int, num_microbatches: int, num_minibatches: int,
                    options: dict[str, Any]) -> tuple[tuple[Op, ...], ...]:
    from pipesim.schedule.registry import build_schedule

    return build_schedule(name, num_stages, num_microbatches, num_minibatches=num_minibatches, **options).ranks


class DeferredSchedule(Schedule):
    """A registry Schedule whose ``ranks`` (the Op objects) are built by the registry's generator
    the first time they are read; everything else is there from the start. It compares and
    hashes as the Schedule the registry builds."""

    if not TYPE_CHECKING:
        def __getattr__(self, name: str) -> Any:
            # Reached only when ordinary lookup fails: "ranks" before its first use.
            build = self.__dict__.get("_build_ranks")
            if name != "ranks" or build is None:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            ranks = build()
            object.__setattr__(self, "ranks", ranks)
            del self.__dict__["_build_ranks"]
            return ranks

    @property
    def num_ranks(self) -> int:
        """Number of ranks (one per stage), without building the ops."""
        return len(self.stage_to_rank)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Schedule):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in fields(Schedule))

    __hash__ = Schedule.__hash__


def deferred_schedule(name: str, num_stages: int, num_microbatches: int, num_minibatches: int, update: str,
                      weights: WeightPolicy, num_ops: int) -> Schedule:
    """The Schedule ``build_schedule`` returns for these arguments, with its ops built on first use."""
    options: dict[str, Any] = {"update": update} if name == "pipemare" else {}
    schedule = object.__new__(DeferredSchedule)
    values = {"name": name, "num_stages": num_stages, "num_microbatches": num_microbatches,
              "num_minibatches": num_minibatches, "stage_to_rank": one_stage_per_rank(num_stages),
              "weights": weights}
    for key, value in values.items():
        object.__setattr__(schedule, key, value)
    # The cached properties that would otherwise read the ops.
    schedule.__dict__.update(num_ops=num_ops, has_split_backward=False,
                             _build_ranks=partial(_registry_ranks, name, num_stages, num_microbatches,
                                                  num_minibatches, options))
    return schedule


__all__ = ["ColumnarOrder", "DeferredSchedule", "POLICIES", "columnar_order",
           "deferred_schedule", "is_columnar"]
