"""What the analytic model proposes for the simulator to decide: its optimum, uniform widths, 2-stage cuts, data parallelism.

The cost model bounds a pipeline by its slowest stage; the engine also sees bubbles, updates
stalling the compute stream and dependencies between stages. So the planner does not trust one
analytic optimum: it proposes a handful of structurally different plans, each the cost model's
best of its kind, and lets the simulation rank them (``pipesim.plan.check``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipesim.plan.costs import Chain, CostModel, DeviceRow, Estimate, StageSpec, estimate, inflight_microbatches
from pipesim.plan.partition import Partitioner


@dataclass(frozen=True)
class Proposal:
    """One plan put to the simulator.

    Attributes:
        label: what kind of plan it is (``"analytic optimum"``, ``"data parallelism"``, ...).
        stages: per stage ``(start, end, replicas)`` on consecutive devices ending at the last one.
        estimate: the cost model's view of it.
    """

    label: str
    stages: tuple[StageSpec, ...]
    estimate: Estimate

    @property
    def replication(self) -> list[int]:
        """Replicas per stage."""
        return [replicas for _, _, replicas in self.stages]


def propose(chain: Chain, row: DeviceRow, model: CostModel, *, memory_bytes: float = math.inf,
            straight: bool = False, first: tuple[str, tuple[StageSpec, ...]] | None = None,
            others: tuple[tuple[str, tuple[StageSpec, ...]], ...] = ()) -> list[Proposal]:
    """The cost model's best plan of each kind that fits ``memory_bytes``, distinct, best predicted first.

    Kinds: any replication (the dynamic program), every uniform width w dividing the devices
    (N/w stages of w replicas: w = N is data parallelism, w = 1 the straight pipeline), and the
    best 2-stage cut for each split r0-r1 of the devices. ``straight`` keeps one replica per
    stage. ``first``, when given, is put first whatever its estimate (PipeDream's own choice in
    its compatibility mode); ``others`` are proposed beside the kinds above.
    """
    n = row.num_devices
    found: list[tuple[str, tuple[StageSpec, ...] | None]] = []
    if first is not None:
        found.append(first)
    widths = [1] if straight else [w for w in range(n, 0, -1) if n % w == 0]
    for width in widths:
        if n // width > chain.num_layers:
            continue
        label = ("data parallelism" if width == n else "straight pipeline" if width == 1
                 else f"{n // width} stages x {width} replicas")
        found.append((label, Partitioner(chain, row, model, replicas=width).fastest(memory_bytes)))
    # After the named baselines, so that a baseline the optimum equals keeps its name.
    found.append(("analytic optimum", Partitioner(chain, row, model, replicas="straight" if straight else "free")
                  .fastest(memory_bytes)))
    if not straight:
        for replicas in range(n - 1, 0, -1):
            found.append((f"best 2-stage cut, {replicas}-{n - replicas}",
                          best_two_stage(chain, row, model, memory_bytes, first_replicas=replicas)))
    found.extend(others)
    proposals: list[Proposal] = []
    seen: set[tuple[StageSpec, ...]] = set()
    for label, stages in found:
        if stages is None or stages in seen:
            continue
        seen.add(stages)
        cost = estimate(chain, row, model, stages)
        if cost.peak_memory_bytes <= memory_bytes or (first is not None and stages == first[1]):
            proposals.append(Proposal(label, stages, cost))
    head = proposals[:1] if first is not None else []
    return head + sorted(proposals[len(head):], key=lambda proposal: proposal.estimate.time_s)


def best_two_stage(chain: Chain, row: DeviceRow, model: CostModel, memory_bytes: float = math.inf,
                   first_replicas: int | None = None) -> tuple[StageSpec, ...] | None:
    """The cost model's best plan of exactly two stages on all devices: every cut, and every r0 + r1 = N
    (or only r0 = ``first_replicas``)."""
    n, num_layers = row.num_devices, chain.num_layers
    if n < 2 or num_layers < 2:
        return None
    cuts = np.arange(1, num_layers)
    best: tuple[float, StageSpec, StageSpec] | None = None
    for replicas in range(1, n) if first_replicas is None else [first_replicas]:
        rest = n - replicas
        times, memory = [], np.zeros(len(cuts))
        for first, count, start, end in ((0, replicas, np.zeros_like(cuts), cuts),
                                         (replicas, rest, cuts, np.full_like(cuts, num_layers))):
            speed = float(row.speed[first:first + count].min())
            compute = (chain.compute_s[end] - chain.compute_s[start]) / speed
            params = chain.param_bytes[end] - chain.param_bytes[start]
            allreduce = model.allreduce_s_per_byte(row, first, count) * params
            times.append((np.maximum(compute, allreduce) if model.overlap else compute + allreduce) / count)
            stash = np.array([chain.stage_stash_bytes(a, b) for a, b in zip(start.tolist(), end.tolist(), strict=True)])
            working = np.array([chain.stage_working_bytes(a, b)
                                for a, b in zip(start.tolist(), end.tolist(), strict=True)])
            inflight = inflight_microbatches(n - first, count)
            memory = np.maximum(memory, model.memory_bytes(1.0, 0.0, inflight) * params + stash * inflight + working)
        transfer = model.transfer_factor * chain.output_bytes[cuts - 1] / float(row.link_bandwidth[0, replicas])
        bottleneck = np.maximum(np.maximum(times[0], times[1]), transfer)
        if model.round_trip:
            bottleneck = np.maximum(bottleneck, (times[0] + times[1] + 2 * transfer) / 2)
        bottleneck = np.where(memory <= memory_bytes, bottleneck, math.inf)
        index = int(np.argmin(bottleneck))
        if math.isfinite(bottleneck[index]) and (best is None or bottleneck[index] < best[0]):
            cut = int(cuts[index])
            best = (float(bottleneck[index]), (0, cut, replicas), (cut, num_layers, rest))
    return None if best is None else (best[1], best[2])
