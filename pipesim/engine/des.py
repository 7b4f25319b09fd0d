"""The discrete-event engine: SimPy resumes ranks, the timing kernel computes their ops."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
import simpy
from simpy import Timeout

from pipesim import jit
from pipesim.engine.assemble import trace_from_times
from pipesim.engine.kernel import (
    AGAIN, ARRIVAL, CLOCK, END, FINISHED, FREE, NEXT, SHARED, START, WAITER, KernelState, advance,
    deadlock_error,
)
from pipesim.engine.lowering import Program
from pipesim.engine.network import SharedLinks
from pipesim.engine.noise import run_durations
from pipesim.engine.trace import Trace

Handler = Callable[[simpy.Event | None], None]


def run_des(
    program: Program,
    *,
    jitter: float = 0.0,
    seed: int = 0,
    durations: Sequence[Sequence[float]] | npt.NDArray[np.float64] | None = None,
    compiled: bool | None = None,
) -> Trace:
    """Simulate ``program`` event by event.

    Each rank runs its ops in order on its compute stream: an op starts once the rank is free
    and the output it waits for has arrived. Each directed link between two ranks serves
    sends first-in first-out, each holding it for bytes / bandwidth and arriving latency later
    (latency pipelines), so communication overlaps compute as with NCCL's separate streams.

    SimPy drives the waits between ranks with conservative lookahead: a rank resumed by an
    event runs the timing kernel (``kernel.advance``), which computes its ops ahead of the
    clock for as long as their inputs are known (on a dedicated link an arrival is fixed once
    computed); at an op whose input is not known it stops, and the rank that computes that
    input schedules the event that resumes it at the time the op can start. A last event per
    rank at its last op's end brings the clock to the end of the run. Spans are the values the
    kernel computes, so the trace equals ``run_analytic``'s bit for bit.

    A send whose path crosses shared NICs (``program.shared_paths``) has no arrival known in
    advance: it starts at its op's end, in SimPy time, and moves its bytes at the max-min fair
    share of those NICs among the flows crossing them at each moment (``network.Network``).

    Args:
        jitter: coefficient of variation of every op's duration (0: deterministic), drawn
            from ``numpy.random.default_rng(seed)`` up front (``noise.run_durations``).
        seed: seed of the jitter draws.
        durations: every op's compute time instead of the lowered one: per rank, per op in
            its order, or one flat array in OpTable order; ``jitter`` must then be 0.
        compiled: run numba's kernels (default: ``jit.use_compiled(num_ops)``).

    Returns:
        the Trace: compute and send spans (in ``assemble``'s span order), and memory events.

    Raises:
        DeadlockError: some rank cannot proceed; names each stuck op and what it waits for.
        ConfigError: a negative jitter, jitter with durations, or durations of the wrong length.
    """
    return DesRun(program, jitter=jitter, seed=seed, durations=durations, compiled=compiled).finish()


class DesRun:
    """A DES run that can be advanced one SimPy event at a time (``run_des`` is ``finish()``).

    Stepping is for tests that compare the engine with a model after every event, and for
    tools that watch a run unfold. Events are a rank resuming, a rank's last op ending, and
    with shared NICs a send starting and the steps of its transfer.

    Args: as for ``run_des``.
    """

    def __init__(
        self,
        program: Program,
        *,
        jitter: float = 0.0,
        seed: int = 0,
        durations: Sequence[Sequence[float]] | npt.NDArray[np.float64] | None = None,
        compiled: bool | None = None,
    ) -> None:
        chosen = run_durations(program, jitter=jitter, seed=seed, durations=durations)
        self.program = program
        self.compiled = jit.use_compiled(program.ops.num_ops) if compiled is None else compiled
        self.env = simpy.Environment()
        self._info = program.info.ran("des", jitter=jitter, seed=seed)
        self.shared = SharedLinks(self.env, program, self._arrived) if program.shared_paths else None
        link = self.shared.link if self.shared is not None else None
        self.state = KernelState.build(program, chosen, link=link, compiled=self.compiled)
        self._at = self.state.offsets
        self._step = jit.pick_for(advance, self.compiled, 0, self.state.order, self.state.ints, self.state.floats)
        self._send_row = program.ops.send_row.tolist() if self.shared is not None else []
        self.handlers: list[Handler] = []
        self.handlers.extend(self._handler(rank) for rank in range(program.ops.num_ranks))
        for handler in self.handlers:
            handler(None)
        self._trace: Trace | None = None

    def _handler(self, rank: int) -> Handler:
        env, handlers = self.env, self.handlers
        order, ints, floats = self.state.order, self.state.ints, self.state.floats
        step = self._step
        clock, free, end = self._at[CLOCK] + rank, self._at[FREE] + rank, self._at[END]
        send = self.shared.send if self.shared is not None else None

        def resume(_: simpy.Event | None) -> None:
            """The rank resumes: run its ops until one waits for an input not known yet."""
            while True:
                woken, delay, woken2, delay2, status, g = step(rank, order, ints, floats)
                if woken >= 0:  # simpy.Timeout itself: env.timeout adds a call per event
                    Timeout(env, delay).callbacks.append(handlers[woken])
                    if woken2 >= 0:
                        Timeout(env, delay2).callbacks.append(handlers[woken2])
                if status == AGAIN:
                    continue
                if status == SHARED:  # the op's send starts at its end, in SimPy time
                    assert send is not None
                    ended = float(floats[end + g])
                    env.timeout(ended - float(floats[clock])).callbacks.append(functools.partial(_send, send, g, ended))
                    continue
                if status == FINISHED and floats[free] > floats[clock]:  # the clock reaches its last op's end
                    env.timeout(float(floats[free]) - float(floats[clock]))
                return

        return resume

    def _arrived(self, g: int, started: float, now: float) -> None:
        """A send over shared NICs arrived: record it and resume the rank waiting for it."""
        floats, ints, at = self.state.floats, self.state.ints, self._at
        row = self._send_row[g]
        floats[at[START] + row], floats[at[END] + row] = started, now
        floats[at[ARRIVAL] + g] = now
        woken = int(ints[at[WAITER] + g])
        if woken >= 0:
            resume_at = max(float(floats[at[FREE] + woken]), now)
            floats[at[CLOCK] + woken] = resume_at
            self.env.timeout(resume_at - now).callbacks.append(self.handlers[woken])

    def next_event_s(self) -> float:
        """Time of the next pending event, seconds (``inf`` when none is left)."""
        return float(self.env.peek())

    def step(self) -> None:
        """Process the next event (raises ``simpy.core.EmptySchedule`` when none is left)."""
        self.env.step()

    def completed(self, until_s: float = np.inf) -> tuple[list[tuple[int, int, float, float]],
                                                          list[tuple[int, int, float, float, int]]]:
        """The spans of the ops computed so far that end by ``until_s``.

        Once every event up to a time T has been processed, every op that starts by T has been
        computed (ranks are resumed no later than their next op's start).

        Returns:
            compute spans as ``(rank, position, start_s, end_s)``, and the sends of those ops
            to other ranks whose arrival is known, as ``(rank, position, start_s, end_s, peer)``.
        """
        ops, state = self.program.ops, self.state
        start, end = state.span_times()
        arrival = state.arrival_s()
        send_row = ops.send_row
        offsets = ops.rank_offsets.tolist()
        compute: list[tuple[int, int, float, float]] = []
        sends: list[tuple[int, int, float, float, int]] = []
        for rank, next_op in enumerate(state.column(NEXT, ops.num_ranks).tolist()):
            for g in range(offsets[rank], next_op):
                if end[g] > until_s:
                    continue
                compute.append((rank, g - offsets[rank], float(start[g]), float(end[g])))
                row = int(send_row[g])
                if row >= 0 and arrival[g] == arrival[g]:
                    sends.append((rank, g - offsets[rank], float(start[row]), float(end[row]),
                                  int(ops.send_rank[g])))
        return compute, sends

    def finish(self) -> Trace:
        """Run the remaining events and return the Trace; calling it again returns the same Trace.

        Raises:
            DeadlockError: some rank cannot proceed; names each stuck op and what it waits for.
        """
        if self._trace is None:
            self.env.run()
            stuck = self.state.stuck(self.program)
            if stuck:
                raise deadlock_error(self.program, stuck, self.state.arrival_s())
            spans = self.state.span_columns()
            self._trace = trace_from_times(self.program, spans, self._info, compiled=self.compiled)
        return self._trace


def _send(send: Callable[[int, float], None], g: int, now: float, _: simpy.Event) -> None:
    """A timeout's callback: op ``g``'s send over shared NICs starts at its end, ``now``."""
    send(g, now)
