"""The one-stage-per-rank registry schedules as numpy columns, by index arithmetic (no Op objects)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from pipesim.schedule.ir import Op, Schedule, WeightPolicy, one_stage_per_rank

IntArray = npt.NDArray[np.int64]

# Kind codes: the index of the kind in OpKind (F, B, I, W, U), as engine.columns.KIND_ORDER.
F_CODE, B_CODE, U_CODE = 0, 1, 4

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
        stage, kind, microbatch: per op (kind codes as ``OpKind``'s order; the update index for U).
        minibatch: step index (a U counts in the minibatch of the op before it).
        version: weight version used (for U: the version it updates), as ``assign_versions``.
        wait: flat index of the op of another stage whose output it waits for, or -1.
        send_target: stage receiving the op's output, or -1.
        previous_send: flat index of the previous op sending over the same rank pair, or -1.
    """

    schedule: Schedule
    ops_per_rank: int
    stage: IntArray
    kind: IntArray
    microbatch: IntArray
    minibatch: IntArray
    version: IntArray
    wait: IntArray
    send_target: IntArray
    previous_send: IntArray

    @property
    def num_ops(self) -> int:
        """Number of ops."""
        return int(self.stage.shape[0])


def block_order(num_stages: int, num_microbatches: int, *, flush_all: bool) -> tuple[IntArray, IntArray]:
    """Kind codes and microbatches of every stage's 1F1B (or GPipe) order, as ``(p, 2n)`` arrays.

    Row s is ``one_f_one_b_order(p, s, n)``: position t holds a warm-up forward while
    ``t < w`` (w = min(p - s - 1, n)), then F(j + w), B(j) pairs (t - w = 2j, 2j + 1), then the
    cool-down backwards B(t - n) once ``t >= 2n - w``. GPipe is the same with w = n::

        t:      0   1   2   3   4   5   6   7          p = 3, n = 4
        s=0:   F0  F1  F2  B0  F3  B1  B2  B3          w = 2
        s=2:   F0  B0  F1  B1  F2  B2  F3  B3          w = 0
    """
    n = num_microbatches
    t = np.arange(2 * n, dtype=np.int64)[None, :]
    stages = np.arange(num_stages, dtype=np.int64)[:, None]
    w = np.full_like(stages, n) if flush_all else np.minimum(num_stages - 1 - stages, n)
    offset = t - w
    middle = (offset >= 0) & (t < 2 * n - w)
    pair, odd = offset >> 1, offset & 1
    is_forward = (offset < 0) | (middle & (odd == 0))
    microbatch = np.where(offset < 0, t, np.where(middle, pair + w * (1 - odd), t - n))
    kind = np.where(is_forward, F_CODE, B_CODE)
    return kind, microbatch


def columnar_order(
    name: str,
    num_stages: int,
    num_microbatches: int,
    num_minibatches: int,
    *,
    update: Literal["minibatch", "microbatch"] = "minibatch",
) -> ColumnarOrder:
    """The schedule ``build_schedule(name, p, m, num_minibatches=K)`` describes, as columns.

    Flush schedules (gpipe, 1f1b) repeat one minibatch's order K times, a U after each; the
    asynchronous ones run the 1F1B order over all K*m microbatches with a U after every
    ``e``-th backward (e = 1 for pipedream and per-microbatch pipemare, else m). Call only
    where ``is_columnar`` holds.
    """
    assert is_columnar(name, num_stages, num_microbatches), (name, num_stages, num_microbatches)
    p, m, k = num_stages, num_microbatches, num_minibatches
    policy = POLICIES[name]
    if policy is WeightPolicy.FLUSH:
        num_blocks, n, every = k, m, m
    else:
        num_blocks, n = 1, k * m
        every = 1 if name == "pipedream" or (name == "pipemare" and update == "microbatch") else m
    base_kind, base_micro = block_order(p, n, flush_all=name == "gpipe")
    # Each triggering backward is followed by its U: base position t moves right by the
    # number of triggers before it.
    trigger = (base_kind == B_CODE) & ((base_micro + 1) % every == 0)
    shift = np.cumsum(trigger, axis=1) - trigger
    per_block = n // every  # updates in a block; each row has exactly these triggers
    width = 2 * n + per_block
    destination = np.arange(2 * n, dtype=np.int64)[None, :] + shift
    update_at = destination[trigger].reshape(p, per_block) + 1
    blocks = np.arange(num_blocks, dtype=np.int64)[None, :, None]
    kind = np.empty((p, num_blocks, width), dtype=np.int64)
    micro = np.empty((p, num_blocks, width), dtype=np.int64)
    rows = np.arange(p, dtype=np.int64)[:, None, None]
    kind[rows, blocks, destination[:, None, :]] = base_kind[:, None, :]
    micro[rows, blocks, destination[:, None, :]] = base_micro[:, None, :] + blocks * n
    kind[rows, blocks, update_at[:, None, :]] = U_CODE
    micro[rows, blocks, update_at[:, None, :]] = np.arange(per_block, dtype=np.int64)[None, None, :] + blocks * per_block
    length = num_blocks * width
    kind_flat, micro_flat = kind.reshape(-1), micro.reshape(-1)
    return _derived_columns(name, p, m, k, update, policy, length, kind_flat, micro_flat)


