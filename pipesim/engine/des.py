"""The discrete-event engine: SimPy events for every op's end on every rank's compute stream."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import simpy

from pipesim.engine.assemble import build_trace
from pipesim.engine.lowering import Program
from pipesim.engine.trace import Trace
from pipesim.errors import ConfigError, DeadlockError
from pipesim.schedule.ir import grid


def run_des(program: Program, *, jitter: float = 0.0, seed: int = 0) -> Trace:
    """Simulate ``program`` event by event.

    Each rank runs its ops in order on its compute stream: an op starts once the rank is free
    and the output it waits for has arrived, and a SimPy event marks its end. Each directed
    link between two ranks serves sends first-in first-out, one at a time, taking latency +
    bytes / bandwidth each, so communication overlaps compute as with NCCL's separate
    streams. A link is dedicated to its rank pair and its transfer times are known, so when
    an op ends its send's start and arrival follow at once (Lindley's recursion:
    start = max(end, the link's previous arrival)); a model with shared links would make
    the link a process of its own.

    Span times are the values the event handlers compute (start = max(...), end = start +
    duration), the times at which SimPy fires the end events; they are recorded as computed
    rather than read back from the clock, whose ``now + (end - now)`` can differ from ``end``
    in the last bit.

    Args:
        jitter: coefficient of variation of every op's duration (0: deterministic). Factors
            are drawn from ``numpy.random.default_rng(seed)`` up front, rank by rank, and
            clipped at 0.
        seed: seed of the jitter draws.

    Returns:
        the Trace: compute and send spans (in the order of ``assemble.build_trace``), and
        memory events.

    Raises:
        DeadlockError: some rank cannot proceed; names each stuck op and what it waits for.
        ConfigError: a negative jitter.
    """
    if jitter < 0:
        raise ConfigError("jitter", jitter, "must be >= 0")
    env = simpy.Environment()
    run = _Run(env, program, _durations(program, jitter, seed))
    for rank_index in range(program.ops.num_ranks):
        run.start_next(rank_index, 0.0)
    env.run()
    run.check_finished()
    meta = {**program.meta, "engine": "des", "jitter": jitter, "seed": seed}
    return build_trace(program, np.asarray(run.end), np.asarray(run.arrival), meta,
                       start_s=np.asarray(run.start), send_start_s=np.asarray(run.send_start))


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


class _Run:
    """The state of one simulation: where each rank is, what has arrived, and each link's queue.

    Plain lists and one end-of-op handler per rank (a closure over its rank index) keep the
    work per event small: the engine's cost is SimPy's event queue plus a few list reads.
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
        self.start_next = self._handlers(env, ops.link.tolist(), ops.transfer_s.tolist(), durations)

    def _handlers(self, env: simpy.Environment, link: list[int], transfer: list[float],
                  duration: list[float]) -> Callable[[int, float], None]:
        wait, next_op, stop = self.wait, self.next, self.stop
        start, end, send_start, arrival = self.start, self.end, self.send_start, self.arrival
        link_arrival = [0.0] * (max(link, default=-1) + 1)
        rank_free = [0.0] * len(next_op)
        # The op waiting for each op's output (at most one: see OpTable.wait), -1 for none.
        waiter = [-1] * len(wait)
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
                else:
                    arrival[g] = now
                woken = waiter[g]
                if woken >= 0:
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
