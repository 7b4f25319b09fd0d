"""Sends between ranks: the link time of every op's send, and the paths whose bandwidth is shared."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pipesim.spec.topology import Topology

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


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


def transfer_column(
    topology: Topology, devices: tuple[int, ...], stage_to_rank: IntArray, stage: IntArray, is_forward: BoolArray,
    remote: BoolArray, output_bytes: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """Per (stage, direction) entry, its send's link time and how long the send holds the link.

    The link time is ``topology.transfer_s`` (latency + bytes / bandwidth): from leaving to
    arriving. Only the bytes hold the link: latency pipelines, so the next message may leave
    ``bytes / bandwidth`` after this one, as on a real wire. An F sends stage s's output to
    s + 1, a B or I its gradient (the size of stage s-1's output) to s - 1, so stage and
    direction fix both ranks and the bytes.
    """
    transfer = np.zeros(stage.shape[0], dtype=np.float64)
    hold = np.zeros(stage.shape[0], dtype=np.float64)
    senders = np.flatnonzero(remote)
    if senders.size == 0:
        return transfer, hold
    num_stages = output_bytes.shape[0]
    key = stage[senders] * 2 + is_forward[senders]
    present = np.zeros(2 * num_stages, dtype=np.bool_)
    present[key] = True
    times = np.zeros(2 * num_stages, dtype=np.float64)
    holds = np.zeros(2 * num_stages, dtype=np.float64)
    for k in np.flatnonzero(present).tolist():
        s, downstream = divmod(k, 2)
        peer, boundary = (s + 1, s) if downstream else (s - 1, s - 1)
        src, dst, num_bytes = devices[int(stage_to_rank[s])], devices[int(stage_to_rank[peer])], float(output_bytes[boundary])
        times[k], holds[k] = topology.send_s(src, dst, num_bytes)
    transfer[senders], hold[senders] = times[key], holds[key]
    return transfer, hold


def shared_paths(
    topology: Topology, devices: tuple[int, ...], rank: IntArray, send_rank: IntArray, remote: BoolArray,
) -> tuple[dict[tuple[int, int], SharedPath], dict[str, float]]:
    """The rank pairs that carry sends over shared NICs, and those NICs' capacities."""
    if not topology.has_contention:
        return {}, {}
    pairs = np.unique(np.stack([rank[remote], send_rank[remote]], axis=1), axis=0)
    shared: dict[tuple[int, int], SharedPath] = {}
    capacity: dict[str, float] = {}
    for source, target in pairs.tolist():
        src, dst = devices[source], devices[target]
        nics = topology.shared_nics(src, dst)
        latency_s, bandwidth = topology.link_cost(src, dst)
        if nics is not None and math.isfinite(bandwidth):
            shared[(source, target)] = SharedPath(latency_s=latency_s, nics=nics)
            capacity.update(dict.fromkeys(nics, bandwidth))
    return shared, capacity
