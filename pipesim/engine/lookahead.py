"""The DES engine's lookahead mode: a rank runs its ops ahead of the SimPy clock while their inputs are known."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import simpy
from simpy.events import NORMAL

from pipesim.engine.lowering import Program
from pipesim.jit import ENABLED as JIT_ENABLED
from pipesim.jit import compiled as compiled_kernel
from pipesim.jit import jit

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Handler = Callable[[simpy.Event | None], None]

# The compiled kernel's state is two flat arrays; the first slots of the integer one say where
# each column starts: integer columns (per op, per op, per op + 1, per rank, per rank), then
# float columns (per op x 3, per op + 1, per link, per rank x 2).
_HEADER = 12


class Resume(simpy.Timeout):
    """A timeout that resumes a rank: ``Timeout`` with its one callback given up front, and its
    fixed fields (it always succeeds, with value None) on the class."""

    _ok = True
    _value = None

    def __init__(self, env: simpy.Environment, delay: float, callback: Handler) -> None:
        # Timeout.__init__, less what the class holds (delay >= 0 by construction).
        self.env = env
        self.callbacks = [callback]
        self._delay = delay
        env.schedule(self, NORMAL, delay)


class LookaheadRun:
    """The state of a lookahead run (see ``des.run_des``) and one SimPy handler per rank.

    A rank's handler runs when a SimPy event resumes it (or at time 0): it computes the rank's
    ops in order, start = max(rank free, input arrival), end = start + duration, and the send's
    arrival by Lindley's recursion on the op's dedicated link, for as long as each op's input
    is known; at an op whose input is not known it records itself as that input's waiter and
    returns. Whenever it computes an output whose waiter is blocked, it schedules a ``Resume``
    event for that rank at the time the blocked op can start (max(that rank free, arrival)).
    After its last op, a plain timeout at that op's end brings the clock to it. Delays are
    taken from the computed time of the event being handled (each rank's ``clock``), as the
    strict mode takes them from computed ends, so none goes below 0 by rounding.

    With numba (``pipesim.jit``) the per-op arithmetic runs in a compiled kernel on one flat
    buffer (``_advance``), called about once per event; without it the same arithmetic runs in
    Python over lists. Both do the same floating-point operations in the same order as the
    strict mode and the analytic engine, so all give the same trace bit for bit. An arrival
    not known yet is NaN (None in the lists); ops that wait for nothing read an extra slot
    that holds 0.

    Why (profiled on 1F1B p=32 m=256, 16,416 ops): the strict mode takes one SimPy event per
    op, and one event with a callback (a Timeout, its heap push and pop, ``step``) already
    costs about 0.85x a bare-SimPy op (a timeout resuming a process), so one event per op
    plus any work per op cannot reach the bare loop's ops/s. Lookahead takes 0.49 events per
    op on 1F1B and 2BW (a rank runs about two ops, a B and an F, between waits on its
    neighbours; no order of evaluation does better on those dependencies), and the kernel
    leaves per event one call and one ``Resume``. What is left per op is about half a SimPy
    event, the kernel call, and assembling the Trace (``assemble.build_trace``, about a
    quarter of the time).

    Args:
        env: the environment; program: a program without shared NICs; durations: per op.
        compiled: use the kernel (default: when numba is available).
    """

    def __init__(self, env: simpy.Environment, program: Program, durations: FloatArray, *,
                 compiled: bool | None = None) -> None:
        ops = program.ops
        n, num_ranks = ops.num_ops, ops.num_ranks
        link = ops.link
        num_links = int(link.max()) + 1 if n else 0
        self.env = env
        self.num_ops, self.num_ranks = n, num_ranks
        self.compiled = JIT_ENABLED if compiled is None else compiled
        source = np.where(ops.wait < 0, n, ops.wait)
        sizes = [n, n, n + 1, num_ranks, num_ranks, n, n, n, n + 1, num_links, num_ranks, num_ranks]
        # Per op a link's transfer is read only where the op sends over it; end, link and rank
        # times start at 0; an arrival is NaN until known, but the extra slot holds 0.
        columns: dict[int, npt.NDArray[np.generic]] = {
            0: source, 1: link, 3: ops.rank_offsets[:-1], 4: ops.rank_offsets[1:],
            5: np.asarray(durations, np.float64), 6: ops.transfer_s}
        self.handlers: list[Handler] = []
        if self.compiled:
            # One buffer (one argument to pass): the integer columns, then the float ones through a
            # float view (all-zero bits are 0.0), each written once.
            float_base = _HEADER + sum(sizes[:5])
            offsets = [int(x) for x in np.cumsum([_HEADER, *sizes[:4]])] + \
                [float_base + int(x) for x in np.cumsum([0, *sizes[5:11]])]
            self.ints: IntArray = np.zeros(float_base + sum(sizes[5:]), np.int64)
            self.floats: FloatArray = self.ints.view(np.float64)
            self.ints[:_HEADER] = offsets
            for k, column in columns.items():
                (self.ints if k < 5 else self.floats)[offsets[k]: offsets[k] + sizes[k]] = column
            self.ints[offsets[2]: offsets[2] + n + 1] = -1
            self.floats[offsets[8]: offsets[8] + n] = np.nan
            self._views = {k: (self.ints if k < 5 else self.floats)[offsets[k]: offsets[k] + sizes[k]]
                           for k in (3, 4, 7, 8)}
            self.handlers.extend(_compiled_handler(self, rank_index) for rank_index in range(num_ranks))
        else:
            self.lists: list[list[Any]] = [columns[k].tolist() if k in columns else [0.0] * size
                                           for k, size in enumerate(sizes)]
            self.lists[2] = [-1] * (n + 1)
            self.lists[8] = [None] * n + [0.0]  # arrivals: None while not known (cheaper to test than NaN)
            self.handlers.extend(_python_handler(self, rank_index) for rank_index in range(num_ranks))

    def begin(self) -> None:
        """Start every rank at time 0."""
        for handler in self.handlers:
            handler(None)

    def _column(self, index: int) -> list[float] | list[int]:
        values: list[float] | list[int] = (self._views[index].tolist() if self.compiled
                                          else list(self.lists[index]))
        return values

    def next_ops(self) -> list[int]:
        """Per rank, its next op not computed yet (flat index; its stop when it has none left)."""
        return [int(g) for g in self._column(3)]

    def is_finished(self) -> bool:
        """True when every rank has computed all its ops."""
        return self._column(3) == self._column(4)

    def state(self) -> tuple[list[int], list[float], list[float | None]]:
        """Per rank its next op not computed yet; per op its end and arrival (None: not known)."""
        arrival = self._column(8)[: self.num_ops]
        return self.next_ops(), [float(x) for x in self._column(7)], [None if x is None or x != x else x for x in arrival]

    def end_s(self) -> FloatArray:
        """Per op its end (OpTable order)."""
        if self.compiled:
            return self.floats[int(self.ints[7]):][: self.num_ops]
        return np.fromiter(self.lists[7], np.float64, self.num_ops)

    def arrival_s(self) -> FloatArray:
        """Per op the arrival of its output (NaN: not known)."""
        if self.compiled:
            return self.floats[int(self.ints[8]):][: self.num_ops]
        return np.fromiter(self.lists[8], np.float64, self.num_ops)


def _compiled_handler(run: LookaheadRun, rank_index: int) -> Handler:
    """The handler with numba: ``_advance`` does the ops, this schedules the events it asks for."""
    env, handlers, ints = run.env, run.handlers, run.ints
    advance = compiled_kernel(_advance)

    def resume(_: simpy.Event | None) -> None:
        """The rank resumes: run its ops until one waits for an input not known yet."""
        code = 0
        while code == 0:
            woken, delay, woken2, delay2, code, last_delay = advance(rank_index, ints)
            if woken >= 0:
                Resume(env, delay, handlers[woken])
                if woken2 >= 0:
                    Resume(env, delay2, handlers[woken2])
        if code == -2 and last_delay > 0:  # the rank's last op ends: the clock reaches it
            simpy.Timeout(env, last_delay)

    return resume


@jit
def _advance(rank: int, ints: IntArray) -> tuple[int, float, int, float, int, float]:
    """Run ``rank``'s ops while their inputs are known, until it blocks, ends, or has computed the
    outputs two blocked ranks wait for.

    Returns:
        ``(woken, delay, woken2, delay2, code, last_delay)``: up to two blocked ranks to resume
        (-1: none) and in how long their blocked ops can start; ``code`` -1 when the rank
        blocked (it is now its input's waiter), -2 when it has no op left (``last_delay``: how
        long until its last op ends), 0 when it stopped after two wakes (call again).
    """
    floats = ints.view(np.float64)
    source, link, waiter, next_op, stop = ints[0], ints[1], ints[2], ints[3], ints[4]
    duration, transfer, end, arrival, link_free, rank_free, clock = (
        ints[5], ints[6], ints[7], ints[8], ints[9], ints[10], ints[11])
    now = floats[clock + rank]
    woken_first, delay_first = -1, 0.0
    g = ints[next_op + rank]
    last = ints[stop + rank]
    t = floats[rank_free + rank]
    while g < last:
        producer = ints[source + g]
        ready = floats[arrival + producer]
        if ready != ready:
            ints[waiter + producer] = rank
            ints[next_op + rank] = g
            floats[rank_free + rank] = t
            return woken_first, delay_first, -1, 0.0, -1, 0.0
        if ready > t:
            t = ready
        t = t + floats[duration + g]
        floats[end + g] = t
        channel = ints[link + g]
        if channel >= 0:
            done = floats[link_free + channel]
            if t > done:
                done = t
            done = done + floats[transfer + g]
            floats[link_free + channel] = done
        else:
            done = t
        floats[arrival + g] = done
        woken = ints[waiter + g]
        g += 1
        if woken >= 0:
            at = floats[rank_free + woken]
            if done > at:
                at = done
            floats[clock + woken] = at
            if woken_first < 0:
                woken_first, delay_first = woken, at - now
            else:
                ints[next_op + rank] = g
                floats[rank_free + rank] = t
                return woken_first, delay_first, woken, at - now, 0, 0.0
    ints[next_op + rank] = g
    floats[rank_free + rank] = t
    return woken_first, delay_first, -1, 0.0, -2, t - now


def _python_handler(run: LookaheadRun, rank_index: int) -> Handler:
    """The handler without numba: ``_advance``'s arithmetic, inline, over the run's lists."""
    env, handlers = run.env, run.handlers
    source, link, waiter, next_op, stop, duration, transfer, end, arrival, link_free, rank_free, clock = run.lists
    last = stop[rank_index]

    def resume(_: simpy.Event | None) -> None:
        """The rank resumes: run its ops until one waits for an input not known yet."""
        now = clock[rank_index]
        t = rank_free[rank_index]
        for g in range(next_op[rank_index], last):
            producer = source[g]
            ready = arrival[producer]
            if ready is None:
                waiter[producer] = rank_index
                next_op[rank_index] = g
                rank_free[rank_index] = t
                return
            if ready > t:
                t = ready
            t = t + duration[g]
            end[g] = t
            channel = link[g]
            if channel >= 0:
                done = link_free[channel]
                if t > done:
                    done = t
                done = done + transfer[g]
                link_free[channel] = done
                arrival[g] = done
            else:
                arrival[g] = done = t
            woken = waiter[g]
            if woken >= 0:
                at = rank_free[woken]
                if done > at:
                    at = done
                clock[woken] = at
                Resume(env, at - now, handlers[woken])
        next_op[rank_index] = last
        rank_free[rank_index] = t
        if t > now:  # the rank's last op ends: the clock reaches it
            simpy.Timeout(env, t - now)

    return resume
