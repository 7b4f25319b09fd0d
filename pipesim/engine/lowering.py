"""Lowering a schedule onto costs and devices: per op its duration, input, send and version, by column."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from pipesim.engine.columns import (
    minibatch_column,
    schedule_columns,
    send_target_column,
    version_column,
    wait_column,
)
from pipesim.engine.run_info import RunInfo
from pipesim.engine.transfers import SharedPath, shared_paths, transfer_column
from pipesim.errors import ConfigError
from pipesim.schedule.columnar import ColumnarOrder
from pipesim.schedule.ir import B_CODE, F_CODE, KIND_CODES, KIND_ORDER, U_CODE, Op, OpKind, Schedule, WeightPolicy
from pipesim.schedule.validate import validate
from pipesim.schedule.versions import VersionPlan, assign_versions
from pipesim.spec.stages import StageCosts
from pipesim.spec.topology import Topology

__all__ = ["KIND_CODES", "LoweredOp", "OpTable", "Program", "SharedPath", "lower", "lower_columnar", "split_evenly"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class LoweredOp:
    """One op ready for an engine (the row view of an OpTable, kept for readers of single ops).

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


@dataclass(frozen=True, eq=False)
class OpTable:
    """Every op of a program by column: ranks one after another, each rank's ops in its order.

    Op ``g`` is op ``position[g]`` of rank ``rank[g]``; rank ``r`` holds the slice
    ``rank_offsets[r]:rank_offsets[r + 1]``. Both engines read this table.

    Attributes:
        kind: code into trace.KINDS; microbatch: the update index for U.
        minibatch: step index; version: weight version used (for U: the version it updates).
        duration_s: compute time, seconds.
        wait: index of the op of another stage whose output must arrive first, or -1 (an
            op waits for at most one such input: see ``schedule.deps.dependencies``).
        send_rank: rank receiving the op's output, or -1; send_bytes: its size.
        transfer_s: link time of the send, seconds (0 on the same rank).
    """

    rank_offsets: IntArray
    rank: IntArray
    position: IntArray
    stage: IntArray
    kind: IntArray
    microbatch: IntArray
    minibatch: IntArray
    version: IntArray
    duration_s: FloatArray
    wait: IntArray
    send_rank: IntArray
    send_bytes: FloatArray
    transfer_s: FloatArray

    @property
    def num_ops(self) -> int:
        """Number of ops."""
        return int(self.rank.shape[0])

    @property
    def num_ranks(self) -> int:
        """Number of ranks."""
        return int(self.rank_offsets.shape[0]) - 1

    @cached_property
    def is_remote_send(self) -> npt.NDArray[np.bool_]:
        """True where the op's output crosses a link to another rank (a send span)."""
        remote: npt.NDArray[np.bool_] = (self.send_rank >= 0) & (self.send_rank != self.rank)
        return remote

    @cached_property
    def link(self) -> IntArray:
        """Per op, the index of the directed link (rank -> send_rank) its send uses, or -1."""
        remote = self.is_remote_send
        key = np.where(remote, self.rank * max(self.num_ranks, 1) + self.send_rank, -1)
        _, index = np.unique(key, return_inverse=True)
        has_none = not bool(remote.all())
        return np.where(remote, index.reshape(-1) - int(has_none), -1)

    @cached_property
    def previous_send(self) -> IntArray:
        """Per op with a remote send, the op whose send precedes it on the same link, or -1.

        A rank issues its sends in its op order, so this is the link's first-in first-out order.
        """
        previous = np.full(self.num_ops, -1, dtype=np.int64)
        senders = np.flatnonzero(self.is_remote_send)
        if senders.size:
            links = self.link[senders]
            order = np.argsort(links, kind="stable")
            ordered = senders[order]
            same = links[order][1:] == links[order][:-1]
            previous[ordered[1:][same]] = ordered[:-1][same]
        return previous


