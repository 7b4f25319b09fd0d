"""Lowering a schedule onto costs and devices: per op its duration, input, send and version, by column."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from pipesim.engine.chunks import ChunkModel, PipemareModel, overlap_chunks
from pipesim.engine.run_info import RunInfo
from pipesim.engine.transfers import SharedPath, shared_paths, transfer_column
from pipesim.errors import ConfigError
from pipesim.schedule.ir import B_CODE, F_CODE, I_CODE, KIND_CODES, KIND_ORDER, Op, OpKind, Schedule, WeightPolicy, \
    read_only
from pipesim.schedule.validate import validate
from pipesim.schedule.versions import VersionPlan, assign_versions
from pipesim.spec.stages import StageCosts
from pipesim.spec.topology import Topology

__all__ = ["KIND_CODES", "LoweredOp", "OpTable", "Program", "SharedPath", "lower", "split_evenly"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


# The kinds whose output may go to another stage (W and U keep theirs).
SENDING_KINDS = [F_CODE, B_CODE, I_CODE]


@dataclass(frozen=True)
class LoweredOp:
    """One op ready for an engine (the row view of an OpTable, kept for readers of single ops).

    Attributes:
        op: the op; kind_code: its index in trace.KINDS.
        duration_s: compute time.
        waits_for: ops of other stages whose output must arrive first.
        send_rank: rank receiving this op's output, or -1.
        send_bytes: bytes sent; transfer_s: link time of the send (0 on the same rank).
        link_hold_s: how long the send holds its link (bytes / bandwidth: latency pipelines).
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
    link_hold_s: float
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
        chunk_wait: for the F that opens an overlapped F&B chunk (``engine.chunks``), the
            input its B waits for, which the chunk waits for too; -1 elsewhere.
        send_rank: rank receiving the op's output, or -1.
        send_link: the path the op's output leaves by (``Schedule.send_link``: its stage and
            direction; one more for ops that send nothing); the four tables below are per path.
        pair_by_link: the directed rank pair a path crosses (``SendLinks.pair``), or -1;
        bytes_by_link: the size of a send; transfer_by_link_s: its link time, seconds, from
            leaving to arriving (0 on the same rank); hold_by_link_s: how long it holds its link,
            seconds: its bytes / bandwidth. Latency pipelines (the next send on the link may leave
            before this one arrives). ``send_bytes``, ``transfer_s`` and ``link_hold_s`` give them per op.
        is_remote_send: True where the op's output crosses a link to another rank (a send span).
        shortest_send_s: at most the shortest ``duration_s`` of an op with a remote send (inf:
            none): the shortest F, B or I time of any stage (the kinds that send), or the ops'
            own times where overlapped chunks changed them.
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
    chunk_wait: IntArray
    send_rank: IntArray
    send_link: IntArray
    pair_by_link: IntArray
    bytes_by_link: FloatArray
    transfer_by_link_s: FloatArray
    hold_by_link_s: FloatArray
    is_remote_send: BoolArray
    shortest_send_s: float

    @property
    def num_ops(self) -> int:
        """Number of ops."""
        return int(self.rank.shape[0])

    @property
    def num_ranks(self) -> int:
        """Number of ranks."""
        return int(self.rank_offsets.shape[0]) - 1

    @cached_property
    def send_bytes(self) -> FloatArray:
        """Per op, the bytes it sends (0 where it sends nothing to another stage)."""
        return read_only(self.bytes_by_link.take(self.send_link))

    @cached_property
    def transfer_s(self) -> FloatArray:
        """Per op, the link time of its send, seconds (0 on the same rank or with no send)."""
        return read_only(self.transfer_by_link_s.take(self.send_link))

    @cached_property
    def link_hold_s(self) -> FloatArray:
        """Per op, how long its send holds its link, seconds."""
        return read_only(self.hold_by_link_s.take(self.send_link))

    @cached_property
    def send_row(self) -> IntArray:
        """Per op, the Trace row of its send span, or -1 (no send to another rank): the compute
        spans come first, one per op, then one send span per op with a remote send, in op order."""
        n = self.num_ops
        senders = np.flatnonzero(self.is_remote_send)
        row = np.full(n, -1, dtype=np.int64)
        row[senders] = np.arange(n, n + senders.size, dtype=np.int64)
        return read_only(row)

    @cached_property
    def link(self) -> IntArray:
        """Per op, the index of the directed link (rank -> send_rank) its send uses, or -1;
        links are numbered in order of (rank, send_rank) (``pair_by_link``, by the op's path)."""
        return read_only(self.pair_by_link.take(self.send_link))


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
        derived: the schedule's ``derived`` dict, shared by every program lowered from it:
            values that depend on the order alone, such as the Trace's span columns other
            than times and bytes.
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
    derived: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def versions(self) -> VersionPlan:
        """The schedule's VersionPlan (per-op dicts; built on first use)."""
        return assign_versions(self.schedule)

    @cached_property
    def ranks(self) -> tuple[tuple[LoweredOp, ...], ...]:
        """Per rank, its ops as LoweredOp rows (built on first use from the table)."""
        t = self.ops
        flat = [op for ops in self.schedule.ranks for op in ops]
        rows = zip(flat, t.kind.tolist(), t.duration_s.tolist(), t.wait.tolist(), t.chunk_wait.tolist(),
                   t.send_rank.tolist(),
                   t.send_bytes.tolist(), t.transfer_s.tolist(), t.link_hold_s.tolist(), t.version.tolist(),
                   t.minibatch.tolist(), strict=True)
        lowered = [
            LoweredOp(op=op, kind_code=kind, duration_s=duration,
                      waits_for=tuple(flat[w] for w in (wait, chunk_wait) if w >= 0),
                      send_rank=send_rank, send_bytes=send_bytes, transfer_s=transfer_s, link_hold_s=link_hold_s,
                      version=version, minibatch=minibatch)
            for op, kind, duration, wait, chunk_wait, send_rank, send_bytes, transfer_s, link_hold_s, version, minibatch in rows
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
    fb_chunks: ChunkModel = "dualpipe",
    fb_overlap: float = 0.0,
    pipemare_model: PipemareModel = "1f1b",
) -> Program:
    """Attach costs, transfers and versions to every op of ``schedule``.

    A schedule that splits backward (I/W ops) on a profile without a measured split runs I
    and W with half the backward each (``split_evenly``). DualPipeV's paired F and B run as
    overlapped chunks (``fb_chunks="dualpipe"``, taking F + B - ``fb_overlap`` x min(F, B)) or
    one after the other as torch's runtime does (``"torch"``); with ``pipemare_model="paper"``
    a pipemare schedule's paired F and B run as one time step of max(F, B) (``engine.chunks``).

    Raises:
        ConfigError: stage counts of schedule and costs differ, too few devices, or a
            duration that is not finite.
        ScheduleError: the schedule is invalid (when ``check``) or its versions cannot be assigned.
    """
    devices = _devices(schedule, costs, topology, rank_devices)
    if check:
        validate(schedule)
    columns = schedule.table
    minibatch, version, wait = schedule.minibatch, schedule.version, schedule.wait
    measured = costs.backward_input_s is not None and costs.backward_weight_s is not None
    halves = None if measured else split_evenly(costs)
    durations_by_kind = {
        OpKind.F: costs.forward_s,
        OpKind.B: costs.backward_s,
        OpKind.I: costs.backward_input_s if halves is None else halves[0],
        OpKind.W: costs.backward_weight_s if halves is None else halves[1],
        OpKind.U: costs.update_s,
    }
    by_stage_kind = np.array([durations_by_kind[kind] for kind in KIND_ORDER], dtype=np.float64).T
    duration = by_stage_kind.ravel().take(schedule.stage_kind)
    # Every send value is a function of the send's link: computed per link, then gathered.
    links = schedule.send_links
    stage_to_rank = np.asarray(schedule.stage_to_rank, dtype=np.int64)
    output_bytes = np.asarray(costs.output_bytes, dtype=np.float64)
    link_bytes = np.where(links.boundary >= 0, output_bytes[links.boundary], 0.0)
    link_s, hold_s = transfer_column(topology, devices, stage_to_rank, links.stage, links.is_forward, links.is_remote,
                             output_bytes)
    send_link = schedule.send_link
    lowered = duration
    duration, chunk_wait = overlap_chunks(schedule, duration, wait, model=fb_chunks, fb_overlap=fb_overlap,
                                          pipemare_model=pipemare_model)
    if not (np.isfinite(by_stage_kind).all() and np.isfinite(link_s).all()):
        _check_finite(duration, link_s.take(send_link))  # the ops gather from these tables: name an op's value
    ops = OpTable(
        rank_offsets=columns.rank_offsets, rank=columns.rank, position=columns.position, stage=columns.stage,
        kind=columns.kind, microbatch=columns.microbatch, minibatch=minibatch, version=version,
        duration_s=duration, wait=wait, chunk_wait=chunk_wait, send_rank=schedule.send_rank, send_link=send_link,
        pair_by_link=read_only(links.pair),
        bytes_by_link=read_only(link_bytes), transfer_by_link_s=read_only(link_s), hold_by_link_s=read_only(hold_s),
        is_remote_send=schedule.is_remote_send,
        shortest_send_s=float((by_stage_kind[:, SENDING_KINDS] if duration is lowered else
                               duration[schedule.is_remote_send]).min(initial=np.inf)),
    )
    return _program(schedule, costs, topology, devices, ops, microbatch_size=microbatch_size,
                    optimizer_state_multiplier=optimizer_state_multiplier)


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
    microbatch_size: int, optimizer_state_multiplier: float,
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
        derived=schedule.derived,
    )
