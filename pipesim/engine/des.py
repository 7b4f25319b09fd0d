"""The discrete-event engine: SimPy processes for every rank's compute stream and every link."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

import numpy as np
import simpy

from pipesim.engine.lowering import LoweredOp, Program, SharedPath
from pipesim.engine.memory import record_memory
from pipesim.engine.network import Network
from pipesim.engine.trace import STREAMS, Trace, TraceBuilder
from pipesim.errors import ConfigError, DeadlockError
from pipesim.schedule.ir import Op, grid

COMPUTE, SEND = STREAMS.index("compute"), STREAMS.index("send")


def run_des(
    program: Program,
    *,
    jitter: float = 0.0,
    seed: int = 0,
    durations: Sequence[Sequence[float]] | None = None,
) -> Trace:
    """Simulate ``program`` event by event.

    Each rank is a SimPy process that runs its ops in order on its compute stream, waiting
    for the inputs each op needs. Each directed link between two ranks is a process that
    serves sends first-in first-out, one at a time, taking latency + bytes / bandwidth each,
    so communication overlaps compute as it does with NCCL's separate streams. A link whose
    path crosses shared NICs (``program.shared_paths``) takes its latency, then moves its
    bytes at the max-min fair share of those NICs among all flows crossing them (Network).

    Args:
        jitter: coefficient of variation of every op's duration (0: deterministic). Factors
            are drawn from ``numpy.random.default_rng(seed)`` up front, rank by rank, and
            clipped at 0.
        seed: seed of the jitter draws.
        durations: per rank, per op, the compute time to use instead of the lowered one (a
            stochastic sample, see ``pipesim.engine.noise``); ``jitter`` must then be 0.

    Returns:
        the Trace: compute and send spans, and memory events.

    Raises:
        DeadlockError: some rank cannot proceed; names each stuck op and what it waits for.
        ConfigError: a negative jitter.
    """
    if jitter < 0:
        raise ConfigError("jitter", jitter, "must be >= 0")
    if durations is not None and jitter:
        raise ConfigError("jitter", jitter, "must be 0 when durations are given")
    env = simpy.Environment()
    builder = TraceBuilder(meta={**program.meta, "engine": "des", "jitter": jitter, "seed": seed})
    if durations is None:
        durations = _durations(program, jitter, seed)
    network = Network(env, program.nic_bandwidth_bytes_per_s) if program.shared_paths else None
    available: dict[Op, simpy.Event] = {
        lowered.op: env.event() for ops in program.ranks for lowered in ops if lowered.send_rank >= 0
    }
    links: dict[tuple[int, int], simpy.Store] = {}
    for rank_index, ops in enumerate(program.ranks):
        for lowered in ops:
            pair = (rank_index, lowered.send_rank)
            if lowered.send_rank >= 0 and lowered.send_rank != rank_index and pair not in links:
                links[pair] = simpy.Store(env)
                env.process(_link(env, pair, links[pair], available, builder, network,
                                  program.shared_paths.get(pair)))
    ends: list[list[float]] = [[] for _ in program.ranks]
    positions = [0] * len(program.ranks)
    for rank_index, ops in enumerate(program.ranks):
        env.process(_rank(env, rank_index, ops, durations[rank_index], available, links, builder,
                          ends[rank_index], positions))
    env.run()
    _check_finished(program, positions, available)
    record_memory(program, ends, builder)
    return builder.build()


def _durations(program: Program, jitter: float, seed: int) -> Sequence[Sequence[float]]:
    base = [[lowered.duration_s for lowered in ops] for ops in program.ranks]
    if jitter == 0:
        return base
    rng = np.random.default_rng(seed)
    return [
        [d * f for d, f in zip(row, np.maximum(rng.normal(1.0, jitter, len(row)), 0.0).tolist(), strict=True)]
        for row in base
    ]


def _rank(
    env: simpy.Environment,
    rank_index: int,
    ops: tuple[LoweredOp, ...],
    durations: Sequence[float],
    available: dict[Op, simpy.Event],
    links: dict[tuple[int, int], simpy.Store],
    builder: TraceBuilder,
    ends: list[float],
    positions: list[int],
) -> Generator[simpy.Event, Any, None]:
    for position, lowered in enumerate(ops):
        positions[rank_index] = position
        for dep in lowered.waits_for:
            event = available[dep]
            if not event.processed:
                yield event
        start = env.now
        yield env.timeout(durations[position])
        end = env.now
        ends.append(end)
        op = lowered.op
        builder.span(rank_index, COMPUTE, lowered.kind_code, op.stage, op.microbatch, lowered.minibatch,
                     lowered.version, start, end, 0.0, -1, position)
        if lowered.send_rank == rank_index:
            available[op].succeed()
        elif lowered.send_rank >= 0:
            links[(rank_index, lowered.send_rank)].put((lowered, position))
    positions[rank_index] = len(ops)


def _link(
    env: simpy.Environment,
    pair: tuple[int, int],
    queue: simpy.Store,
    available: dict[Op, simpy.Event],
    builder: TraceBuilder,
    network: Network | None,
    shared: SharedPath | None,
) -> Generator[simpy.Event, Any, None]:
    source, target = pair
    while True:
        lowered, position = yield queue.get()
        start = env.now
        if network is not None and shared is not None:
            yield env.process(network.transfer(lowered.send_bytes, shared.latency_s, shared.nics))
        else:
            yield env.timeout(lowered.transfer_s)
        op = lowered.op
        builder.span(source, SEND, lowered.kind_code, op.stage, op.microbatch, lowered.minibatch, -1,
                     start, env.now, lowered.send_bytes, target, position)
        available[op].succeed()


def _check_finished(program: Program, positions: list[int], available: dict[Op, simpy.Event]) -> None:
    stuck = []
    marked = set()
    for rank_index, ops in enumerate(program.ranks):
        position = positions[rank_index]
        if position < len(ops):
            lowered = ops[position]
            waiting = [str(dep) for dep in lowered.waits_for if not available[dep].processed]
            stuck.append(f"rank {rank_index} at {lowered.op} waits for {', '.join(waiting) or 'nothing'}")
            marked.add((rank_index, position))
    if stuck:
        raise DeadlockError("deadlock: " + "; ".join(stuck), grid(program.schedule.ranks, marked))
