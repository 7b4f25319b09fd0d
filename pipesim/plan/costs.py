"""The planners' closed-form cost model: time, transfers and memory of a layer chain cut into stages."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from pipesim.errors import ConfigError
from pipesim.spec.profile import Profile
from pipesim.spec.stages import input_layers
from pipesim.spec.topology import Topology

FloatArray = npt.NDArray[np.float64]
StageSpec = tuple[int, int, int]
"""One stage of a candidate plan: ``(start_layer, end_layer, replicas)``, layers half-open."""
CostModelName = Literal["simulated", "pipedream"]
COST_MODELS: tuple[CostModelName, ...] = ("simulated", "pipedream")


@dataclass(frozen=True, eq=False)
class Chain:
    """A profile as prefix sums over its layers, for one microbatch.

    Attributes:
        compute_s: ``(L+1,)`` prefix sums of forward + backward time (plus the forward again
            when ``recompute``), seconds, as measured (device speed 1).
        param_bytes: ``(L+1,)`` prefix sums of weight bytes.
        stash_bytes: ``(L+1,)`` prefix sums of the bytes each layer stashes for its backward.
        output_bytes: ``(L,)`` bytes crossing the cut after each layer.
        microbatch_size: samples per microbatch.
        recompute: a stage stashes only its input and re-runs its forward before its backward.
        input_bytes: the model's input, kept on stage 0 whatever the recomputation.
        input_layers: leading layers that are the model's input (no time, no weights), which
            recomputation keeps too (``pipesim.spec.stages``).
        loss_bytes: the loss buffer, kept on the last stage whatever the recomputation.
        recomputed_bytes: ``(L,)`` bytes each layer's backward re-creates inside the layer.
    """

    compute_s: FloatArray
    param_bytes: FloatArray
    stash_bytes: FloatArray
    output_bytes: FloatArray
    microbatch_size: int
    recompute: bool
    input_bytes: float = 0.0
    input_layers: int = 0
    loss_bytes: float = 0.0
    recomputed_bytes: FloatArray = field(default_factory=lambda: np.zeros(0))

    @classmethod
    def from_profile(cls, profile: Profile, *, recompute: bool = False, microbatch_size: int | None = None) -> Chain:
        """Prefix sums of ``profile``, with times and activations scaled linearly to ``microbatch_size``.

        Raises:
            ConfigError: ``microbatch_size < 1``.
        """
        size = profile.microbatch_size if microbatch_size is None else microbatch_size
        if size < 1:
            raise ConfigError("microbatch_size", size, "must be >= 1")
        scale = size / profile.microbatch_size
        layers = profile.layers
        forward = np.array([layer.forward_s for layer in layers]) * scale
        backward = np.array([layer.backward_s for layer in layers]) * scale
        compute = forward + backward + (forward if recompute else 0.0)
        return cls(
            compute_s=np.concatenate(([0.0], np.cumsum(compute))),
            param_bytes=np.concatenate(([0.0], np.cumsum([layer.param_bytes for layer in layers]))),
            stash_bytes=np.concatenate(([0.0], np.cumsum([layer.stashed_bytes for layer in layers]) * scale)),
            output_bytes=np.array([layer.activation_bytes for layer in layers]) * scale,
            microbatch_size=size,
            recompute=recompute,
            input_bytes=(profile.input_bytes or 0.0) * scale,
            input_layers=input_layers(layers),
            loss_bytes=(profile.loss_bytes or 0.0) * scale,
            recomputed_bytes=np.array([layer.recomputed_bytes or 0.0 for layer in layers]) * scale,
        )

    @property
    def num_layers(self) -> int:
        """Number of layers L."""
        return len(self.output_bytes)

    def stage_stash_bytes(self, start: int, end: int) -> float:
        """Bytes one microbatch keeps on a stage of layers ``[start, end)`` (its input alone with
        recompute), with the model's input on the first stage and the loss buffer on the last."""
        fixed = self.loss_bytes if end == self.num_layers else 0.0
        if start == 0:
            fixed += self.input_bytes
        if not self.recompute:
            return float(self.stash_bytes[end] - self.stash_bytes[start]) + fixed
        kept = float(self.output_bytes[start - 1]) if start > 0 else float(self._input_stash(end))
        return kept + fixed

    def stage_working_bytes(self, start: int, end: int) -> float:
        """Bytes the backward of one microbatch re-creates and holds on a stage of layers
        ``[start, end)``: with recompute the stage's whole stash (not the input layers), plus the
        largest re-created inside one layer."""
        inside = float(self.recomputed_bytes[start:end].max()) if end > start else 0.0
        if not self.recompute:
            return inside
        first = min(self.input_layers, end) if start == 0 else start
        return float(self.stash_bytes[end] - self.stash_bytes[first]) + inside

    def _input_stash(self, end: int) -> float:
        """The stash of the input layers within ``[0, end)``."""
        return float(self.stash_bytes[min(self.input_layers, end)] - self.stash_bytes[0])


