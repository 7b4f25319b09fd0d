"""The timing kernel: advance one rank through its ops until it must wait. Both engines run it.

The recurrence, written once (``advance``):

    start(op)  = max(end of the rank's previous op, arrival of the op's input(s))
    end(op)    = start(op) + duration(op)
    send(op)   = max(end(op), send(previous op on the same link) + hold(previous))   # first in, first out
    arrival    = send(op) + transfer(op)            (end(op) when nothing crosses to another rank)

A send holds its link for its bytes / bandwidth (``hold``) and arrives latency later
(``transfer`` = latency + hold): latency pipelines, as on a real wire. Both are read from small
tables by the op's path (``PATH``: the stage it leaves and its direction; ``OpTable.send_link``),
so a run copies no per-op column for them. Where every sender computes for at least the longest
hold, no send finds its link busy (``links_may_queue``) and the run skips the queue. An op
waits for one input (``WAIT``) and, where it opens an overlapped F&B chunk (``chunks.py``), for
its partner's too (the two inputs in ``PAIRS``).

The analytic engine runs ``advance`` over a worklist of ranks (``solve``); the DES engine
calls it each time SimPy resumes a rank, and schedules the resumptions it asks for. Sends
over shared NICs have no arrival known in advance: ``advance`` stops after such an op and
the DES engine moves its bytes through ``network.SharedLinks``.

State lives in three flat buffers: the order's integers (read only, shared by every run of
the schedule), the run's integers (each rank's next op and send row, the rank waiting for
each op's output, and whether links may queue) and its floats. Columns are slices at offsets
kept in the first ``HEADER`` integers of the order's buffer. With numba the buffers are numpy
arrays; the plain-Python kernels run on lists of the same layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from pipesim import jit
from pipesim.engine.lowering import OpTable, Program
from pipesim.errors import DeadlockError
from pipesim.schedule.ir import grid

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# The order's columns (INITIAL: each rank's first op and first send row), the run's integer columns,
# then its float columns; the order's header holds each one's offset in its buffer.
WAIT, PAIRS, LINK, PATH, STOP, INITIAL = range(6)
NEXT, SEND_NEXT, WAITER, QUEUES = range(6, 10)
DURATION, TRANSFER, HOLD, ARRIVAL, LINK_FREE, FREE, CLOCK, START, END = range(10, 19)
RUN_COLUMNS = (NEXT, SEND_NEXT, WAITER, QUEUES)
NUM_RANKS = 19
HEADER = 20

# What ``advance`` returns as its status.
AGAIN = 0      # it woke two ranks and stopped: call it again
BLOCKED = -1   # the rank's next op waits for an input not known yet (the rank is its waiter now)
FINISHED = -2  # the rank has run all its ops
SHARED = 1     # the op it returns ended with a send over shared NICs (arrival not known)


Offsets = tuple[int, int, int, int, int, int, int, int, int, int, int, int, int, int, int, int, int, int]


@jit.jit(inline=True)
def offsets_of(order: Any) -> Offsets:
    """The columns' offsets from the header, read once per kernel call (a loop that calls
    ``advance_at`` keeps them in registers)."""
    return (order[WAIT], order[PAIRS], order[LINK], order[PATH], order[STOP], order[NEXT], order[SEND_NEXT],
            order[WAITER], order[QUEUES], order[DURATION], order[TRANSFER], order[HOLD], order[ARRIVAL],
            order[LINK_FREE], order[FREE], order[CLOCK], order[START], order[END])


@jit.jit
def advance(rank: int, order: Any, ints: Any, floats: Any) -> tuple[int, float, int, float, int, int]:
    """``advance_at`` with the offsets read from the header, writing woken ranks' clocks (the
    DES engine's call)."""
    return advance_at(rank, order, ints, floats, offsets_of(order), True)