def _derived_columns(
    name: str, p: int, m: int, k: int, update: str, policy: WeightPolicy, length: int,
    kind: IntArray, micro: IntArray,
) -> ColumnarOrder:
    """Minibatch, version, wait, send target and previous send of the order (kind, micro)."""
    total = p * length
    stage = np.repeat(np.arange(p, dtype=np.int64), length)
    is_update = kind == U_CODE
    is_forward, is_backward = kind == F_CODE, kind == B_CODE
    minibatch = micro // m
    updates = np.flatnonzero(is_update)
    minibatch[updates] = minibatch[updates - 1]  # the backward it follows (never a U, never across ranks)
    # Flat index of the F and of the B of every (stage, microbatch).
    num_micro = k * m
    forward_at = np.empty(p * num_micro, dtype=np.int64)
    backward_at = np.empty(p * num_micro, dtype=np.int64)
    forwards, backwards = np.flatnonzero(is_forward), np.flatnonzero(is_backward)
    forward_at[stage[forwards] * num_micro + micro[forwards]] = forwards
    backward_at[stage[backwards] * num_micro + micro[backwards]] = backwards
    forward_at, backward_at = forward_at.reshape(p, num_micro), backward_at.reshape(p, num_micro)
    now = np.cumsum(is_update.reshape(p, length), axis=1).reshape(-1) - is_update
    if policy is WeightPolicy.DOUBLE_BUFFER:
        version = np.where(is_update, now, np.maximum(0, minibatch - 1))
    elif policy is WeightPolicy.STASH:
        version = now.copy()
        version[backward_at.reshape(-1)] = now[forward_at.reshape(-1)]
    else:
        version = now
    # Inputs from other stages and where outputs go: F(s, i) <- F(s-1, i), B(s, i) <- B(s+1, i).
    wait = np.full(total, -1, dtype=np.int64)
    send_target = np.full(total, -1, dtype=np.int64)
    previous_send = np.full(total, -1, dtype=np.int64)
    wait[forward_at[1:]] = forward_at[:-1]
    wait[backward_at[:-1]] = backward_at[1:]
    send_target[forward_at[:-1]] = np.arange(1, p, dtype=np.int64)[:, None]
    send_target[backward_at[1:]] = np.arange(0, p - 1, dtype=np.int64)[:, None]
    # A rank's sends over one link are its forwards (or its backwards) in microbatch order.
    previous_send[forward_at[:-1, 1:]] = forward_at[:-1, :-1]
    previous_send[backward_at[1:, 1:]] = backward_at[1:, :-1]
    schedule = deferred_schedule(name, p, m, k, update, policy, total)
    return ColumnarOrder(schedule=schedule, ops_per_rank=length, stage=stage, kind=kind, microbatch=micro,
                         minibatch=minibatch, version=version, wait=wait, send_target=send_target,
                         previous_send=previous_send)


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


__all__ = ["ColumnarOrder", "DeferredSchedule", "POLICIES", "block_order", "columnar_order",
           "deferred_schedule", "is_columnar"]
