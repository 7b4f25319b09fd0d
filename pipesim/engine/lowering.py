"""Lowering a schedule onto costs and devices: per op its duration, inputs, send and version."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pipesim.errors import ConfigError
from pipesim.schedule.deps import backward_kinds, dependencies, sends_to
from pipesim.schedule.ir import Op, OpKind, Schedule, WeightPolicy
from pipesim.schedule.validate import validate
from pipesim.schedule.versions import VersionPlan, assign_versions
from pipesim.spec.stages import StageCosts
from pipesim.spec.topology import Topology

KIND_CODES = {OpKind.F: 0, OpKind.B: 1, OpKind.I: 2, OpKind.W: 3, OpKind.U: 4}


@dataclass(frozen=True)
class LoweredOp:
    """One op ready for an engine.

    Attributes:
        op: the op; kind_code: its index in trace.KINDS.
        duration_s: compute time.
        waits_for: ops of other stages whose output must arrive first.
        send_rank: rank receiving this op's output, or -1.
        send_bytes: bytes sent; transfer_s: link time of the send (0 on the same rank).
        version: weight version used (for U: the version it updates).
        minibatch: the op's step index.
    """

    op: Op
    kind_code: int
    duration_s: float
    waits_for: tuple[Op, ...]
    send_rank: int
    send_bytes: float
    transfer_s: float
    version: int
    minibatch: int


@dataclass(frozen=True)
class SharedPath:
    """A rank-to-rank path whose bandwidth is shared with other flows (DES engine only).

    Attributes:
        latency_s: fixed cost of every transfer on it, seconds.
        nics: the NICs it crosses (``Topology.shared_nics``); each NIC's bandwidth is split
            max-min fairly among the flows crossing it at any moment.
    """

    latency_s: float
    nics: tuple[str, ...]


@dataclass(frozen=True)
class Program:
    """A schedule lowered for the engines: per rank, its LoweredOps in order, plus sizes for memory.

    Attributes:
        schedule: the schedule; costs: its stage costs; rank_devices: topology device per rank.
        ranks: per rank, the lowered ops.
        versions: the VersionPlan of the schedule.
        keeps_versions: True when old versions outlive an update (STASH, DOUBLE_BUFFER).
        meta: what the Trace records about the run.
        shared_paths: per (src_rank, dst_rank) whose path crosses shared NICs, its SharedPath;
            empty when every path is dedicated.
        nic_bandwidth_bytes_per_s: capacity of every NIC named in ``shared_paths``.
    """

    schedule: Schedule
    costs: StageCosts
    rank_devices: tuple[int, ...]
    ranks: tuple[tuple[LoweredOp, ...], ...]
    versions: VersionPlan
    keeps_versions: bool
    meta: dict[str, Any]
    shared_paths: dict[tuple[int, int], SharedPath] = field(default_factory=dict)
    nic_bandwidth_bytes_per_s: dict[str, float] = field(default_factory=dict)

    @property
    def has_contention(self) -> bool:
        """True when some sends share bandwidth: only the DES engine can run this Program; an
        engine without a contention model (the analytic one) must refuse it."""
        return bool(self.shared_paths)


def split_evenly(costs: StageCosts) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """I and W times for a profile without a measured split: half the backward each (the
    zero-bubble paper counts equal FLOPs for the two), the recomputed forward going to I."""
    recompute = costs.recompute_s or tuple(0.0 for _ in costs.backward_s)
    halves = tuple((b - r) / 2 for b, r in zip(costs.backward_s, recompute, strict=True))
    return tuple(h + r for h, r in zip(halves, recompute, strict=True)), halves


def lower(
    schedule: Schedule,
    costs: StageCosts,
    topology: Topology,
    *,
    rank_devices: tuple[int, ...] | None = None,
    microbatch_size: int = 1,
    optimizer_state_multiplier: float = 1.0,
    check: bool = True,
) -> Program:
    """Attach costs, transfers and versions to every op of ``schedule``.

    Raises:
        ConfigError: stage counts of schedule and costs differ, or too few devices.
        ScheduleError: the schedule is invalid (when ``check``) or its versions cannot be assigned.
    """
    if costs.num_stages != schedule.num_stages:
        raise ConfigError(
            "num_stages", schedule.num_stages, f"schedule and stage costs disagree "
            f"(schedule: {schedule.num_stages}, costs: {costs.num_stages})",
        )
    devices = rank_devices or tuple(range(schedule.num_ranks))
    if len(devices) != schedule.num_ranks or max(devices) >= topology.num_devices:
        raise ConfigError(
            "devices", topology.num_devices,
            f"the topology must have a device for each of the {schedule.num_ranks} ranks",
        )
    if check:
        validate(schedule)
    versions = assign_versions(schedule)
    grad_kind = backward_kinds(schedule)
    p = schedule.num_stages
    duration_by_kind = {
        OpKind.F: costs.forward_s,
        OpKind.B: costs.backward_s,
        OpKind.I: costs.backward_input_s or split_evenly(costs)[0],
        OpKind.W: costs.backward_weight_s or split_evenly(costs)[1],
        OpKind.U: costs.update_s,
    }
    shared_paths: dict[tuple[int, int], SharedPath] = {}
    nic_bandwidth: dict[str, float] = {}
    ranks = []
    for rank_index, ops in enumerate(schedule.ranks):
        lowered: list[LoweredOp] = []
        for op in ops:
            waits = tuple(
                dep for dep in dependencies(op, p, grad_kind) if dep.stage != op.stage
            )
            target = sends_to(op, p, grad_kind)
            send_rank, send_bytes, transfer_s = -1, 0.0, 0.0
            if target is not None:
                send_rank = schedule.stage_to_rank[target]
                boundary = op.stage if op.kind is OpKind.F else target
                send_bytes = costs.output_bytes[boundary]
                transfer_s = topology.transfer_s(devices[rank_index], devices[send_rank], send_bytes)
                nics = topology.shared_nics(devices[rank_index], devices[send_rank])
                latency_s, bandwidth = topology.link_cost(devices[rank_index], devices[send_rank])
                if nics is not None and math.isfinite(bandwidth):
                    shared_paths[(rank_index, send_rank)] = SharedPath(latency_s=latency_s, nics=nics)
                    nic_bandwidth.update(dict.fromkeys(nics, bandwidth))
            if op.kind is OpKind.U:
                # An update belongs to the minibatch of the backward just before it.
                minibatch = lowered[-1].minibatch if lowered else 0
            else:
                minibatch = schedule.minibatch_of(op.microbatch)
            lowered.append(LoweredOp(
                op=op,
                kind_code=KIND_CODES[op.kind],
                duration_s=duration_by_kind[op.kind][op.stage],
                waits_for=waits,
                send_rank=send_rank,
                send_bytes=send_bytes,
                transfer_s=transfer_s,
                version=versions.version_of[op],
                minibatch=minibatch,
            ))
        ranks.append(tuple(lowered))
    meta = {
        "schedule": schedule.name,
        "weights": schedule.weights.value,
        "num_stages": p,
        "num_microbatches": schedule.num_microbatches,
        "num_minibatches": schedule.num_minibatches,
        "num_ranks": schedule.num_ranks,
        "stage_to_rank": list(schedule.stage_to_rank),
        "rank_devices": list(devices),
        "microbatch_size": microbatch_size,
        "param_bytes": list(costs.param_bytes),
        "stash_bytes": list(costs.stash_bytes),
        "optimizer_state_multiplier": optimizer_state_multiplier,
        "device_memory_bytes": [
            None if math.isinf(topology.devices[d].memory_bytes) else topology.devices[d].memory_bytes
            for d in devices
        ],
    }
    return Program(
        schedule=schedule,
        costs=costs,
        rank_devices=devices,
        ranks=tuple(ranks),
        versions=versions,
        keeps_versions=schedule.weights in (WeightPolicy.STASH, WeightPolicy.DOUBLE_BUFFER),
        meta=meta,
        shared_paths=shared_paths,
        nic_bandwidth_bytes_per_s=nic_bandwidth,
    )