@jit.jit(inline=True)
def advance_at(rank: int, order: Any, ints: Any, floats: Any,
               at: Offsets, clocked: bool) -> tuple[int, float, int, float, int, int]:
    """Run ``rank``'s ops in order while each op's input is known.

    Writes every op's compute span (row ``g``), its send span (a rank's sends take the rows
    from ``SEND_NEXT[rank]`` on, one after another: ``OpTable.send_row``) and its output's
    arrival. Where an op computes the input a blocked rank waits for, that rank is woken; with
    ``clocked`` (the DES) its ``CLOCK`` becomes the time its op can start and the delays are
    returned, else (the analytic solve, which numba compiles without that work) they are 0.

    Returns:
        ``(woken, delay, woken2, delay2, status, g)``: up to two woken ranks (-1: none) and how
        long after this rank's ``CLOCK`` their ops start; the status (AGAIN, BLOCKED,
        FINISHED or SHARED) and the rank's next op (for SHARED: the op whose send is shared).
    """
    wait, pairs, link, path, stop, next_op, send_next, waiter, queues, duration, transfer, hold, arrival, link_free, \
        free, clock, start, end = at
    now = floats[clock + rank] if clocked else 0.0
    queued = ints[queues] != 0
    woken_first, delay_first = -1, 0.0
    g = ints[next_op + rank]
    last = order[stop + rank]
    t = floats[free + rank]
    row = ints[send_next + rank]
    while g < last:
        producer = order[wait + g]
        if producer >= -1:
            ready = floats[arrival + producer]
        else:  # an overlapped chunk: the later of its two inputs (NaN while either is not known)
            chunk = pairs - 2 * producer - 4  # WAIT holds -2 - j for the j-th chunk
            producer, second = order[chunk], order[chunk + 1]
            ready = floats[arrival + producer]
            other = floats[arrival + second]
            if ready == ready and (other > ready or other != other):
                producer, ready = second, other
        if ready != ready:  # NaN: the input's arrival is not known yet
            ints[waiter + producer] = rank
            ints[next_op + rank] = g
            ints[send_next + rank] = row
            floats[free + rank] = t
            return woken_first, delay_first, -1, 0.0, BLOCKED, g
        if ready > t:
            t = ready
        floats[start + g] = t
        t = t + floats[duration + g]
        floats[end + g] = t
        channel = order[link + g]
        if channel >= 0:
            done = t
            k = order[path + g]
            if queued:
                busy = floats[link_free + channel]
                if busy > done:
                    done = busy
                floats[link_free + channel] = done + floats[hold + k]
            floats[start + row] = done
            done = done + floats[transfer + k]
            floats[end + row] = done
            row += 1
        elif channel == -1:
            done = t
        else:
            ints[next_op + rank] = g + 1
            ints[send_next + rank] = row + 1
            floats[free + rank] = t
            return woken_first, delay_first, -1, 0.0, SHARED, g
        floats[arrival + g] = done
        woken = ints[waiter + g]
        g += 1
        if woken >= 0:
            resume = 0.0
            if clocked:
                resume = floats[free + woken]
                if done > resume:
                    resume = done
                floats[clock + woken] = resume
            if woken_first < 0:
                woken_first, delay_first = woken, resume - now
            else:
                ints[next_op + rank] = g
                ints[send_next + rank] = row
                floats[free + rank] = t
                return woken_first, delay_first, woken, resume - now, AGAIN, g
    ints[next_op + rank] = g
    ints[send_next + rank] = row
    floats[free + rank] = t
    return woken_first, delay_first, -1, 0.0, FINISHED, g


@jit.jit
def solve(order: Any, ints: Any, floats: Any) -> int:
    """Advance every rank until none can move (the analytic engine). Returns how many ranks
    have ops left (0 unless the run deadlocks)."""
    num_ranks = order[NUM_RANKS]
    stack = np.empty(num_ranks, np.int64)  # each rank is on it at most once: it is pushed when woken
    top = 0
    for r in range(num_ranks - 1, -1, -1):
        stack[top] = r
        top += 1
    at = offsets_of(order)
    while top > 0:
        top -= 1
        r = stack[top]
        status = AGAIN
        while status == AGAIN:
            woken, _, woken2, _, status, _ = advance_at(r, order, ints, floats, at, False)
            if woken >= 0:
                stack[top] = woken
                top += 1
            if woken2 >= 0:
                stack[top] = woken2
                top += 1
    left = 0
    for r in range(num_ranks):
        if ints[order[NEXT] + r] < order[order[STOP] + r]:
            left += 1
    return left


def links_may_queue(ops: OpTable, durations: FloatArray) -> bool:
    """Whether a send may find its link still busy with the one before it. Not where every op
    that sends to another rank computes for at least the longest hold: a rank's sends on one
    link are then that far apart at least, so each leaves at its op's end, the time the queue
    would give too (``max`` of it and a free time never above it)."""
    if not ops.hold_by_link_s.size:
        return False
    shortest = ops.shortest_send_s if durations is ops.duration_s else \
        float(durations[ops.is_remote_send].min(initial=np.inf))
    return not shortest >= float(ops.hold_by_link_s.max())


