"""The analytic engine: the DES engine's timeline as a longest-path pass over the op graph."""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

from pipesim import jit
from pipesim.engine.assemble import build_trace, trace_from_times
from pipesim.engine.lowering import OpTable, Program
from pipesim.engine.trace import Trace
from pipesim.errors import ConfigError, DeadlockError
from pipesim.schedule.ir import grid

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Method = Literal["auto", "kernel", "rounds", "loop"]

# Below this many ranks a plain loop beats numpy's per-call overhead (one round per op).
_ROUNDS_FROM_RANKS = 6
# Rounds run between checks for a round in which no rank moved (finished, or deadlock).
_CHECK_EVERY = 16


def analytic_unsupported(program: Program, *, jitter: float = 0.0) -> str | None:
    """Why the analytic engine cannot reproduce the DES engine for this run, or None if it can.

    It applies to deterministic runs (no jitter) on links without contention: then every
    op's start is a max of known ends and each link is a first-in first-out queue in its
    rank's order, which is what the DES engine simulates.
    """
    if jitter != 0:
        return f"jitter={jitter} needs the des engine (the analytic engine is deterministic)"
    if program.has_link_contention:
        return "the topology shares links between flows (contention), which only the des engine models"
    return None


def run_analytic(program: Program, *, method: Method = "auto") -> Trace:
    """The Trace the DES engine gives for ``program``, computed without simulating events.

    Each rank runs its ops in order: op j starts at max(end of op j-1 on the rank, arrival
    of its input), and a send starts at max(end of its op, arrival of the previous send on
    its link). These are the DES engine's rules with the same floating-point operations in
    the same order, so both engines give the same spans bit for bit, whichever method runs.

    Args:
        method: ``"kernel"`` (one sequential pass, ``solve_kernel``: compiled when numba is
            installed, see ``pipesim.jit``), ``"rounds"`` (numpy, all ranks a step at a
            time), ``"loop"`` (plain Python, rank by rank; faster than rounds for very few
            ranks) or ``"auto"``: the kernel when it is compiled, else rounds or loop.

    Raises:
        DeadlockError: some rank cannot proceed; names each stuck op and what it waits for.
        ConfigError: the analytic engine does not apply (see ``analytic_unsupported``).
    """
    reason = analytic_unsupported(program)
    if reason is not None:
        raise ConfigError("engine", "analytic", reason)
    ops = program.ops
    if method == "auto":
        method = "kernel" if jit.ENABLED else "rounds" if ops.num_ranks >= _ROUNDS_FROM_RANKS else "loop"
    meta = {**program.meta, "engine": "analytic", "jitter": 0.0}
    if method == "kernel":
        start, end, arrival, stuck = solve_in_span_order(ops)
        if stuck:
            _raise_deadlock(program, stuck, arrival)
        return trace_from_times(program, start, end, meta)
    end, arrival, stuck = (_solve_rounds if method == "rounds" else _solve_loop)(ops)
    if stuck:
        _raise_deadlock(program, stuck, arrival)
    return build_trace(program, end, arrival, meta)


def solve_in_span_order(ops: OpTable, *, compiled: bool = True) -> tuple[FloatArray, FloatArray, FloatArray, list[int]]:
    """Run ``solve_kernel`` and return its results in the Trace's span order.

    Returns:
        starts and ends of every span (``assemble.build_trace``'s order: one compute span
        per op, then one send span per remote send), the arrival of every op's output
        (+inf where it never ran) and the ops stuck at the front of their ranks.
    Args:
        compiled: False runs the kernel's plain-Python form even when numba compiled it
            (tests compare the two).
    """
    n = ops.num_ops
    remote = ops.is_remote_send
    send_row = np.full(n, -1, dtype=np.int64)
    send_row[remote] = n + np.arange(int(np.count_nonzero(remote)), dtype=np.int64)
    total = n + int(np.count_nonzero(remote))
    start, end, arrival = np.empty(total), np.empty(total), np.full(n, np.inf)
    kernel = solve_kernel if compiled else getattr(solve_kernel, "py_func", solve_kernel)
    cursor = kernel(ops.rank_offsets, ops.rank, ops.wait, ops.previous_send, ops.duration_s, ops.transfer_s,
                    send_row, start, end, arrival)
    stuck = [g for g, last in zip(cursor.tolist(), ops.rank_offsets[1:].tolist(), strict=True) if g < last]
    return start, end, arrival, stuck


