"""The analytic engine: the DES engine's timeline as a longest-path pass over the op graph."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from pipesim import jit
from pipesim.engine.assemble import build_trace, span_block, trace_from_times
from pipesim.engine.kernel_policy import kernels_pay_off
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
        method: ``"kernel"`` (one sequential pass, ``solve_kernel``, and ``memory_kernel``
            for the memory events: compiled when numba is installed, see ``pipesim.jit``),
            ``"rounds"`` (numpy, all ranks a step at a time), ``"loop"`` (plain Python, rank
            by rank; faster than rounds for very few ranks), the last two with numpy memory
            events; or ``"auto"``: the kernels where they pay off
            (``kernel_policy.kernels_pay_off``), else rounds or loop.

    Raises:
        DeadlockError: some rank cannot proceed; names each stuck op and what it waits for.
        ConfigError: the analytic engine does not apply (see ``analytic_unsupported``).
    """
    reason = analytic_unsupported(program)
    if reason is not None:
        raise ConfigError("engine", "analytic", reason)
    ops = program.ops
    if method == "auto":
        fallback: Method = "rounds" if ops.num_ranks >= _ROUNDS_FROM_RANKS else "loop"
        method = "kernel" if kernels_pay_off(ops.num_ops) else fallback
    meta = program.info.ran("analytic", jitter=0.0)
    if method == "kernel":
        spans, arrival, remote, stuck = solve_in_span_order(ops)
        if stuck:
            _raise_deadlock(program, stuck, arrival)
        return trace_from_times(program, spans, meta, remote=remote, memory_method="kernel")
    end, arrival, stuck = (_solve_rounds if method == "rounds" else _solve_loop)(ops)
    if stuck:
        _raise_deadlock(program, stuck, arrival)
    return build_trace(program, end, arrival, meta, memory_method="numpy")


def solve_in_span_order(ops: OpTable, *, compiled: bool = True) -> tuple[dict[str, npt.NDArray[Any]], FloatArray,
                                                                        IntArray, list[int]]:
    """Run ``solve_kernel`` on ``ops``.

    Args:
        compiled: False runs the kernel's plain-Python form even where numba compiled it
            (tests hold the two equal).

    Returns:
        span columns (``assemble.span_block``) whose ``start_s`` and ``end_s`` hold every
        span's times in the Trace's span order (one compute span per op, then one send span
        per op that sends to another rank), the arrival of every op's output (+inf where the
        op never ran), the ops that send to another rank (flat indices, rising) and the ops
        stuck at the front of their ranks.
    """
    kernel = solve_kernel if compiled else getattr(solve_kernel, "py_func", solve_kernel)
    num_sends = int(np.count_nonzero((ops.send_rank >= 0) & (ops.send_rank != ops.rank)))
    spans = span_block(ops.num_ops + num_sends)
    arrival, remote, cursor = kernel(ops.rank_offsets, ops.wait, ops.send_rank, ops.duration_s, ops.transfer_s,
                                     spans["start_s"], spans["end_s"])
    stuck = [g for g, last in zip(cursor.tolist(), ops.rank_offsets[1:].tolist(), strict=True) if g < last]
    return spans, arrival, remote, stuck


@jit.jit
def solve_kernel(rank_offsets: IntArray, wait: IntArray, send_rank: IntArray, duration_s: FloatArray,
                 transfer_s: FloatArray, start_s: FloatArray, end_s: FloatArray) -> tuple[FloatArray, IntArray, IntArray]:
    """The longest-path pass, one op at a time in an order the dependencies allow.

    A rank runs its ops in order until the next one's input has not arrived, and is resumed
    when that input's producer ends (the input comes to the producer's ``send_rank``; a
    sweep over the ranks at the end catches any other case). A send waits for the previous
    send of its rank to the same peer (its link, first in first out).

    Writes ``start_s`` and ``end_s`` per span: op ``g`` at row ``g``, the send of the k-th op
    that sends to another rank at row ``n + k`` (both arrays have a row per span).

    Returns:
        ``arrival_s`` per op (+inf where it never ran), the indices of the ops that send to
        another rank, and each rank's next op index (its end offset when it finished:
        otherwise the rank is stuck there).
    """
    num_ranks, n = rank_offsets.shape[0] - 1, wait.shape[0]
    # In flat order: each send's previous send on its link, and the first send row of each rank.
    previous_send = np.full(n, -1, dtype=np.int64)
    next_row = np.empty(num_ranks, dtype=np.int64)
    last_to = np.full(num_ranks, -1, dtype=np.int64)  # per peer, the rank's last send to it so far
    num_sends = 0
    for r in range(num_ranks):
        next_row[r] = n + num_sends
        for g in range(rank_offsets[r], rank_offsets[r + 1]):
            peer = send_rank[g]
            if peer >= 0 and peer != r:
                num_sends += 1
                previous_send[g] = last_to[peer]
                last_to[peer] = g
        for g in range(rank_offsets[r], rank_offsets[r + 1]):
            if send_rank[g] >= 0:
                last_to[send_rank[g]] = -1
    remote = np.empty(num_sends, dtype=np.int64)
    arrival_s = np.full(n, np.inf)
    cursor = rank_offsets[:-1].copy()
    free = np.zeros(num_ranks)
    waiting_for = np.full(num_ranks, -1, dtype=np.int64)  # the producer a blocked rank waits for
    stack = np.empty(num_ranks, dtype=np.int64)
    queued = np.zeros(num_ranks, dtype=np.bool_)
    top = 0
    for r in range(num_ranks - 1, -1, -1):
        stack[top], queued[r] = r, True
        top += 1
    while top > 0:
        while top > 0:
            top -= 1
            r = stack[top]
            queued[r] = False
            g, last, now, row = cursor[r], rank_offsets[r + 1], free[r], next_row[r]
            while g < last:
                producer = wait[g]
                if producer >= 0:
                    ready = arrival_s[producer]
                    if ready == np.inf:
                        waiting_for[r] = producer
                        break
                    if ready > now:
                        now = ready
                start_s[g] = now
                now = now + duration_s[g]
                end_s[g] = now
                peer = send_rank[g]
                if peer >= 0 and peer != r:
                    before = previous_send[g]
                    link_free = arrival_s[before] if before >= 0 else 0.0
                    sent = now if now > link_free else link_free
                    start_s[row] = sent
                    sent = sent + transfer_s[g]
                    end_s[row] = sent
                    arrival_s[g] = sent
                    remote[row - n] = g
                    row += 1
                    if waiting_for[peer] == g and not queued[peer]:
                        waiting_for[peer] = -1
                        stack[top], queued[peer] = peer, True
                        top += 1
                else:
                    arrival_s[g] = now
                g += 1
            cursor[r], free[r], next_row[r] = g, now, row
        for r in range(num_ranks):  # inputs that came some other way (none from lowered schedules)
            if cursor[r] < rank_offsets[r + 1] and waiting_for[r] >= 0 and arrival_s[waiting_for[r]] != np.inf:
                waiting_for[r] = -1
                stack[top], queued[r] = r, True
                top += 1
    return arrival_s, remote, cursor


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