def _structure(program: Program, link: IntArray | None = None) -> IntArray:
    """The order's buffer of ``program`` (header, columns, each rank's first op and send row; read only).

    It depends on the order alone (each op's input, rank, receiver and chunk), so the programs
    lowered from one schedule share it (``Program.derived``), checked against the table's
    columns; ``link`` (shared NICs) makes one for this run only."""
    ops = program.ops
    sources = (ops.wait, ops.rank_offsets, ops.send_rank, ops.is_remote_send, ops.send_link)
    known = program.derived.get("kernel_structure") if link is None else None
    if known is not None and all(a is b for a, b in zip(known[0], sources, strict=True)) \
            and (known[1] is ops.chunk_wait or np.array_equal(known[1], ops.chunk_wait)):
        structure: IntArray = known[2]
        return structure
    n, num_ranks = ops.num_ops, ops.num_ranks
    num_links = int(ops.link.max()) + 1 if n else 0
    remote = np.concatenate(([0], np.cumsum(ops.is_remote_send, dtype=np.int64)))
    num_spans = n + int(remote[-1])
    # An op that opens an overlapped chunk waits for two inputs: its WAIT holds -2 - j, and
    # PAIRS[2j], PAIRS[2j + 1] are the two producers (one column read per op for the common case).
    chunked = np.flatnonzero(ops.chunk_wait >= 0)
    wait = ops.wait
    if chunked.size:
        wait = wait.copy()
        wait[chunked] = -2 - np.arange(chunked.size)
    # The run's integers start as: each rank at its first op and first send row (and nobody
    # waiting: ``rerun`` fills WAITER).
    initial = np.concatenate((ops.rank_offsets[:-1], n + remote[ops.rank_offsets[:-1]]))
    columns = (wait, np.column_stack((ops.wait[chunked], ops.chunk_wait[chunked])).ravel(),
               ops.link if link is None else link, ops.send_link, ops.rank_offsets[1:], initial)
    # Float columns (TRANSFER and HOLD: one entry per path); then each span's start and end, rows
    # the Trace takes as its time columns.
    paths = ops.transfer_by_link_s.shape[0]
    float_sizes = (n, paths, paths + 1, n, num_links, num_ranks, num_ranks, num_spans)  # HOLD: one slot more
    order = np.empty(HEADER + sum(len(values) for values in columns), np.int64)
    order[:NUM_RANKS] = [*np.cumsum((HEADER, *(len(values) for values in columns[:-1]))),
                         0, num_ranks, 2 * num_ranks, 2 * num_ranks + n, *np.cumsum((0, *float_sizes))]
    order[NUM_RANKS] = num_ranks
    for index, values in enumerate(columns):
        order[order[index]: order[index] + len(values)] = values
    order.flags.writeable = False
    if link is None:
        program.derived["kernel_structure"] = (sources, ops.chunk_wait, order)
    return order


