"""PipeDream-2BW's planner: depth, width, microbatch size, microbatches and recomputation under a memory limit."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipesim.errors import ConfigError
from pipesim.plan.costs import Chain, CostModel, DeviceRow, Estimate, StageSpec, estimate
from pipesim.plan.partition import RELATIVE_TOLERANCE, Partitioner, no_plan_error
from pipesim.spec.parallel import divisors
from pipesim.spec.profile import Profile
from pipesim.spec.topology import Topology
from pipesim.spec.validation import build


@dataclass(frozen=True)
class Candidate:
    """One (depth, recomputation) configuration at its best microbatch size.

    Attributes:
        depth: pipeline stages d; width: data-parallel pipelines w = devices / d.
        recompute: activation recomputation.
        microbatch_size: b; num_microbatches: m per pipeline and step (b * m * w = batch size).
        stages: per stage ``(start, end, replicas)``, or () when nothing fits the memory.
        estimate: the cost model's view, or None when nothing fits.
    """

    depth: int
    width: int
    recompute: bool
    microbatch_size: int
    num_microbatches: int
    stages: tuple[StageSpec, ...]
    estimate: Estimate | None

    @property
    def throughput_samples_per_s(self) -> float:
        """Predicted samples per second (0 when nothing fits)."""
        return self.estimate.throughput_samples_per_s if self.estimate else 0.0

    def to_dict(self) -> dict[str, object]:
        """One row of the planner's ``candidates`` list."""
        return {
            "depth": self.depth, "width": self.width, "recompute": self.recompute,
            "microbatch_size": self.microbatch_size, "num_microbatches": self.num_microbatches,
            "fits": self.estimate is not None,
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "peak_memory_bytes": self.estimate.peak_memory_bytes if self.estimate else None,
        }


@dataclass(frozen=True)
class TwoBWPlan:
    """The 2BW planner's answer: the best candidate, every candidate, and the cost model.

    Attributes:
        best: the chosen configuration.
        candidates: the best microbatch size of every (depth, recomputation) pair, fitting or not.
        batch_size: samples per optimizer step over all pipelines.
        model: the cost model of the best candidate.
    """

    best: Candidate
    candidates: tuple[Candidate, ...]
    batch_size: int
    model: CostModel

    def configurations_that_fit(self) -> list[Candidate]:
        """The candidates that fit the memory limit, best predicted first (the chosen one first on ties)."""
        fitting = [candidate for candidate in self.candidates if candidate.estimate is not None]
        return sorted(fitting, key=lambda candidate: (candidate is not self.best, -candidate.throughput_samples_per_s))


def scale_profile(profile: Profile, microbatch_size: int) -> Profile:
    """``profile`` at another microbatch size: times and activation bytes scale linearly, weights do not.

    With one measured size, linear scaling is the only assumption the data supports; real
    devices run small microbatches less efficiently, so small sizes come out optimistic.
    """
    if microbatch_size == profile.microbatch_size:
        return profile
    scale = microbatch_size / profile.microbatch_size
    scaled_keys = ("forward_s", "backward_s", "backward_input_s", "backward_weight_s", "activation_bytes",
                   "stash_bytes", "forward_std_s", "backward_std_s")
    layers = []
    for layer in profile.layers:
        data = layer.model_dump()
        for key in scaled_keys:
            if data[key] is not None:
                data[key] = data[key] * scale
        layers.append(data)
    data = profile.model_dump(by_alias=True)
    data.update(layers=layers, microbatch_size=microbatch_size,
                source=f"{profile.source} (scaled linearly from microbatch {profile.microbatch_size})")
    return build(Profile, data)


def _model(overlap: bool, num_microbatches: int, optimizer_state_multiplier: float) -> CostModel:
    return CostModel.named("simulated", overlap=overlap, microbatches_per_allreduce=num_microbatches,
                           weight_versions="double", optimizer_state_multiplier=optimizer_state_multiplier)


