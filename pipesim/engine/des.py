"""The discrete-event engine: SimPy events drive every rank's compute stream, with or without lookahead."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
import simpy

from pipesim.engine.assemble import build_trace
from pipesim.engine.lookahead import LookaheadRun
from pipesim.engine.lowering import Program
from pipesim.engine.network import SharedLinks
from pipesim.engine.trace import Trace
from pipesim.errors import ConfigError, DeadlockError
from pipesim.schedule.ir import grid


def run_des(
    program: Program,
    *,
    jitter: float = 0.0,
    seed: int = 0,
    durations: Sequence[Sequence[float]] | npt.NDArray[np.float64] | None = None,
    lookahead: bool = True,
) -> Trace:
    """Simulate ``program`` event by event.

    Each rank runs its ops in order on its compute stream: an op starts once the rank is free
    and the output it waits for has arrived. Each directed link between two ranks serves
    sends first-in first-out, one at a time, taking latency + bytes / bandwidth each, so
    communication overlaps compute as with NCCL's separate streams. A link is dedicated to
    its rank pair and its transfer times are known, so when an op's end is known its send's
    start and arrival follow at once (Lindley's recursion: start = max(end, the link's
    previous arrival)).

    Two modes drive this with SimPy, with the same arithmetic in the same order, so their
    traces are equal bit for bit (and equal to ``run_analytic``'s):

    - strict (``lookahead=False``, the reference): one SimPy event per op, its end; when it
      fires the rank sends the op's output, wakes the rank waiting for it and starts its next
      op if that op's input has arrived.
    - lookahead (the default, what ``pipesim simulate --engine des`` and the benchmarks run):
      conservative lookahead as in conservative parallel DES. A rank woken by a SimPy event
      runs its ops one after another, ahead of the clock, for as long as each op's input is
      already known (its producer's end and arrival are fixed once computed: nothing later
      can change them on a dedicated link); at an op whose input is not known yet it blocks,
      and the rank that computes that input schedules a SimPy event at the time the blocked
      op can start, which resumes it. So the SimPy clock and its events still drive every
      wait between ranks, but a rank's run of ops between two waits takes one event instead
      of one per op (about 0.5 events per op on 1F1B and 2BW instead of 1); a last event per
      rank at its last op's end brings the clock to the end of the run.

    A link whose path crosses shared NICs (``program.shared_paths``) cannot know its arrival
    up front: it still serves its sends first-in first-out, but each takes its latency and
    then moves its bytes at the max-min fair share of those NICs among all flows crossing
    them at the moment (``network.Network``), and its arrival is the time SimPy reaches.
    Those programs always run strict, whatever ``lookahead`` says (their arrivals depend on
    the order of events); programs without shared paths never build that machinery.

    Span times are the values the event handlers compute (start = max(...), end = start +
    duration), the times at which SimPy fires the events; they are recorded as computed
    rather than read back from the clock, whose ``now + (end - now)`` can differ from ``end``
    in the last bit.

    Args:
        jitter: coefficient of variation of every op's duration (0: deterministic). Factors
            are drawn from ``numpy.random.default_rng(seed)`` up front, rank by rank, and
            clipped at 0.
        seed: seed of the jitter draws.
        durations: the compute time of every op to use instead of the lowered one (a
            stochastic sample, see ``pipesim.engine.noise``): per rank, per op in its order,
            or one flat array in OpTable order; ``jitter`` must then be 0.
        lookahead: run ranks ahead of the clock between waits (see above); False: strict.

    Returns:
        the Trace: compute and send spans (in the order of ``assemble.build_trace``), and
        memory events.

    Raises:
        DeadlockError: some rank cannot proceed; names each stuck op and what it waits for.
        ConfigError: a negative jitter, jitter with durations, or durations of the wrong length.
    """
    return DesRun(program, jitter=jitter, seed=seed, durations=durations, lookahead=lookahead).finish()


class DesRun:
    """A DES run that can be advanced one SimPy event at a time (strict: an op's end; with shared
    NICs also a step of a transfer; with lookahead: a rank resuming, or its last op's end).

    ``run_des`` is ``DesRun(...).finish()``; stepping is for tests that compare the engine
    with a model after every event, and for tools that watch a run unfold. Stepping defaults
    to the strict mode, in which an op is done exactly when the clock has passed its end.

    Args:
        program, jitter, seed, durations: as for ``run_des``.
        lookahead: as for ``run_des`` (ignored, strict, when the program has shared NICs).
        compiled: with lookahead, run the per-op arithmetic in the numba kernel (default: when
            numba is available; False: in Python; the traces are the same bit for bit).

    Raises:
        ConfigError: a negative jitter, jitter with durations, or durations of the wrong length.
    """

    def __init__(
        self,
        program: Program,
        *,
        jitter: float = 0.0,
        seed: int = 0,
        durations: Sequence[Sequence[float]] | npt.NDArray[np.float64] | None = None,
        lookahead: bool = False,
        compiled: bool | None = None,
    ) -> None:
        if jitter < 0:
            raise ConfigError("jitter", jitter, "must be >= 0")
        if durations is not None and jitter:
            raise ConfigError("jitter", jitter, "must be 0 when durations are given")
        self.program = program
        self.env = simpy.Environment()
        self._meta = program.info.ran("des", jitter=jitter, seed=seed)
        chosen = (_durations(program, jitter, seed) if durations is None
                  else np.asarray(_given_durations(program, durations), np.float64))
        self.lookahead = lookahead and not program.shared_paths
        """True when this run uses lookahead (asked for, and the program has no shared NICs)."""
        self._run: _Run | None = None
        self._ahead: LookaheadRun | None = None
        if self.lookahead:
            self._ahead = LookaheadRun(self.env, program, chosen, compiled=compiled)
            self._ahead.begin()
        else:
            self._run = _Run(self.env, program, chosen.tolist())
            self._run.begin()
        self._trace: Trace | None = None

    def next_event_s(self) -> float:
        """Time of the next pending event, seconds (``inf`` when none is left)."""
        return float(self.env.peek())

    def step(self) -> None:
        """Process the next event (raises ``simpy.core.EmptySchedule`` when none is left)."""
        self.env.step()

    def _state(self) -> tuple[list[int], list[float], list[float | None]]:
        if self._ahead is not None:
            return self._ahead.state()
        assert self._run is not None
        return self._run.next, self._run.end, self._run.arrival

    def completed(self) -> tuple[list[tuple[int, int, float, float]], list[tuple[int, int, float, float, int]]]:
        """The spans of every op whose end has been processed so far (with lookahead: whose end
        has been computed, which may lie ahead of the clock).

        Returns:
            compute spans as ``(rank, position, start_s, end_s)``, and the sends of those ops
            to other ranks as ``(rank, position, start_s, end_s, peer)`` (a send over a
            dedicated link may end later than the current time: its times follow from the op's
            end; one over shared NICs is listed once it has arrived).
        """
        ops = self.program.ops
        next_op, end, arrival = self._state()
        offsets = ops.rank_offsets.tolist()
        wait: list[int] = ops.wait.tolist()
        previous_send: list[int] = ops.previous_send.tolist()
        compute, sends = [], []
        for rank_index in range(ops.num_ranks):
            for g in range(offsets[rank_index], next_op[rank_index]):
                position = g - offsets[rank_index]
                if self._run is not None:
                    start, send_start = self._run.start[g], self._run.send_start[g]
                else:  # starts are not recorded: they follow as in assemble.op_starts
                    start = end[g - 1] if position > 0 else 0.0
                    ready = arrival[wait[g]] if wait[g] >= 0 else None
                    start = ready if ready is not None and ready > start else start
                    before = arrival[previous_send[g]] if previous_send[g] >= 0 else None
                    send_start = before if before is not None and before > end[g] else end[g]
                compute.append((rank_index, position, start, end[g]))
                arrived = arrival[g]
                if ops.is_remote_send[g] and arrived is not None:
                    sends.append((rank_index, position, send_start, arrived, int(ops.send_rank[g])))
        return compute, sends

    def finish(self) -> Trace:
        """Run the remaining events and return the Trace; calling it again returns the same Trace.

        Raises:
            DeadlockError: some rank cannot proceed; names each stuck op and what it waits for.
        """
        if self._trace is None:
            self.env.run()
            if self._ahead is not None:
                ahead = self._ahead
                if not ahead.is_finished():
                    _raise_deadlock(self.program, *ahead.state())
                self._trace = build_trace(self.program, ahead.end_s(), ahead.arrival_s(), self._meta)
            else:
                run = self._run
                assert run is not None
                if any(g < stop for g, stop in zip(run.next, run.stop)):
                    _raise_deadlock(self.program, run.next, run.end, run.arrival)
                n = self.program.ops.num_ops
                self._trace = build_trace(self.program, np.fromiter(run.end, np.float64, n),
                                          np.fromiter(run.arrival, np.float64, n),
                                          self._meta, start_s=np.fromiter(run.start, np.float64, n),
                                          send_start_s=np.fromiter(run.send_start, np.float64, n))
        return self._trace


def _durations(program: Program, jitter: float, seed: int) -> npt.NDArray[np.float64]:
    base = program.ops.duration_s
    if jitter == 0:
        return base
    rng = np.random.default_rng(seed)
    offsets = program.ops.rank_offsets.tolist()
    factors = [np.maximum(rng.normal(1.0, jitter, offsets[r + 1] - offsets[r]), 0.0)
               for r in range(program.ops.num_ranks)]
    jittered: npt.NDArray[np.float64] = base * np.concatenate([np.zeros(0), *factors])
    return jittered


def _no_shared_links(g: int, now: float) -> None:
    raise AssertionError(f"op {g} sends over a shared path but the program has none")


def _given_durations(program: Program,
                     durations: Sequence[Sequence[float]] | npt.NDArray[np.float64]) -> list[float]:
    if isinstance(durations, np.ndarray):
        flat: list[float] = durations.astype(np.float64, copy=False).reshape(-1).tolist()
    else:
        flat = [float(value) for row in durations for value in row]
    if len(flat) != program.ops.num_ops:
        raise ConfigError("durations", len(flat), f"must give one duration per op ({program.ops.num_ops})")
    bad = [value for value in flat if not 0.0 <= value < math.inf]
    if bad:
        raise ConfigError("durations", bad[0], "every op's duration must be finite and >= 0")
    return flat


class _Run:
    """The state of one simulation: where each rank is, what has arrived, and each link's queue.

    Plain lists and one handler per rank (a closure over its rank index) keep the work per
    event small: the engine's cost is SimPy's event queue plus a few list reads. A send over
    a shared path is marked by a link index below -1 and handed to ``SharedLinks``.
    """

    def __init__(self, env: simpy.Environment, program: Program, durations: list[float]) -> None:
        ops = program.ops
        self.program = program
        n = ops.num_ops
        self.wait: list[int] = ops.wait.tolist()
        self.next: list[int] = ops.rank_offsets[:-1].tolist()
        self.stop: list[int] = ops.rank_offsets[1:].tolist()
        self.start = [0.0] * n
        self.end = [0.0] * n
        self.send_start = [0.0] * n
        self.arrival: list[float | None] = [None] * n
        # The rank waiting for each op's output (at most one: see OpTable.wait), -1 for none.
        self.waiter = [-1] * n
        link: list[int] = ops.link.tolist()
        self.shared: SharedLinks | None = None
        if program.shared_paths:
            self.shared = SharedLinks(env, program, link, send_start=self.send_start, arrival=self.arrival,
                                      waiter=self.waiter)
        self.start_next = self._handlers(env, link, ops.transfer_s.tolist(), durations)

    def begin(self) -> None:
        """Start every rank at time 0."""
        for rank_index in range(len(self.next)):
            self.start_next(rank_index, 0.0)

    def _handlers(self, env: simpy.Environment, link: list[int], transfer: list[float],
                  duration: list[float]) -> Callable[[int, float], None]:
        wait, next_op, stop = self.wait, self.next, self.stop
        send_shared = self.shared.send if self.shared is not None else _no_shared_links
        start, end, send_start, arrival = self.start, self.end, self.send_start, self.arrival
        link_arrival = [0.0] * (max(link, default=-1) + 1)
        rank_free = [0.0] * len(next_op)
        waiter = self.waiter
        timeout = env.timeout

        def start_next(rank_index: int, now: float) -> None:
            """Start the rank's next op if its input has arrived, else wait for the op that sends it.

            ``now`` is the time of the event being handled; every op starts at or after it.
            """
            g = next_op[rank_index]
            if g == stop[rank_index]:
                return
            begin = rank_free[rank_index]
            producer = wait[g]
            if producer >= 0:
                ready = arrival[producer]
                if ready is None:
                    waiter[producer] = rank_index
                    return
                if ready > begin:
                    begin = ready
            start[g] = begin
            finish_at = begin + duration[g]
            end[g] = finish_at
            rank_free[rank_index] = finish_at
            timeout(finish_at - now).callbacks.append(finishers[rank_index])

        def finisher(rank_index: int) -> Callable[[simpy.Event], None]:
            last = stop[rank_index]

            def finish(_: simpy.Event) -> None:
                """The rank's op ended: send its output, wake the rank waiting for it, go on."""
                g = next_op[rank_index]
                now = end[g]
                channel = link[g]
                if channel >= 0:
                    begin = link_arrival[channel]
                    if now > begin:
                        begin = now
                    send_start[g] = begin
                    done = begin + transfer[g]
                    link_arrival[channel] = done
                    arrival[g] = done
                elif channel == -1:
                    arrival[g] = now
                else:
                    # A shared path: the arrival comes from the network, which wakes the waiter.
                    send_shared(g, now)
                woken = waiter[g]
                if woken >= 0 and arrival[g] is not None:
                    start_next(woken, now)
                g += 1
                next_op[rank_index] = g
                if g == last:
                    return
                # The rank's next op, as start_next does it, inline: this runs once per op.
                begin = now
                producer = wait[g]
                if producer >= 0:
                    ready = arrival[producer]
                    if ready is None:
                        waiter[producer] = rank_index
                        return
                    if ready > begin:
                        begin = ready
                start[g] = begin
                finish_at = begin + duration[g]
                end[g] = finish_at
                rank_free[rank_index] = finish_at
                timeout(finish_at - now).callbacks.append(finish)
            return finish

        finishers = [finisher(rank_index) for rank_index in range(len(next_op))]
        if self.shared is not None:
            self.shared.wake = start_next
        return start_next


def _raise_deadlock(program: Program, next_op: list[int], end: list[float], arrival: list[float | None]) -> None:
    """Raise DeadlockError naming every stuck rank's next op and the op it waits for."""
    schedule = program.schedule
    offsets = program.ops.rank_offsets.tolist()
    wait: list[int] = program.ops.wait.tolist()
    flat = [op for ops in schedule.ranks for op in ops]
    stuck, marked = [], set()
    for rank_index in range(program.ops.num_ranks):
        g = next_op[rank_index]
        if g < offsets[rank_index + 1]:
            producer = wait[g]
            waiting = str(flat[producer]) if producer >= 0 and arrival[producer] is None else "nothing"
            stuck.append(f"rank {rank_index} at {flat[g]} waits for {waiting}")
            marked.add((rank_index, g - offsets[rank_index]))
    raise DeadlockError("deadlock: " + "; ".join(stuck), grid(schedule.ranks, marked))
