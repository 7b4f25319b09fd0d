"""Memory accounting: the byte events of a run, from the order in which its ops ended."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import numpy.typing as npt

from pipesim import jit
from pipesim.schedule.ir import B_CODE, F_CODE, I_CODE, U_CODE, W_CODE
from pipesim.engine.kernel_policy import kernels_pay_off
from pipesim.engine.lowering import Program
from pipesim.engine.trace import CATEGORIES, MEMORY_COLUMNS, TraceBuilder

WEIGHTS, GRADIENTS, OPTIMIZER, ACTIVATIONS = (CATEGORIES.index(c) for c in CATEGORIES)
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
Columns = dict[str, npt.NDArray[np.generic]]
MemoryMethod = Literal["auto", "kernel", "numpy"]


def memory_columns(program: Program, end_s: FloatArray, *,
                   method: MemoryMethod = "auto", compiled: bool = True) -> Columns:
    """The memory events of a run whose op ``g`` (flat OpTable index) ended at ``end_s[g]``.

    At time 0 each stage holds one weight version, one gradient buffer and its optimizer state.
    An F's end stashes the stage's activation bytes for that microbatch and a B's end frees
    them. With split backward, W frees what I keeps: I's end frees the stash but keeps the
    stage's weight-stash bytes (what W still needs; no event when that is the whole stash),
    and W's end frees those; the microbatch counts as held from F's end to W's end. With STASH or DOUBLE_BUFFER weights a U's end adds the new
    version, and a version is freed once it is superseded and its last user has ended; FLUSH
    and SINGLE update in place. Events are in order of (end, rank, position), as both engines
    finish ops; the events of one op in the order stash, free, add version, free version.

    Which op frees what depends on the order alone: a stage lives on one rank, whose ops end
    in their order, so "the U of version v ended before v's last user" means "comes before it".

    Args:
        method: ``"kernel"`` (``memory_kernel``: plain Python unless numba compiled it),
            ``"numpy"``, or ``"auto"``: the kernel where it pays off
            (``kernel_policy.kernels_pay_off``). All give the same columns.
        compiled: False runs the kernel's plain-Python form even where numba compiled it.
    """
    if method == "kernel" or (method == "auto" and kernels_pay_off(program.ops.num_ops)):
        ops, costs = program.ops, program.costs
        ends = np.ascontiguousarray(end_s, np.float64)
        kernel = memory_kernel if compiled else getattr(memory_kernel, "py_func", memory_kernel)
        columns = kernel(
            np.argsort(ends, kind="stable"), ops.rank, ops.stage, ops.kind, ops.version, ends,
            np.asarray(costs.stash_bytes, dtype=np.float64),
            np.asarray(costs.weight_stash_bytes or costs.stash_bytes, dtype=np.float64),
            np.asarray(costs.param_bytes, dtype=np.float64), float(program.info.optimizer_state_multiplier),
            program.keeps_versions, np.asarray(program.schedule.stage_to_rank, dtype=np.int64))
        return dict(zip(MEMORY_COLUMNS, columns, strict=True))
    return _memory_columns_numpy(program, end_s)


def _memory_columns_numpy(program: Program, end_s: FloatArray) -> Columns:
    """``memory_columns`` by column, in numpy."""
    ops = program.ops
    schedule = program.schedule
    p, n = schedule.num_stages, ops.num_ops
    params = np.asarray(program.costs.param_bytes, dtype=np.float64)
    stash = np.asarray(program.costs.stash_bytes, dtype=np.float64)
    kept = np.asarray(program.costs.weight_stash_bytes or program.costs.stash_bytes, dtype=np.float64)
    multiplier = float(program.info.optimizer_state_multiplier)
    stage_to_rank = np.asarray(schedule.stage_to_rank, dtype=np.int64)

    # Per op, its events in flat order (op by op; within an op: activations, then the version
    # it adds or frees at its end, then the version a U frees). At most one activation event
    # per op: F stashes, B frees, I frees all but what W keeps, W frees that.
    kind, stage = ops.kind, ops.stage
    activation_delta = np.stack([stash, -stash, kept - stash, -kept, np.zeros(p)])  # by kind code, stage
    activation_count = np.array([1, -1, 0, -1, 0], dtype=np.int64)
    has_activation = (kind == F_CODE) | (kind == B_CODE) | (kind == W_CODE)
    if bool((kind == I_CODE).any()):
        has_activation |= (kind == I_CODE) & (kept != stash)[stage]
    num_events = has_activation.astype(np.int64)
    if program.keeps_versions and n:
        added, freed_at_update, freed_at_last_use = _version_events(program)
        num_events[added] += 1
        num_events[freed_at_update] += 1
        num_events[freed_at_last_use] += 1
    first = np.cumsum(num_events) - num_events  # index of each op's first event
    total = int(first[-1] + num_events[-1]) if n else 0
    event_op = np.repeat(np.arange(n, dtype=np.int64), num_events)
    category = np.full(total, WEIGHTS, dtype=np.int64)
    delta = np.empty(total)
    count = np.empty(total, dtype=np.int64)
    g = np.flatnonzero(has_activation)
    at = first[g]
    category[at] = ACTIVATIONS
    delta[at] = activation_delta[kind[g], stage[g]]
    count[at] = activation_count[kind[g]]
    if program.keeps_versions and n:
        # A U has no activation event: it adds at its first event and frees at its second; a
        # last user frees after its activation event.
        for ops_of, offset, sign in ((added, 0, 1.0), (freed_at_update, 1, -1.0),
                                     (freed_at_last_use, has_activation[freed_at_last_use], -1.0)):
            at = first[ops_of] + offset
            delta[at] = sign * params[stage[ops_of]]
            count[at] = int(sign)
    # Events are in flat order (rank, position, event within the op); a stable sort by end keeps
    # it on ties, and each rank's ends rise, so the sort merges one sorted run per rank.
    event_end = end_s[event_op]
    order = np.argsort(event_end, kind="stable")
    del event_end
    event_op = event_op[order]
    initial = 3 * p
    columns: dict[str, npt.NDArray[np.generic]] = {}
    for name, dtype, head in (
        ("time_s", np.float64, 0.0),
        ("device", np.int64, np.repeat(stage_to_rank, 3)),
        ("stage", np.int64, np.repeat(np.arange(p, dtype=np.int64), 3)),
        ("category", np.int64, np.tile(np.array([WEIGHTS, GRADIENTS, OPTIMIZER], np.int64), p)),
        ("delta_bytes", np.float64, np.stack([params, params, params * multiplier], axis=1).reshape(-1)),
        ("delta_count", np.int64, 1),
    ):
        column = np.empty(initial + total, dtype=dtype)
        column[:initial] = head
        columns[name] = column
    np.take(end_s, event_op, out=columns["time_s"][initial:], mode="clip")
    np.take(ops.rank, event_op, out=columns["device"][initial:], mode="clip")
    np.take(stage, event_op, out=columns["stage"][initial:], mode="clip")
    np.take(category, order, out=columns["category"][initial:], mode="clip")
    np.take(delta, order, out=columns["delta_bytes"][initial:], mode="clip")
    np.take(count, order, out=columns["delta_count"][initial:], mode="clip")
    assert tuple(columns) == MEMORY_COLUMNS
    return columns


@jit.jit
def memory_kernel(order: IntArray, rank: IntArray, stage: IntArray, kind: IntArray, version: IntArray,
                  end_s: FloatArray, stash: FloatArray, kept: FloatArray, params: FloatArray, multiplier: float,
                  keeps_versions: bool, stage_to_rank: IntArray,
                  ) -> tuple[FloatArray, IntArray, IntArray, IntArray, FloatArray, IntArray]:
    """``memory_columns`` in two passes over the ops: the columns in MEMORY_COLUMNS order.

    ``order`` is the ops' stable order by end (flat indices): the events follow it.
    """
    n, p = kind.shape[0], stash.shape[0]
    # Per op, its events as bits: 1 activations, 2 adds a version (U), 4 frees the version it
    # supersedes (U), 8 frees a superseded version (its last user).
    events = np.zeros(n, dtype=np.uint8)
    for g in range(n):
        k = kind[g]
        if k == F_CODE or k == B_CODE or k == W_CODE or (k == I_CODE and kept[stage[g]] != stash[stage[g]]):
            events[g] = 1
    if keeps_versions and n > 0:
        width = version.max() + 2
        last_user = np.full(p * width, -1, dtype=np.int64)
        update_of = np.full(p * width, -1, dtype=np.int64)
        for g in range(n):  # flat order within a stage is its rank's order
            if kind[g] == U_CODE:
                update_of[stage[g] * width + version[g]] = g
            else:
                last_user[stage[g] * width + version[g]] = g
        for g in range(n):
            key = stage[g] * width + version[g]
            if kind[g] == U_CODE:
                events[g] |= 2
                if last_user[key] < g:
                    events[g] |= 4
            elif last_user[key] == g and 0 <= update_of[key] < g:
                events[g] |= 8
    total = 3 * p
    for g in range(n):
        e = np.int64(events[g])
        total += (e & 1) + ((e >> 1) & 1) + ((e >> 2) & 1) + ((e >> 3) & 1)
    time_s, device, stage_of = np.zeros(total), np.empty(total, np.int64), np.empty(total, np.int64)
    category, delta, count = np.empty(total, np.int64), np.empty(total), np.ones(total, np.int64)
    for s in range(p):
        for c in range(3):
            device[3 * s + c], stage_of[3 * s + c], category[3 * s + c] = stage_to_rank[s], s, c
            delta[3 * s + c] = params[s] * multiplier if c == OPTIMIZER else params[s]
    row = 3 * p
    for g in order:
        e = np.int64(events[g])
        if e == 0:
            continue
        t, s = end_s[g], stage[g]
        for bit in (1, 2, 8, 4):  # the events of one op: activations, then versions
            if e & bit:
                time_s[row], device[row], stage_of[row] = t, rank[g], s
                if bit == 1:
                    category[row] = ACTIVATIONS
                    k = kind[g]
                    if k == F_CODE:
                        delta[row] = stash[s]
                    elif k == B_CODE:
                        delta[row], count[row] = -stash[s], -1
                    elif k == I_CODE:
                        delta[row], count[row] = kept[s] - stash[s], 0
                    else:
                        delta[row], count[row] = -kept[s], -1
                else:
                    category[row] = WEIGHTS
                    if bit == 2:
                        delta[row] = params[s]
                    else:
                        delta[row], count[row] = -params[s], -1
                row += 1
    return time_s, device, stage_of, category, delta, count


def _version_events(program: Program) -> tuple[npt.NDArray[np.int64], ...]:
    """Flat indices of: every U (adds a version); the U that frees the version it supersedes
    (its last user came before it, or it has none); the last user that frees a version
    already superseded."""
    ops = program.ops
    updates = np.flatnonzero(ops.kind == U_CODE)
    users = np.flatnonzero(ops.kind != U_CODE)
    width = int(ops.version.max()) + 2
    last_user = np.full(program.schedule.num_stages * width, -1, dtype=np.int64)
    # Flat order within a stage is its rank's order: the largest index is the last user.
    np.maximum.at(last_user, ops.stage[users] * width + ops.version[users], users)
    update_key = ops.stage[updates] * width + ops.version[updates]
    last = last_user[update_key]
    freed_at_update = updates[last < updates]
    superseded = np.full(last_user.shape[0], -1, dtype=np.int64)
    superseded[update_key] = updates
    has_user = np.flatnonzero(last_user >= 0)
    update_of_user = superseded[has_user]
    late = (update_of_user >= 0) & (update_of_user < last_user[has_user])
    freed_at_last_use = last_user[has_user][late]
    return updates, freed_at_update, np.sort(freed_at_last_use)


def record_memory(program: Program, end_s: Sequence[Sequence[float]] | npt.NDArray[np.float64],
                  builder: TraceBuilder) -> None:
    """Add to ``builder`` the memory events of a run (see ``memory_columns``).

    Args:
        end_s: per rank, the end of each op in its order; or one flat array in OpTable order.
    """
    if isinstance(end_s, np.ndarray):
        flat = end_s.astype(np.float64, copy=False)
    else:
        flat = np.asarray([end for ends in end_s for end in ends], dtype=np.float64)
    columns = memory_columns(program, flat)
    for column in MEMORY_COLUMNS:
        builder.memory[column].extend(columns[column].tolist())
