"""What the simulator predicts for a harness run, and the emulated device's op durations taken from it."""

from __future__ import annotations

from pipesim.engine.trace import Trace
from pipesim.harness.config import Emulation, RunConfig
from pipesim.simulation import Result, simulate
from pipesim.spec.profile import Profile
from pipesim.spec.stages import stage_memory
from pipesim.spec.topology import Topology


def predict(profile: Profile, topology: Topology | None, config: RunConfig) -> Result:
    """Simulate the run ``config`` describes on ``profile``'s op times and ``topology``'s links.

    The harness keeps no optimizer state (plain SGD), so none is predicted. It runs every op on
    its own, as torch's runtime performs an OVERLAP_F_B, so dualpipev's pairs are predicted so too.
    """
    stages_per_rank = config.num_stages // config.num_ranks if config.num_ranks else 1
    return simulate(profile, topology, schedule=config.schedule, num_stages=config.num_stages,
                    num_microbatches=config.num_microbatches, num_minibatches=config.num_minibatches,
                    partition=config.partition, optimizer_state_multiplier=0.0,
                    pipemare_update=config.pipemare_update, stages_per_rank=stages_per_rank, fb_chunks="torch")


def emulation_of(prediction: Trace, profile: Profile, partition: tuple[tuple[int, int], ...], *,
                 realtime_priority: int = 0) -> Emulation:
    """The emulated device for a run: each op lasts as long as in ``prediction`` (its compute span,
    keyed by rank and position), and a forward keeps its stage's stash as the simulator counts it
    (``pipesim.spec.stages.stage_memory``: its layers', the model's input on stage 0, the loss
    buffer on the last), of which a split backward's W keeps the weight stash. The ranks run at
    ``realtime_priority`` (see ``Emulation``)."""
    durations: dict[int, dict[int, float]] = {}
    for span in prediction.iter_spans():
        if span.stream == "compute":
            durations.setdefault(span.device, {})[span.position] = span.end_s - span.start_s
    per_rank = tuple(tuple(ops[position] for position in range(len(ops)))
                     for _, ops in sorted(durations.items()))
    sizes = [stage_memory(profile, start, end) for start, end in partition]
    return Emulation(durations_s=per_rank, stash_bytes=tuple(float(size[0]) for size in sizes),
                     weight_stash_bytes=tuple(float(size[1]) for size in sizes), realtime_priority=realtime_priority)