def plan_2bw(
    profile: Profile,
    topology: Topology,
    *,
    num_devices: int | None = None,
    memory_bytes: float = math.inf,
    batch_size: int | None = None,
    overlap: bool = False,
    optimizer_state_multiplier: float = 1.0,
    straight: bool = False,
) -> TwoBWPlan:
    """PipeDream-2BW's planner (ICML'21 section 4) over the first ``num_devices`` devices.

    For every depth d dividing the device count (w = devices / d pipelines), with and without
    recomputation, and every microbatch size b with m = batch_size / (b w) >= d microbatches,
    the stages are cut by :class:`Partitioner` with every stage on w consecutive devices, two
    weight versions, and one all-reduce per m microbatches; the best predicted throughput that
    fits ``memory_bytes`` wins (ties: no recomputation, then larger b, then fewer stages).

    Args:
        batch_size: samples per optimizer step over all pipelines; default devices x the
            profile's microbatch size.
        straight: width 1 only (a single pipeline over all devices).

    Raises:
        ConfigError: a batch size no configuration divides, or a memory limit no configuration
            meets (naming the smallest memory that would fit).
    """
    row = DeviceRow.from_topology(topology, num_devices)
    n = row.num_devices
    batch = batch_size if batch_size is not None else n * profile.microbatch_size
    if batch < 1:
        raise ConfigError("batch_size", batch, "must be >= 1")
    depths = [d for d in divisors(n) if d <= profile.num_layers and (not straight or d == n)]
    candidates: list[Candidate] = []
    smallest: list[float] = []
    for depth in depths:
        width = n // depth
        if batch % width:
            continue
        sizes = [b for b in divisors(batch // width) if batch // (width * b) >= depth]
        for recompute in (False, True):
            if sizes:
                candidate, need = _best_size(profile, row, depth, width, recompute, sizes, batch, memory_bytes,
                                             overlap, optimizer_state_multiplier)
                candidates.append(candidate)
                smallest.extend([need] if need is not None else [])
    if not candidates:
        raise ConfigError("batch_size", batch, f"no pipeline depth dividing {n} devices leaves whole microbatches "
                          "(need batch_size divisible by devices/depth and >= depth microbatches per pipeline)")
    fitting = [c for c in candidates if c.estimate is not None]
    if not fitting:
        raise no_plan_error(memory_bytes, min(smallest) if smallest else None, "2BW")
    best = fitting[0]
    for candidate in fitting[1:]:
        if _better(candidate, best):
            best = candidate
    return TwoBWPlan(best=best, candidates=tuple(candidates), batch_size=batch,
                     model=_model(overlap, best.num_microbatches, optimizer_state_multiplier))


def _better(candidate: Candidate, best: Candidate) -> bool:
    ours, theirs = candidate.throughput_samples_per_s, best.throughput_samples_per_s
    if ours > theirs * (1 + RELATIVE_TOLERANCE):
        return True
    if ours < theirs * (1 - RELATIVE_TOLERANCE):
        return False
    return (candidate.recompute, -candidate.microbatch_size, candidate.depth) < (
        best.recompute, -best.microbatch_size, best.depth)


def _best_size(profile: Profile, row: DeviceRow, depth: int, width: int, recompute: bool, sizes: list[int],
               batch: int, memory_bytes: float, overlap: bool, multiplier: float) -> tuple[Candidate, float | None]:
    """The largest microbatch size reaching the best time per sample, and the least memory any size needs.

    Every time scales with b (compute, activations, and the all-reduce spread over m = batch/(b w)
    microbatches), so without a memory limit the time per sample is the same for every b; a
    limit only removes plans as b grows. So the unconstrained time is the target, sizes are
    tried from the largest down, and the first to reach it wins.
    """

    def solver(size: int) -> Partitioner:
        chain = Chain.from_profile(profile, recompute=recompute, microbatch_size=size)
        model = _model(overlap, batch // (width * size), multiplier)
        return Partitioner(chain, row, model, replicas=width)

    target_stages = solver(sizes[-1]).fastest()
    assert target_stages is not None, "an unlimited 2BW configuration always exists"
    target = solver(sizes[-1]).time_of(target_stages) / sizes[-1]
    best: Candidate | None = None
    for size in reversed(sizes):
        partitioner = solver(size)
        stages = partitioner.fastest(memory_bytes)
        if stages is None:
            continue
        found = estimate(partitioner.chain, row, partitioner.model, stages)
        candidate = Candidate(depth, width, recompute, size, batch // (width * size), stages, found)
        if best is None or candidate.throughput_samples_per_s > best.throughput_samples_per_s * (1 + RELATIVE_TOLERANCE):
            best = candidate
        if found.time_per_sample_s <= target * (1 + RELATIVE_TOLERANCE):
            break
    if best is not None:
        return best, None
    smallest_size = sizes[0]
    partitioner = solver(smallest_size)
    least = partitioner.smallest()
    need = partitioner.memory_of(least) if least is not None else None
    return Candidate(depth, width, recompute, smallest_size, batch // (width * smallest_size), (), None), need