@jit.jit
def solve_kernel(rank_offsets: IntArray, rank: IntArray, wait: IntArray, previous_send: IntArray,
                 duration_s: FloatArray, transfer_s: FloatArray, send_row: IntArray,
                 start_s: FloatArray, end_s: FloatArray, arrival_s: FloatArray) -> IntArray:
    """The longest-path pass, one op at a time in an order the dependencies allow.

    A rank runs its ops in order until the next one's input has not arrived; it resumes when
    the op it waits for ends (each output has at most one consumer). Writes op ``g``'s start
    and end to ``start_s[g]``, ``end_s[g]`` and, where it sends to another rank, the send's
    start and arrival to row ``send_row[g]`` of the same arrays; ``arrival_s[g]`` (all +inf
    on entry) gets its output's arrival. Returns each rank's next op index (the rank's end
    offset when it finished: otherwise it is stuck).
    """
    num_ranks = rank_offsets.shape[0] - 1
    n = wait.shape[0]
    consumer = np.full(n, -1, dtype=np.int64)
    for g in range(n):
        if wait[g] >= 0:
            consumer[wait[g]] = g
    cursor = rank_offsets[:-1].copy()
    free = np.zeros(num_ranks)
    queued = np.ones(num_ranks, dtype=np.bool_)
    stack = np.empty(num_ranks, dtype=np.int64)
    for r in range(num_ranks):
        stack[r] = num_ranks - 1 - r
    top = num_ranks
    while top > 0:
        top -= 1
        r = stack[top]
        queued[r] = False
        g, last, now = cursor[r], rank_offsets[r + 1], free[r]
        while g < last:
            producer = wait[g]
            if producer >= 0:
                ready = arrival_s[producer]
                if ready == np.inf:
                    break
                if ready > now:
                    now = ready
            start_s[g] = now
            now = now + duration_s[g]
            end_s[g] = now
            row = send_row[g]
            if row >= 0:
                before = previous_send[g]
                link_free = arrival_s[before] if before >= 0 else 0.0
                sent = now if now > link_free else link_free
                start_s[row] = sent
                sent = sent + transfer_s[g]
                end_s[row] = sent
                arrival_s[g] = sent
            else:
                arrival_s[g] = now
            c = consumer[g]
            if c >= 0:
                q = rank[c]
                if cursor[q] == c and not queued[q]:
                    queued[q] = True
                    stack[top] = q
                    top += 1
            g += 1
        cursor[r], free[r] = g, now
    return cursor