@dataclass(frozen=True, eq=False)
class DeviceRow:
    """The devices a plan may use, in a row: stages take consecutive devices.

    Attributes:
        speed: ``(N,)`` relative speed of each device.
        link_bandwidth: ``(N, N)`` bytes/s between two devices (``inf`` on the diagonal).
        ring_bandwidth: ``(N, N)`` bytes/s of a ring all-reduce over devices ``first..last``: its
            slowest link (``Topology.ring_bandwidth_bytes_per_s``); ``inf`` for one device.
    """

    speed: FloatArray
    link_bandwidth: FloatArray
    ring_bandwidth: FloatArray

    @classmethod
    def from_topology(cls, topology: Topology, num_devices: int | None = None) -> DeviceRow:
        """The first ``num_devices`` devices of ``topology`` (default: all).

        Raises:
            ConfigError: ``num_devices`` is below 1 or above the topology's device count.
        """
        n = topology.num_devices if num_devices is None else num_devices
        if not 1 <= n <= topology.num_devices:
            raise ConfigError("num_devices", n, f"must be between 1 and the topology's {topology.num_devices} devices")
        link = np.full((n, n), math.inf)
        for src in range(n):
            for dst in range(n):
                if src != dst:
                    link[src, dst] = topology.link_cost(src, dst)[1]
        ring = np.full((n, n), math.inf)
        for first in range(n):
            slowest_hop = math.inf
            for last in range(first + 1, n):
                slowest_hop = min(slowest_hop, link[last - 1, last])
                ring[first, last] = min(slowest_hop, link[last, first])
        speed = np.array([device.speed for device in topology.devices[:n]])
        return cls(speed=speed, link_bandwidth=link, ring_bandwidth=ring)

    @property
    def num_devices(self) -> int:
        """Number of devices N."""
        return len(self.speed)


