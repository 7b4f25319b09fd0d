"""The discrete-event engine: SimPy events for every op's end on every rank's compute stream."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
import simpy

from pipesim.engine.assemble import build_trace
from pipesim.engine.lowering import Program, SharedPath
from pipesim.engine.network import Network
from pipesim.engine.trace import Trace
from pipesim.errors import ConfigError, DeadlockError
from pipesim.schedule.ir import grid


def run_des(
    program: Program,
    *,
    jitter: float = 0.0,
    seed: int = 0,
    durations: Sequence[Sequence[float]] | npt.NDArray[np.float64] | None = None,
) -> Trace:
    """Simulate ``program`` event by event.

    Each rank runs its ops in order on its compute stream: an op starts once the rank is free
    and the output it waits for has arrived, and a SimPy event marks its end. Each directed
    link between two ranks serves sends first-in first-out, one at a time, taking latency +
    bytes / bandwidth each, so communication overlaps compute as with NCCL's separate
    streams. A link is dedicated to its rank pair and its transfer times are known, so when
    an op ends its send's start and arrival follow at once (Lindley's recursion:
    start = max(end, the link's previous arrival)).

    A link whose path crosses shared NICs (``program.shared_paths``) cannot know its arrival
    up front: it still serves its sends first-in first-out, but each takes its latency and
    then moves its bytes at the max-min fair share of those NICs among all flows crossing
    them at the moment (``network.Network``), and its arrival is the time SimPy reaches.
    Programs without shared paths never build that machinery.

    Span times are the values the event handlers compute (start = max(...), end = start +
    duration), the times at which SimPy fires the end events; they are recorded as computed
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

    Returns:
        the Trace: compute and send spans (in the order of ``assemble.build_trace``), and
        memory events.

    Raises:
        DeadlockError: some rank cannot proceed; names each stuck op and what it waits for.
        ConfigError: a negative jitter, jitter with durations, or durations of the wrong length.
    """
    return DesRun(program, jitter=jitter, seed=seed, durations=durations).finish()


class DesRun:
    """A DES run that can be advanced one SimPy event at a time (an op's end; with shared NICs also
    a step of a transfer).

    ``run_des`` is ``DesRun(...).finish()``; stepping is for tests that compare the engine
    with a model after every event, and for tools that watch a run unfold.

    Args:
        program, jitter, seed, durations: as for ``run_des``.

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
    ) -> None:
        if jitter < 0:
            raise ConfigError("jitter", jitter, "must be >= 0")
        if durations is not None and jitter:
            raise ConfigError("jitter", jitter, "must be 0 when durations are given")
        self.program = program
        self.env = simpy.Environment()
        self._meta = {**program.meta, "engine": "des", "jitter": jitter, "seed": seed}
        chosen = _durations(program, jitter, seed) if durations is None else _given_durations(program, durations)
        self._run = _Run(self.env, program, chosen)
        for rank_index in range(program.ops.num_ranks):
            self._run.start_next(rank_index, 0.0)
        self._trace: Trace | None = None

    def next_event_s(self) -> float:
        """Time of the next pending event, seconds (``inf`` when none is left)."""
        return float(self.env.peek())

    def step(self) -> None:
        """Process the next event (raises ``simpy.core.EmptySchedule`` when none is left)."""
        self.env.step()

    def completed(self) -> tuple[list[tuple[int, int, float, float]], list[tuple[int, int, float, float, int]]]:
        """The spans of every op whose end has been processed so far.

        Returns:
            compute spans as ``(rank, position, start_s, end_s)``, and the sends of those ops
            to other ranks as ``(rank, position, start_s, end_s, peer)`` (a send over a
            dedicated link may end later than the current time: its times follow from the op's
            end; one over shared NICs is listed once it has arrived).
        """
        run, ops = self._run, self.program.ops
        offsets = ops.rank_offsets.tolist()
        compute, sends = [], []
        for rank_index in range(ops.num_ranks):
            for g in range(offsets[rank_index], run.next[rank_index]):
                position = g - offsets[rank_index]
                compute.append((rank_index, position, run.start[g], run.end[g]))
                arrival = run.arrival[g]
                if ops.is_remote_send[g] and arrival is not None:
                    sends.append((rank_index, position, run.send_start[g], arrival, int(ops.send_rank[g])))
        return compute, sends

    def finish(self) -> Trace:
        """Run the remaining events and return the Trace; calling it again returns the same Trace.

        Raises:
            DeadlockError: some rank cannot proceed; names each stuck op and what it waits for.
        """
        if self._trace is None:
            run = self._run
            self.env.run()
            run.check_finished()
            self._trace = build_trace(self.program, np.asarray(run.end), np.asarray(run.arrival), self._meta,
                                      start_s=np.asarray(run.start), send_start_s=np.asarray(run.send_start))
        return self._trace