def _solve_rounds(ops: OpTable) -> tuple[FloatArray, FloatArray, list[int]]:
    """All ranks advance together, one op per round. Returns ends, arrivals and stuck ops.

    Slots are laid out position-major: op j of rank r sits in slot ``(j + 1) * R + r``, so in
    each round the ranks' next ops lie close together in memory (ranks move in step). Row 0
    holds head slots (never run: a rank's first op follows an end of 0) and the rows past a
    rank's last op hold blocker slots, which wait for NEVER: a rank that has run all its ops
    stays on its blocker. An output not yet arrived is +inf; a rank whose next input is +inf
    computes +inf and does not move.
    """
    n, num_ranks = ops.num_ops, ops.num_ranks
    lengths = np.diff(ops.rank_offsets)
    rows = int(lengths.max(initial=0)) + 2
    slot = (ops.position + 1) * num_ranks + ops.rank
    size = rows * num_ranks + 2
    zero, never = size - 2, size - 1
    wait = np.full(size, never, dtype=np.int64)
    wait[slot] = np.where(ops.wait >= 0, slot[np.maximum(ops.wait, 0)], zero)
    previous_send = np.full(size, zero, dtype=np.int64)
    previous_send[slot] = np.where(ops.previous_send >= 0, slot[np.maximum(ops.previous_send, 0)], zero)
    duration = np.zeros(size)
    duration[slot] = ops.duration_s
    transfer = np.zeros(size)
    transfer[slot] = np.where(ops.is_remote_send, ops.transfer_s, 0.0)
    arrival = np.full(size, np.inf)
    arrival[zero] = 0.0
    # after[q] = ends[q + R] is the end of slot q, so ends[q] is the end of the op before q on
    # its rank (0 for a first op: the head slot before it is never run).
    ends = np.zeros(size + num_ranks)
    after = ends[num_ranks:]
    ranks = np.arange(num_ranks, dtype=np.int64)
    cursor = num_ranks + ranks
    infinity = np.float64(np.inf)
    moved = np.ones(num_ranks, dtype=bool)
    while moved.any():
        for _ in range(_CHECK_EVERY):
            start = np.maximum(ends[cursor], arrival[wait[cursor]])
            end = start + duration[cursor]
            after[cursor] = end
            sent = np.maximum(end, arrival[previous_send[cursor]])
            sent += transfer[cursor]
            arrival[cursor] = sent
            moved = end < infinity
            cursor += moved * num_ranks
    positions = cursor // num_ranks - 1
    stuck = [int(ops.rank_offsets[r] + j) for r, j in enumerate(positions.tolist()) if j < lengths[r]]
    return after[slot], arrival[slot], stuck


def _solve_loop(ops: OpTable) -> tuple[FloatArray, FloatArray, list[int]]:
    """Rank by rank, each as far as its inputs allow, until no rank can move."""
    n = ops.num_ops
    wait: list[int] = ops.wait.tolist()
    previous_send: list[int] = ops.previous_send.tolist()
    duration: list[float] = ops.duration_s.tolist()
    remote: list[bool] = ops.is_remote_send.tolist()
    transfer: list[float] = ops.transfer_s.tolist()
    inf = float("inf")
    end = [0.0] * n
    arrival = [inf] * n
    cursor: list[int] = ops.rank_offsets[:-1].tolist()
    stop: list[int] = ops.rank_offsets[1:].tolist()
    free = [0.0] * ops.num_ranks
    moved = True
    while moved:
        moved = False
        for r in range(ops.num_ranks):
            g, last, now = cursor[r], stop[r], free[r]
            while g < last:
                producer = wait[g]
                if producer >= 0:
                    ready = arrival[producer]
                    if ready == inf:
                        break
                    if ready > now:
                        now = ready
                now += duration[g]
                end[g] = now
                if remote[g]:
                    before = previous_send[g]
                    link_free = arrival[before] if before >= 0 else 0.0
                    arrival[g] = (now if now > link_free else link_free) + transfer[g]
                else:
                    arrival[g] = now
                g += 1
            if g != cursor[r]:
                moved = True
                cursor[r], free[r] = g, now
    stuck = [g for g, last in zip(cursor, stop, strict=True) if g < last]
    return np.asarray(end, dtype=np.float64), np.asarray(arrival, dtype=np.float64), stuck


def _raise_deadlock(program: Program, stuck: list[int], arrival: FloatArray) -> None:
    ops = program.ops
    schedule = program.schedule
    flat = [op for ops_of_rank in schedule.ranks for op in ops_of_rank]
    lines, marked = [], set()
    for g in stuck:
        rank_index, producer = int(ops.rank[g]), int(ops.wait[g])
        waiting = str(flat[producer]) if producer >= 0 and not np.isfinite(arrival[producer]) else "nothing"
        lines.append(f"rank {rank_index} at {flat[g]} waits for {waiting}")
        marked.add((rank_index, int(ops.position[g])))
    raise DeadlockError("deadlock: " + "; ".join(lines), grid(schedule.ranks, marked))