@dataclass(frozen=True)
class CostModel:
    """PipeDream's cost model (SOSP'19 section 3.1), per microbatch of the chain.

    A stage of layers i..j on r replicas takes ``(compute + allreduce) / r`` (``overlap=False``,
    as PipeDream's released optimizer adds them) or ``max(compute, allreduce) / r``
    (``overlap=True``, the paper's formula), where ``allreduce = allreduce_factor (r-1)/r *
    weight bytes / ring bandwidth``, divided by ``microbatches_per_allreduce``. A cut costs
    ``transfer_factor * activation bytes / link bandwidth`` (activations forward, gradients
    back). The pipeline's time per microbatch is the slowest stage or cut.

    Attributes:
        overlap: compute and all-reduce overlap (max) instead of adding.
        allreduce_factor: bytes moved per weight byte and replica fraction; PipeDream uses 4.
        transfer_factor: bytes moved per activation byte over a cut; PipeDream uses 2.
        microbatches_per_allreduce: microbatches each replica runs between two all-reduces
            (1 for PipeDream, m for 2BW's gradient accumulation).
        weight_versions: ``"stash"``: one version per microbatch in flight (PipeDream's weight
            stashing); ``"double"``: two (PipeDream-2BW).
        optimizer_state_multiplier: optimizer state bytes per weight byte.
        round_trip: also bound the pipeline by each stage's round trip: stage s of p admits p - s
            microbatches, so one microbatch every (its and the later stages' times, plus each
            later cut both ways) / (p - s). The engine's 1F1B orders hold exactly that many.
    """

    overlap: bool = False
    allreduce_factor: float = 4.0
    transfer_factor: float = 2.0
    microbatches_per_allreduce: int = 1
    weight_versions: Literal["stash", "double"] = "stash"
    optimizer_state_multiplier: float = 1.0
    round_trip: bool = False

    @classmethod
    def named(cls, name: CostModelName, **options: Any) -> CostModel:
        """The simulator's model (``"simulated"``) or PipeDream's (``"pipedream"``), with ``options`` set.

        ``"simulated"`` charges what the engine runs: a ring all-reduce, 2 (r-1)/r x weights, and
        one activation per direction over a cut (activations and gradients travel on the two
        directions of a full-duplex link), and bounds each stage by its round trip.
        ``"pipedream"`` charges the released optimizer's 4 (r-1)/r x weights and 2 x activation
        on one link.
        """
        if name not in COST_MODELS:
            raise ConfigError("cost_model", name, f"must be one of {', '.join(COST_MODELS)}")
        factors = {"simulated": (2.0, 1.0), "pipedream": (4.0, 2.0)}[name]
        return cls(allreduce_factor=factors[0], transfer_factor=factors[1], round_trip=name == "simulated", **options)

    def allreduce_s_per_byte(self, row: DeviceRow, first: int, replicas: int) -> float:
        """All-reduce seconds per weight byte of a stage on devices ``first .. first+replicas-1``."""
        if replicas <= 1:
            return 0.0
        bandwidth = float(row.ring_bandwidth[first, first + replicas - 1])
        factor = self.allreduce_factor * (replicas - 1) / replicas / self.microbatches_per_allreduce
        return factor / bandwidth

    def stage_time_s(self, compute_s: float, allreduce_s: float, replicas: int) -> float:
        """Time per microbatch of a stage, from its compute and all-reduce seconds."""
        combined = max(compute_s, allreduce_s) if self.overlap else compute_s + allreduce_s
        return combined / replicas

    def versions(self, inflight: int) -> int:
        """Weight versions a device holds with ``inflight`` microbatches in flight."""
        return inflight if self.weight_versions == "stash" else 2

    def memory_bytes(self, param_bytes: float, stash_bytes: float, inflight: int, working_bytes: float = 0.0) -> float:
        """Peak bytes on one device: weights x versions, one gradient buffer, optimizer state, stashes.

        The engine's accounting (pipesim.engine.memory), at its peak: ``versions`` copies of the
        weights, one gradient buffer, ``optimizer_state_multiplier`` x weights, ``inflight``
        microbatches' stashed activations, and the working bytes of the backward that starts
        while they are all held (recomputation's).
        """
        per_weight_byte = self.versions(inflight) + 1 + self.optimizer_state_multiplier
        return param_bytes * per_weight_byte + stash_bytes * inflight + working_bytes


