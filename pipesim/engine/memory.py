"""Memory accounting: the byte events of a run, from the order in which its ops ended."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from pipesim import jit
from pipesim.schedule.ir import B_CODE, F_CODE, I_CODE, NUM_KINDS, U_CODE, W_CODE
from pipesim.engine.lowering import Program
from pipesim.engine.trace import CATEGORIES, MEMORY_COLUMNS

WEIGHTS, GRADIENTS, OPTIMIZER, ACTIVATIONS, WORKING = (CATEGORIES.index(c) for c in CATEGORIES)
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
Columns = dict[str, npt.NDArray[np.generic]]


def memory_columns(program: Program, start_s: FloatArray, end_s: FloatArray, *,
                   compiled: bool | None = None) -> Columns:
    """The memory events of a run whose op ``g`` (flat OpTable index) ran from ``start_s[g]`` to ``end_s[g]``.

    At time 0 each stage holds one weight version (and, under ZeRO-3, the whole weights of the
    two largest of its layers, gathered: ``StageCosts.gathered_bytes``), one gradient buffer (its
    weights' size, or ``StageCosts.gradient_bytes``) and its optimizer state (the optimizer state
    multiplier x its weights, or ``StageCosts.optimizer_bytes``).
    An F's end stashes the stage's activation bytes for that microbatch and a B's end frees
    them. With split backward, W frees what I keeps: I's end frees the stash but keeps the
    stage's weight-stash bytes (what W still needs; no event when that is the whole stash),
    and W's end frees those; the microbatch counts as held from F's end to W's end. A stage
    with working bytes (what recomputation re-creates: ``StageCosts.working_bytes``) holds them
    from its B's (or I's) start to its end, in a category of their own ("working"): an event at
    the start, and one at the end. With STASH or DOUBLE_BUFFER weights a U's end adds the new
    version, and a version is freed once it is superseded and its last user has ended; FLUSH
    and SINGLE update in place. Events are in order of time, ends before starts at one instant
    (what a backward frees is free for the next), ends in order of (end, rank, position), as
    both engines finish ops, starts in order of (start, rank, position); the events of one op's
    end in the order stash or free, working bytes given back, add version, free version.

    Which op frees what depends on the order alone: a stage lives on one rank, whose ops end
    in their order, so "the U of version v ended before v's last user" means "comes before it".

    Args:
        compiled: run numba's ``memory_kernel`` (default: ``jit.use_compiled(num_ops)``).
    """
    ops, costs = program.ops, program.costs
    use = jit.use_compiled(ops.num_ops) if compiled is None else compiled
    ends = np.ascontiguousarray(end_s, np.float64)
    starts = np.ascontiguousarray(start_s, np.float64)
    working = np.asarray(costs.working_bytes or np.zeros(costs.num_stages), dtype=np.float64)
    params = np.asarray(costs.param_bytes, dtype=np.float64)
    held = (params if costs.gathered_bytes is None else params + np.asarray(costs.gathered_bytes, dtype=np.float64),
            params if costs.gradient_bytes is None else np.asarray(costs.gradient_bytes, dtype=np.float64),
            params * float(program.info.optimizer_state_multiplier) if costs.optimizer_bytes is None
            else np.asarray(costs.optimizer_bytes, dtype=np.float64))
    columns = jit.pick(memory_kernel, use)(
        np.argsort(ends, kind="stable"), program.schedule.stage_kind, *event_structure(program, use), ends,
        np.asarray(costs.stash_bytes, dtype=np.float64),
        np.asarray(costs.weight_stash_bytes or costs.stash_bytes, dtype=np.float64), params, np.stack(held),
        np.asarray(program.schedule.stage_to_rank, dtype=np.int64),
        working, starts, _start_order(program, starts) if costs.working_bytes else np.zeros(0, np.int64))
    return dict(zip(MEMORY_COLUMNS, columns, strict=True))


def _start_order(program: Program, start_s: FloatArray) -> IntArray:
    """The B and I ops (the ops that may take working bytes at their start), in stable order
    by start: flat indices. Which ops those are depends on the order alone (kept in
    ``Schedule.derived``)."""
    backward: IntArray | None = program.derived.get("backward_ops")
    if backward is None:
        kind = program.ops.kind
        backward = np.flatnonzero((kind == B_CODE) | (kind == I_CODE))
        backward.flags.writeable = False
        program.derived["backward_ops"] = backward
    return backward.take(np.argsort(start_s.take(backward), kind="stable"))


def event_structure(program: Program, compiled: bool) -> tuple[npt.NDArray[np.uint8], IntArray, int]:
    """What of the memory events depends on the order alone (``order_events``), computed once
    per schedule and kept in ``Schedule.derived``."""
    known: tuple[npt.NDArray[np.uint8], IntArray, int] | None = program.derived.get("memory_events")
    if known is None:
        ops = program.ops
        bits, counts, num_version_events = jit.pick(order_events, compiled)(
            ops.stage, ops.kind, ops.version, program.schedule.num_stages, program.keeps_versions)
        bits.flags.writeable = counts.flags.writeable = False
        known = (bits, counts, int(num_version_events))
        program.derived["memory_events"] = known
    return known


@jit.jit
def order_events(stage: IntArray, kind: IntArray, version: IntArray, num_stages: int,
                 keeps_versions: bool) -> tuple[npt.NDArray[np.uint8], IntArray, int]:
    """The memory events' parts that depend on the order alone: per op, the weight-version
    events of its end as bits (2 adds a version (U), 4 frees the version it supersedes (U,
    when that version's last user came before it), 8 frees a superseded version (its last
    user, after the U that superseded it); all 0 unless ``keeps_versions``: FLUSH and SINGLE
    update in place); the ops per (stage, kind), row-major; and the number of version events."""
    n = kind.shape[0]
    bits = np.zeros(n, np.uint8)
    counts = np.zeros(num_stages * NUM_KINDS, np.int64)
    for g in range(n):
        counts[stage[g] * NUM_KINDS + kind[g]] += 1
    if not keeps_versions or n == 0:
        return bits, counts, 0
    width = version.max() + 2
    # Per (stage, version): its U and its last other user (flat order within a stage is its rank's order).
    last_user = np.full(num_stages * width, -1, dtype=np.int64)
    update_of = np.full(num_stages * width, -1, dtype=np.int64)
    for g in range(n):
        if kind[g] == U_CODE:
            update_of[stage[g] * width + version[g]] = g
        else:
            last_user[stage[g] * width + version[g]] = g
    total = 0
    for g in range(n):
        key = stage[g] * width + version[g]
        if kind[g] == U_CODE:
            bits[g] = 6 if last_user[key] < g else 2
            total += 2 if last_user[key] < g else 1
        elif last_user[key] == g and 0 <= update_of[key] < g:
            bits[g] = 8
            total += 1
    return bits, counts, total


@jit.jit(inline=True)
def activation_events(k: int, takes: bool, partial: bool) -> int:
    """The activation events of an op of kind ``k`` as bits: 1 at its end, 16 takes working bytes
    at its start and gives them back at its end (a B or I of a stage that re-creates activations:
    ``takes``). ``partial``: its stage's I keeps part of the stash. Scalars only, so that the
    compiled caller inlines it."""
    bits = 16 if takes and (k == B_CODE or k == I_CODE) else 0
    if k == F_CODE or k == B_CODE or k == W_CODE or (k == I_CODE and partial):
        bits |= 1
    return bits


@jit.jit(inline=True)
def _starts_before(limit: float, taken: int, row: int, start_order: IntArray, start_s: FloatArray,
                   stage_kind: IntArray, stage_to_rank: IntArray, activations: IntArray, working: FloatArray,
                   time_s: FloatArray, device: IntArray, stage_of: IntArray, category: IntArray, delta: FloatArray,
                   count: IntArray) -> tuple[int, int]:
    """Write the working-bytes events of the starts in ``start_order`` from ``taken`` on that
    come before ``limit``; returns the new ``(taken, row)``."""
    while taken < start_order.shape[0] and start_s[start_order[taken]] < limit:
        h = start_order[taken]
        taken += 1
        j = stage_kind[h]
        if activations[j] & 16:
            s = j // NUM_KINDS
            time_s[row], device[row], stage_of[row] = start_s[h], stage_to_rank[s], s
            category[row], delta[row], count[row] = WORKING, working[s], 0
            row += 1
    return taken, row


@jit.jit
def memory_kernel(order: IntArray, stage_kind: IntArray, versions: npt.NDArray[np.uint8], op_counts: IntArray,
                  num_version_events: int, end_s: FloatArray, stash: FloatArray, kept: FloatArray, params: FloatArray,
                  held: FloatArray, stage_to_rank: IntArray, working: FloatArray, start_s: FloatArray,
                  start_order: IntArray) -> tuple[FloatArray, IntArray, IntArray, IntArray, FloatArray, IntArray]:
    """``memory_columns`` in one pass over the ops in order of time: the columns in
    MEMORY_COLUMNS order, counted first from the ops per (stage, kind).

    ``order`` is the ops' stable order by end (flat indices), ``start_order`` that of the B and
    I ops by start (empty without working bytes): the events follow them, merged by time.
    ``versions``, ``op_counts`` and ``num_version_events``: what ``order_events`` gives; an op's
    activation event (its bits, bytes and count) is looked up by its row ``stage_kind``, which
    also gives its stage, and the stage its rank. ``held[c, s]``: what stage s holds of category
    c (weights, gradients, optimizer) from time 0; ``params[s]``: the bytes of one more version.
    """
    p = stash.shape[0]
    total = 3 * p + num_version_events
    activations = np.empty(p * NUM_KINDS, np.int64)  # per (stage, kind): activation_events, bytes, count
    bytes_of = np.zeros(p * NUM_KINDS)
    count_of = np.zeros(p * NUM_KINDS, np.int64)
    for s in range(p):
        for k in range(NUM_KINDS):
            j = s * NUM_KINDS + k
            bits = activation_events(k, working[s] != 0.0, kept[s] != stash[s])
            activations[j] = bits
            total += op_counts[j] * ((bits & 1) + 2 * (bits >> 4 & 1))
            if k == F_CODE:
                bytes_of[j], count_of[j] = stash[s], 1
            elif k == B_CODE:
                bytes_of[j], count_of[j] = -stash[s], -1
            elif k == I_CODE:
                bytes_of[j], count_of[j] = kept[s] - stash[s], 0
            else:
                bytes_of[j], count_of[j] = -kept[s], -1
    time_s, device, stage_of = np.empty(total), np.empty(total, np.int64), np.empty(total, np.int64)
    category, delta, count = np.empty(total, np.int64), np.empty(total), np.empty(total, np.int64)
    for s in range(p):
        for c in range(3):
            time_s[3 * s + c], device[3 * s + c], stage_of[3 * s + c], category[3 * s + c] = 0.0, stage_to_rank[s], s, c
            delta[3 * s + c], count[3 * s + c] = held[c, s], 1
    row = 3 * p
    taken = 0  # the starts written so far: each start that takes working bytes goes before the first end after it
    starts = start_order.shape[0]
    next_start = start_s[start_order[0]] if starts else np.inf  # the first start not written yet
    for i in range(order.shape[0]):
        g = order[i]
        t = end_s[g]
        if next_start < t:
            taken, row = _starts_before(t, taken, row, start_order, start_s, stage_kind, stage_to_rank, activations,
                                        working, time_s, device, stage_of, category, delta, count)
            next_start = start_s[start_order[taken]] if taken < starts else np.inf
        j = stage_kind[g]
        e = (activations[j] & 17) | int(versions[g])
        if e == 0:
            continue
        s = j // NUM_KINDS
        d = stage_to_rank[s]  # a stage lives on one rank
        if e & 1:
            time_s[row], device[row], stage_of[row] = t, d, s
            category[row], delta[row], count[row] = ACTIVATIONS, bytes_of[j], count_of[j]
            row += 1
        if e & 16:  # the working bytes its start took
            time_s[row], device[row], stage_of[row] = t, d, s
            category[row], delta[row], count[row] = WORKING, -working[s], 0
            row += 1
        if e & 14:
            for bit in (2, 8, 4):  # the op's version events, after its activations
                if e & bit:
                    time_s[row], device[row], stage_of[row], category[row] = t, d, s, WEIGHTS
                    if bit == 2:
                        delta[row], count[row] = params[s], 1
                    else:
                        delta[row], count[row] = -params[s], -1
                    row += 1
    _starts_before(np.inf, taken, row, start_order, start_s, stage_kind, stage_to_rank, activations, working,
                   time_s, device, stage_of, category, delta, count)
    return time_s, device, stage_of, category, delta, count