@dataclass(eq=False)
class KernelState:
    """The buffers ``advance`` works on, for one run of a program.

    Args (of ``KernelState.build``):
        program: the lowered program; durations: per op (OpTable order), seconds.
        link: per op its link (-1: no send to another rank; <= -2: a shared link, see
            ``network.SharedLinks``); default ``program.ops.link``.
        compiled: numpy buffers for the compiled kernels; False: lists for the plain ones.
    """

    order: Any  # the order's buffer (read only; ``_structure``)
    ints: Any  # the run's integers (RUN_COLUMNS)
    floats: Any
    offsets: list[int]
    num_ops: int
    num_spans: int
    compiled: bool
    ops: OpTable  # the program's (its durations and holds decide whether links may queue)

    @classmethod
    def build(cls, program: Program, durations: FloatArray, *, link: IntArray | None = None,
              compiled: bool) -> KernelState:
        ops = program.ops
        n = ops.num_ops
        order = _structure(program, link)
        offsets = order[:HEADER].tolist()
        num_spans = offsets[END] - offsets[START]  # START's rows are every span's
        # The state's float columns, then every span's start and end (the Trace's own time
        # columns: the kernel writes them in place). HOLD's extra slot, just before ARRIVAL,
        # holds 0: the arrival an op with WAIT -1 reads.
        floats = np.empty(offsets[END] + num_spans)
        paths = ops.transfer_by_link_s.shape[0]
        floats[offsets[TRANSFER]: offsets[TRANSFER] + paths] = ops.transfer_by_link_s
        floats[offsets[HOLD]: offsets[HOLD] + paths] = ops.hold_by_link_s
        floats[offsets[ARRIVAL] - 1] = 0.0  # the arrival read by ops that wait for nothing
        ints = np.empty(2 * ops.num_ranks + n + 1, np.int64)  # rerun fills it
        state = cls(order, ints, floats, offsets, n, num_spans, True, ops)
        state.rerun(durations)
        if not compiled:
            state.order, state.ints, state.floats, state.compiled = order.tolist(), ints.tolist(), \
                floats[:offsets[START]].tolist() + [0.0] * (2 * num_spans), False
        return state

    def rerun(self, durations: FloatArray) -> None:
        """Ready a compiled state's buffers for another run of its program with ``durations``:
        every rank at its first op, nobody waiting, arrivals unknown, links and ranks free at 0.
        (A plain state's lists are rebuilt instead: refilling them costs as much.)"""
        assert self.compiled, "a plain state is rebuilt (KernelState.build) for another run"
        at, n = self.offsets, self.num_ops
        self.ints[:at[WAITER]] = self.order[at[INITIAL]: at[INITIAL] + at[WAITER]]
        self.ints[at[WAITER]: at[QUEUES]] = -1
        self.ints[at[QUEUES]] = links_may_queue(self.ops, durations)
        self.floats[at[DURATION]: at[DURATION] + n] = durations
        self.floats[at[ARRIVAL]: at[ARRIVAL] + n] = np.nan  # not known yet
        self.floats[at[LINK_FREE]: at[START]] = 0.0

    def column(self, index: int, size: int) -> npt.NDArray[Any]:
        """A column as a numpy array: ``size`` values from its offset (a view of a compiled
        run's buffer: copy what outlives the state)."""
        at = self.offsets[index]
        source = self.floats if index >= DURATION else self.ints if index in RUN_COLUMNS else self.order
        if self.compiled:
            view: npt.NDArray[Any] = source[at: at + size]
            return view
        return np.asarray(source[at: at + size], dtype=np.int64 if index < DURATION else np.float64)

    def span_times(self) -> tuple[FloatArray, FloatArray]:
        """Start and end of every span (compute spans in op order, then sends)."""
        return self.column(START, self.num_spans), self.column(END, self.num_spans)

    def span_columns(self) -> dict[str, npt.NDArray[Any]]:
        """The Trace's time columns, ``start_s`` and ``end_s`` (a compiled run's are views of its
        buffer); ``assemble.trace_from_times`` adds the others."""
        start, end = self.span_times()
        return {"start_s": start, "end_s": end}

    def arrival_s(self) -> FloatArray:
        """Per op, the arrival of its output (NaN: not known)."""
        return self.column(ARRIVAL, self.num_ops)

    def next_ops(self) -> list[int]:
        """Per rank, its next op not computed yet (flat index; its stop when it has none left)."""
        return [int(g) for g in self.column(NEXT, self.offsets[NUM_RANKS])]

    def stuck(self, program: Program) -> list[int]:
        """The ops at which ranks stopped before their last op."""
        stops = program.ops.rank_offsets[1:].tolist()
        return [g for g, stop in zip(self.next_ops(), stops, strict=True) if g < stop]


def deadlock_error(program: Program, stuck: list[int], arrival_s: FloatArray) -> DeadlockError:
    """The error for a run whose ranks stopped at ``stuck``: each stuck op and what it waits for."""
    ops, schedule = program.ops, program.schedule
    flat = [op for ops_of_rank in schedule.ranks for op in ops_of_rank]
    lines, marked = [], set()
    for g in stuck:
        rank_index = int(ops.rank[g])
        missing = [str(flat[p]) for p in (int(ops.wait[g]), int(ops.chunk_wait[g]))
                   if p >= 0 and not np.isfinite(arrival_s[p])]
        waiting = " and ".join(missing) or "nothing"
        lines.append(f"rank {rank_index} at {flat[g]} waits for {waiting}")
        marked.add((rank_index, int(ops.position[g])))
    return DeadlockError("deadlock: " + "; ".join(lines), grid(schedule.ranks, marked))
