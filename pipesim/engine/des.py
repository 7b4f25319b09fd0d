"""The discrete-event engine: SimPy events for every op's end on every rank's compute stream."""

from __future__ import annotations

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
        run.start_next(rank_index)
    env.run()
    run.check_finished()
    meta = {**program.meta, "engine": "des", "jitter": jitter, "seed": seed}
    return build_trace(program, np.asarray(run.end), np.asarray(run.arrival), meta,
                       start_s=np.asarray(run.start), send_start_s=np.asarray(run.send_start))


def _durations(program: Program, jitter: float, seed: int) -> list[float]:
    base = program.ops.duration_s
    if jitter == 0:
        return base.tolist()
    rng = np.random.default_rng(seed)
    offsets = program.ops.rank_offsets.tolist()
    factors = [np.maximum(rng.normal(1.0, jitter, offsets[r + 1] - offsets[r]), 0.0)
               for r in range(program.ops.num_ranks)]
    return (base * np.concatenate([np.zeros(0), *factors])).tolist()


class _Run:
    """The state of one simulation: where each rank is, what has arrived, and each link's queue."""

    def __init__(self, env: simpy.Environment, program: Program, durations: list[float]) -> None:
        ops = program.ops
        self.env = env
        self.program = program
        self.duration = durations
        self.wait: list[int] = ops.wait.tolist()
        self.rank: list[int] = ops.rank.tolist()
        self.link: list[int] = ops.link.tolist()
        self.transfer: list[float] = ops.transfer_s.tolist()
        self.link_arrival = [0.0] * (max(self.link, default=-1) + 1)
        self.next: list[int] = ops.rank_offsets[:-1].tolist()
        self.stop: list[int] = ops.rank_offsets[1:].tolist()
        self.rank_free = [0.0] * ops.num_ranks
        n = ops.num_ops
        self.start = [0.0] * n
        self.end = [0.0] * n
        self.send_start = [0.0] * n
        self.arrival: list[float | None] = [None] * n
        self.waiting: dict[int, list[int]] = {}

    def start_next(self, rank_index: int) -> None:
        """Start the rank's next op if its input has arrived, else wait for the op that sends it."""
        g = self.next[rank_index]
        if g == self.stop[rank_index]:
            return
        start = self.rank_free[rank_index]
        producer = self.wait[g]
        if producer >= 0:
            arrival = self.arrival[producer]
            if arrival is None:
                self.waiting.setdefault(producer, []).append(rank_index)
                return
            if arrival > start:
                start = arrival
        self.start[g] = start
        end = start + self.duration[g]
        event = self.env.timeout(max(end - self.env.now, 0.0), g)
        event.callbacks.append(self.finish)

    def finish(self, event: simpy.Event) -> None:
        """An op ended: send its output, wake the rank waiting for it, and go on."""
        g: int = event.value
        end = self.start[g] + self.duration[g]
        self.end[g] = end
        rank_index = self.rank[g]
        self.rank_free[rank_index] = end
        link = self.link[g]
        if link >= 0:
            send_start = self.link_arrival[link]
            if end > send_start:
                send_start = end
            self.send_start[g] = send_start
            arrival = send_start + self.transfer[g]
            self.link_arrival[link] = arrival
        else:
            self.send_start[g] = end
            arrival = end
        self.arrival[g] = arrival
        self.next[rank_index] = g + 1
        for waiter in self.waiting.pop(g, ()):
            self.start_next(waiter)
        self.start_next(rank_index)

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