@dataclass(frozen=True, eq=False)
class Program:
    """A schedule lowered for the engines: its ops by column, plus sizes for memory.

    Attributes:
        schedule: the schedule; costs: its stage costs; rank_devices: topology device per rank.
        ops: the OpTable both engines run.
        keeps_versions: True when old versions outlive an update (STASH, DOUBLE_BUFFER).
        info: what the Trace records about the run (no engine yet).
        has_link_contention: True when sends of different links share bandwidth: some rank
            pair's path crosses shared NICs (``shared_paths`` is not empty). Only the DES
            engine models that; the analytic engine applies only where it is False.
        shared_paths: per (src_rank, dst_rank) whose path crosses shared NICs, its SharedPath;
            empty when every path is dedicated.
        nic_bandwidth_bytes_per_s: capacity of every NIC named in ``shared_paths``.
        derived: for a program lowered from a columnar order, the order's ``derived`` dict,
            shared by every program lowered from it (None otherwise): values that depend on the
            order alone, such as the Trace's span columns other than times and bytes.
    """

    schedule: Schedule
    costs: StageCosts
    rank_devices: tuple[int, ...]
    ops: OpTable
    keeps_versions: bool
    info: RunInfo
    has_link_contention: bool = field(default=False)
    shared_paths: dict[tuple[int, int], SharedPath] = field(default_factory=dict)
    nic_bandwidth_bytes_per_s: dict[str, float] = field(default_factory=dict)
    derived: dict[str, Any] | None = field(default=None)

    @cached_property
    def versions(self) -> VersionPlan:
        """The schedule's VersionPlan (per-op dicts; built on first use)."""
        return assign_versions(self.schedule)

    @cached_property
    def ranks(self) -> tuple[tuple[LoweredOp, ...], ...]:
        """Per rank, its ops as LoweredOp rows (built on first use from the table)."""
        t = self.ops
        flat = [op for ops in self.schedule.ranks for op in ops]
        rows = zip(flat, t.kind.tolist(), t.duration_s.tolist(), t.wait.tolist(), t.send_rank.tolist(),
                   t.send_bytes.tolist(), t.transfer_s.tolist(), t.version.tolist(), t.minibatch.tolist(),
                   strict=True)
        lowered = [
            LoweredOp(op=op, kind_code=kind, duration_s=duration, waits_for=(flat[wait],) if wait >= 0 else (),
                      send_rank=send_rank, send_bytes=send_bytes, transfer_s=transfer_s, version=version,
                      minibatch=minibatch)
            for op, kind, duration, wait, send_rank, send_bytes, transfer_s, version, minibatch in rows
        ]
        offsets = t.rank_offsets.tolist()
        return tuple(tuple(lowered[offsets[r]:offsets[r + 1]]) for r in range(t.num_ranks))


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

    A schedule that splits backward (I/W ops) on a profile without a measured split runs I
    and W with half the backward each (``split_evenly``).

    Raises:
        ConfigError: stage counts of schedule and costs differ, too few devices, or a
            duration that is not finite.
        ScheduleError: the schedule is invalid (when ``check``) or its versions cannot be assigned.
    """
    devices = _devices(schedule, costs, topology, rank_devices)
    if check:
        validate(schedule)
    columns = schedule_columns(schedule)
    minibatch = minibatch_column(schedule, columns)
    version = version_column(schedule, columns, minibatch)
    wait = wait_column(schedule, columns)
    p = schedule.num_stages
    halves = split_evenly(costs) if costs.backward_input_s is None or costs.backward_weight_s is None else None
    durations_by_kind = {
        OpKind.F: costs.forward_s,
        OpKind.B: costs.backward_s,
        OpKind.I: costs.backward_input_s if halves is None else halves[0],
        OpKind.W: costs.backward_weight_s if halves is None else halves[1],
        OpKind.U: costs.update_s,
    }
    table = np.array([durations_by_kind[kind] for kind in KIND_ORDER], dtype=np.float64).reshape(len(KIND_ORDER), p)
    duration = table[columns.kind, columns.stage]
    target = send_target_column(schedule, columns)
    sends = target >= 0
    stage_to_rank = np.asarray(schedule.stage_to_rank, dtype=np.int64)
    send_rank = np.where(sends, stage_to_rank[np.maximum(target, 0)], -1)
    is_forward = columns.kind == F_CODE
    boundary = np.where(is_forward, columns.stage, target)
    output_bytes = np.asarray(costs.output_bytes, dtype=np.float64)
    send_bytes = np.where(sends, output_bytes[np.maximum(boundary, 0)], 0.0)
    remote = sends & (send_rank != columns.rank)
    transfer = transfer_column(topology, devices, stage_to_rank, columns.stage, is_forward, remote, output_bytes)
    _check_finite(duration, transfer)
    ops = OpTable(
        rank_offsets=columns.rank_offsets, rank=columns.rank, position=columns.position, stage=columns.stage,
        kind=columns.kind, microbatch=columns.microbatch, minibatch=minibatch, version=version,
        duration_s=duration, wait=wait, send_rank=send_rank, send_bytes=send_bytes, transfer_s=transfer,
    )
    ops.__dict__["is_remote_send"] = remote  # the cached property, already known
    return _program(schedule, costs, topology, devices, ops, microbatch_size=microbatch_size,
                    optimizer_state_multiplier=optimizer_state_multiplier)


def lower_columnar(
    order: ColumnarOrder,
    costs: StageCosts,
    topology: Topology,
    *,
    rank_devices: tuple[int, ...] | None = None,
    microbatch_size: int = 1,
    optimizer_state_multiplier: float = 1.0,
) -> Program:
    """``lower`` for a schedule generated as columns (``schedule.columnar``): the same Program,
    column for column, without reading Op objects (``Program.schedule`` builds them when read).

    Every stage runs F, B and U only; F(s, i) sends stage s's output to s + 1 and B(s, i) the
    gradient of stage s-1's output to s - 1, so each column is written through the order's
    per-(stage, microbatch) indices from per-stage values.

    Raises:
        ConfigError: as ``lower``.
    """
    schedule = order.schedule
    devices = _devices(schedule, costs, topology, rank_devices)
    p, length = schedule.num_stages, order.ops_per_rank
    # Every column is a gather from a small table through the order's cached indices (the
    # same values, wherever they land, as writing per-stage values through forward_at etc.).
    durations = np.zeros((p, len(KIND_ORDER)), dtype=np.float64)
    for code, values in ((F_CODE, costs.forward_s), (B_CODE, costs.backward_s), (U_CODE, costs.update_s)):
        durations[:, code] = values
    duration = durations.ravel().take(order.stage_kind)
    # Links: F of stage s < p-1 sends to s + 1, B of s > 0 to s - 1, each with stage s's output (or
    # its gradient) of ``output_bytes[boundary]``; the last entry is the ops that send nothing.
    boundaries = np.arange(p - 1, dtype=np.int64)
    output_bytes = np.asarray(costs.output_bytes, dtype=np.float64)[:-1]
    link_bytes = np.concatenate([output_bytes, output_bytes, [0.0]])
    link_rank = np.concatenate([boundaries + 1, boundaries, [-1]])
    link_s = np.array([
        topology.transfer_s(devices[s], devices[s + step], float(costs.output_bytes[min(s, s + step)]))
        for step, first in ((1, 0), (-1, 1)) for s in range(first, first + p - 1)
    ] + [0.0], dtype=np.float64)
    link = order.send_link
    send_rank = link_rank.take(link)
    send_bytes = link_bytes.take(link)
    transfer = link_s.take(link)
    remote = link < 2 * (p - 1)
    # Every value above lands in its column (every stage runs F, B and U; every boundary
    # carries sends both ways), so the columns are finite when these are.
    if not (np.isfinite(durations).all() and np.isfinite(link_s).all()):
        _check_finite(duration, transfer)  # raises, naming the first op's value
    ops = OpTable(
        rank_offsets=np.arange(p + 1, dtype=np.int64) * length,
        rank=order.stage,  # rank r runs stage r: one (read-only) array
        position=order.position,
        stage=order.stage,
        kind=order.kind,
        microbatch=order.microbatch,
        minibatch=order.minibatch,
        version=order.version,
        duration_s=duration,
        wait=order.wait,
        send_rank=send_rank,
        send_bytes=send_bytes,
        transfer_s=transfer,
    )
    # The cached properties the order already gives (each rank's sends over a link run in
    # microbatch order).
    ops.__dict__["is_remote_send"] = remote
    ops.__dict__["previous_send"] = order.previous_send
    return _program(schedule, costs, topology, devices, ops, microbatch_size=microbatch_size,
                    optimizer_state_multiplier=optimizer_state_multiplier, derived=order.derived)


def _devices(schedule: Schedule, costs: StageCosts, topology: Topology,
             rank_devices: tuple[int, ...] | None) -> tuple[int, ...]:
    """The device of every rank, after checking costs and topology fit the schedule."""
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
    return devices


def _check_finite(duration: FloatArray, transfer: FloatArray) -> None:
    for name, values in (("duration_s", duration), ("transfer_s", transfer)):
        if not np.isfinite(values).all():
            raise ConfigError(name, float(values[~np.isfinite(values)][0]), "every op's time must be finite")


def _program(
    schedule: Schedule, costs: StageCosts, topology: Topology, devices: tuple[int, ...], ops: OpTable, *,
    microbatch_size: int, optimizer_state_multiplier: float, derived: dict[str, Any] | None = None,
) -> Program:
    """The Program around an OpTable: sizes for memory, the run's info, shared paths."""
    paths, nic_bandwidth = shared_paths(topology, devices, ops.rank, ops.send_rank, ops.is_remote_send)
    info = RunInfo.of(
        schedule,
        rank_devices=tuple(devices),
        microbatch_size=microbatch_size,
        param_bytes=tuple(costs.param_bytes),
        stash_bytes=tuple(costs.stash_bytes),
        optimizer_state_multiplier=optimizer_state_multiplier,
        device_memory_bytes=tuple(
            None if math.isinf(topology.devices[d].memory_bytes) else topology.devices[d].memory_bytes
            for d in devices
        ),
    )
    return Program(
        schedule=schedule,
        costs=costs,
        rank_devices=devices,
        ops=ops,
        keeps_versions=schedule.weights in (WeightPolicy.STASH, WeightPolicy.DOUBLE_BUFFER),
        info=info,
        has_link_contention=bool(paths),
        shared_paths=paths,
        nic_bandwidth_bytes_per_s=nic_bandwidth,
        derived=derived,
    )