def inflight_microbatches(devices_to_end: int, replicas: int) -> int:
    """Microbatches in flight on each replica of a stage: ceil(devices from it to the pipeline's end / r).

    PipeDream's runtime admits one microbatch per device downstream, dealt round-robin to a
    stage's replicas; for an unreplicated stage s of p this is p - s, as the engine holds.
    """
    return -(-devices_to_end // replicas)


@dataclass(frozen=True)
class StageEstimate:
    """The cost model's view of one stage.

    Attributes:
        start, end: layers ``[start, end)``; replicas: data-parallel replicas.
        first_device: the first of its consecutive devices.
        compute_s: compute of one microbatch on one replica, seconds.
        allreduce_s: the all-reduce charged per microbatch round (before dividing by replicas).
        time_s: the stage's time per microbatch of the pipeline.
        transfer_s: time of the cut after it (0 for the last stage).
        inflight: microbatches in flight per replica; memory_bytes: peak bytes per device.
    """

    start: int
    end: int
    replicas: int
    first_device: int
    compute_s: float
    allreduce_s: float
    time_s: float
    transfer_s: float
    inflight: int
    memory_bytes: float


@dataclass(frozen=True)
class Estimate:
    """The cost model's view of a whole plan.

    Attributes:
        stages: per stage estimates.
        time_s: seconds per microbatch: the slowest stage or cut.
        bottleneck: ``"stage S"`` or ``"transfer S->S+1"``.
        peak_memory_bytes: the most any device needs.
        microbatch_size: samples per microbatch.
    """

    stages: tuple[StageEstimate, ...]
    time_s: float
    bottleneck: str
    peak_memory_bytes: float
    microbatch_size: int

    @property
    def time_per_sample_s(self) -> float:
        """Seconds per sample."""
        return self.time_s / self.microbatch_size

    @property
    def throughput_samples_per_s(self) -> float:
        """Samples per second (``inf`` when nothing costs time)."""
        return self.microbatch_size / self.time_s if self.time_s > 0 else math.inf

    def to_dict(self) -> dict[str, float | str]:
        """The ``predicted`` block of the planner's JSON."""
        return {
            "time_per_sample_s": self.time_per_sample_s,
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "peak_memory_bytes": self.peak_memory_bytes,
            "time_per_microbatch_s": self.time_s,
            "bottleneck": self.bottleneck,
        }


def round_trips_s(stages: Sequence[StageEstimate]) -> list[float]:
    """Per stage s of p: (times of stages s.. plus both directions of every later cut) / (p - s)."""
    trips, total = [], 0.0
    for index in range(len(stages) - 1, -1, -1):
        total += stages[index].time_s + (2 * stages[index].transfer_s if index < len(stages) - 1 else 0.0)
        trips.append(total / (len(stages) - index))
    return trips[::-1]


def estimate(chain: Chain, row: DeviceRow, model: CostModel, stages: Sequence[StageSpec]) -> Estimate:
    """Cost a plan whose stages take consecutive devices ending at the row's last device.

    Raises:
        ConfigError: the stages do not cover the chain in order, or need more devices than the row has.
    """
    used = sum(replicas for _, _, replicas in stages)
    expected = 0
    for start, end, replicas in stages:
        if start != expected or end <= start or replicas < 1:
            raise ConfigError("stages", list(stages), "must be contiguous non-empty layer ranges from 0 with replicas >= 1")
        expected = end
    if expected != chain.num_layers or used > row.num_devices:
        raise ConfigError("stages", list(stages), f"must cover {chain.num_layers} layers on at most "
                          f"{row.num_devices} devices (cover {expected} on {used})")
    first = row.num_devices - used
    results = []
    for start, end, replicas in stages:
        speed = float(row.speed[first:first + replicas].min())
        compute = float(chain.compute_s[end] - chain.compute_s[start]) / speed
        params = float(chain.param_bytes[end] - chain.param_bytes[start])
        allreduce = model.allreduce_s_per_byte(row, first, replicas) * params
        transfer = 0.0
        if end < chain.num_layers:
            bandwidth = float(row.link_bandwidth[first, first + replicas])
            transfer = model.transfer_factor * float(chain.output_bytes[end - 1]) / bandwidth
        inflight = inflight_microbatches(row.num_devices - first, replicas)
        results.append(StageEstimate(
            start=start, end=end, replicas=replicas, first_device=first, compute_s=compute,
            allreduce_s=allreduce, time_s=model.stage_time_s(compute, allreduce, replicas),
            transfer_s=transfer, inflight=inflight,
            memory_bytes=model.memory_bytes(params, chain.stage_stash_bytes(start, end), inflight,
                                            chain.stage_working_bytes(start, end)),
        ))
        first += replicas
    candidates = [(stage.time_s, f"stage {index}") for index, stage in enumerate(results)]
    candidates += [(stage.transfer_s, f"transfer {index}->{index + 1}") for index, stage in enumerate(results[:-1])]
    if model.round_trip:
        candidates += [(round_trip_s, f"round trip from stage {index}")
                       for index, round_trip_s in enumerate(round_trips_s(results))]
    time_s, bottleneck = max(candidates, key=lambda item: item[0])
    return Estimate(
        stages=tuple(results), time_s=time_s, bottleneck=bottleneck,
        peak_memory_bytes=max(stage.memory_bytes for stage in results),
        microbatch_size=chain.microbatch_size,
    )