def _durations(program: Program, jitter: float, seed: int) -> list[float]:
    base = program.ops.duration_s
    if jitter == 0:
        plain: list[float] = base.tolist()
        return plain
    rng = np.random.default_rng(seed)
    offsets = program.ops.rank_offsets.tolist()
    factors = [np.maximum(rng.normal(1.0, jitter, offsets[r + 1] - offsets[r]), 0.0)
               for r in range(program.ops.num_ranks)]
    jittered: list[float] = (base * np.concatenate([np.zeros(0), *factors])).tolist()
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

    Plain lists and one end-of-op handler per rank (a closure over its rank index) keep the
    work per event small: the engine's cost is SimPy's event queue plus a few list reads.
    A send over a shared path is marked by a link index below -1 and handed to ``_SharedLinks``.
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
        self.shared: _SharedLinks | None = None
        if program.shared_paths:
            self.shared = _SharedLinks(env, program, link, self)
        self.start_next = self._handlers(env, link, ops.transfer_s.tolist(), durations)

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

    def check_finished(self) -> None:
        """Raise DeadlockError naming every stuck rank's next op and the op it waits for."""
        schedule = self.program.schedule
        offsets = self.program.ops.rank_offsets.tolist()
        flat = [op for ops in schedule.ranks for op in ops]
        stuck, marked = [], set()
        for rank_index in range(len(self.next)):
            g = self.next[rank_index]
            if g < self.stop[rank_index]:
                producer = self.wait[g]
                waiting = str(flat[producer]) if producer >= 0 and self.arrival[producer] is None else "nothing"
                stuck.append(f"rank {rank_index} at {flat[g]} waits for {waiting}")
                marked.add((rank_index, g - offsets[rank_index]))
        if stuck:
            raise DeadlockError("deadlock: " + "; ".join(stuck), grid(schedule.ranks, marked))


class _SharedLinks:
    """The links of a program whose paths cross shared NICs: one first-in first-out queue each,
    served one send at a time through a ``Network`` that splits NIC bandwidth between flows.

    On construction it relabels those links in ``link`` (the per-op link list the end-of-op
    handlers read) as ``-2 - index``, so the handlers tell them apart with one comparison.
    """

    def __init__(self, env: simpy.Environment, program: Program, link: list[int], run: _Run) -> None:
        ops = program.ops
        self.env = env
        self.run = run
        self.network = Network(env, program.nic_bandwidth_bytes_per_s)
        self.send_bytes: list[float] = ops.send_bytes.tolist()
        self.paths: list[SharedPath] = []
        self.queues: list[deque[int]] = []
        self.wake: Callable[[int, float], None] = lambda rank_index, now: None
        index_of: dict[tuple[int, int], int] = {}
        rank, send_rank = ops.rank.tolist(), ops.send_rank.tolist()
        for g, channel in enumerate(link):
            if channel < 0:
                continue
            path = program.shared_paths.get((rank[g], send_rank[g]))
            if path is None:
                continue
            pair = (rank[g], send_rank[g])
            if pair not in index_of:
                index_of[pair] = len(self.paths)
                self.paths.append(path)
                self.queues.append(deque())
            link[g] = -2 - index_of[pair]
        self.link = link

    def send(self, g: int, now: float) -> None:
        """Queue op ``g``'s send on its link; start it at once if the link is idle."""
        index = -2 - self.link[g]
        queue = self.queues[index]
        queue.append(g)
        if len(queue) == 1:
            self._begin(index, now)

    def _begin(self, index: int, now: float) -> None:
        g = self.queues[index][0]
        self.run.send_start[g] = now
        path = self.paths[index]
        process = self.env.process(self.network.transfer(self.send_bytes[g], path.latency_s, path.nics))
        process.callbacks.append(lambda _event: self._arrived(index))

    def _arrived(self, index: int) -> None:
        """The link's head send arrived: record it, wake the rank waiting for it, start the next."""
        now = self.env.now
        queue = self.queues[index]
        g = queue.popleft()
        self.run.arrival[g] = now
        woken = self.run.waiter[g]
        if woken >= 0:
            self.wake(woken, now)
        if queue:
            self._begin(index, now)
