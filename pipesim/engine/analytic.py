"""The analytic engine: the DES engine's timeline as a longest-path pass over the op graph, in numpy."""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

from pipesim.engine.assemble import build_trace
from pipesim.engine.lowering import OpTable, Program
from pipesim.engine.trace import Trace
from pipesim.errors import ConfigError, DeadlockError
from pipesim.schedule.ir import grid

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Method = Literal["auto", "rounds", "loop"]

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
        return "links shared between rank pairs contend for bandwidth; that needs the des engine"
    return None


def run_analytic(program: Program, *, method: Method = "auto") -> Trace:
    """The Trace the DES engine gives for ``program``, computed without simulating events.

    Each rank runs its ops in order: op j starts at max(end of op j-1 on the rank, arrival
    of its input), and a send starts at max(end of its op, arrival of the previous send on
    its link). These are the DES engine's rules with the same floating-point operations in
    the same order, so both engines give the same spans bit for bit.

    The pass visits the graph in rounds: in each round every rank whose next op has its input
    runs that op, all ranks at once as numpy vector operations. A round costs a few
    microseconds whatever the number of ranks, and a run takes about as many rounds as its
    longest rank has ops (plus the pipeline's fill), so p ranks give p ops per round.

    Args:
        method: ``"rounds"`` (numpy), ``"loop"`` (plain Python, rank by rank; faster for
            very few ranks) or ``"auto"``.

    Raises:
        DeadlockError: some rank cannot proceed; names each stuck op and what it waits for.
        ConfigError: the analytic engine does not apply (see ``analytic_unsupported``).
    """
    reason = analytic_unsupported(program)
    if reason is not None:
        raise ConfigError("engine", "analytic", reason)
    ops = program.ops
    if method == "auto":
        method = "rounds" if ops.num_ranks >= _ROUNDS_FROM_RANKS else "loop"
    end, arrival, stuck = (_solve_rounds if method == "rounds" else _solve_loop)(ops)
    if stuck:
        _raise_deadlock(program, stuck, arrival)
    meta = {**program.meta, "engine": "analytic", "jitter": 0.0}
    return build_trace(program, end, arrival, meta)


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
