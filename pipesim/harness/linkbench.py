"""Link benchmark: point-to-point ping-pong over the real process group, fitted as latency + bytes/bandwidth;
and the collectives a device calibration times across a node's GPUs (``measure_collectives``).

``measure_links`` spawns one process per rank running pipesim.harness.rank.linkbench_rank: each pair of
neighbouring ranks ping-pongs with the same primitives the runtime uses (a receive posted
ahead, ``isend``, ``wait``), rank 0 writes the one-way medians, and this side fits them.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipesim.errors import ConfigError
from pipesim.harness.config import check_processes
from pipesim.spec.calibration import fit_latency_and_rate
from pipesim.spec.topology import Topology
from pipesim.spec.validation import build

RESULT = "linkbench.json"  # the file rank 0 writes, named on the ranks' command line


@dataclass(frozen=True)
class LinkFit:
    """One directed pair's measurements and fit.

    Attributes:
        src, dst: the ranks.
        sizes_bytes, one_way_s: message sizes and the median one-way times.
        latency_s, bandwidth_bytes_per_s: the fit ``one_way = latency + bytes / bandwidth``.
    """

    src: int
    dst: int
    sizes_bytes: tuple[int, ...]
    one_way_s: tuple[float, ...]
    latency_s: float
    bandwidth_bytes_per_s: float

    def predicted_s(self, num_bytes: float) -> float:
        """The fit at ``num_bytes``."""
        return self.latency_s + num_bytes / self.bandwidth_bytes_per_s


def message_sizes(max_bytes: int) -> list[int]:
    """4 bytes, then x4 steps, up to and including ``max_bytes`` (multiples of 4 bytes)."""
    sizes, size = [], 4
    while size < max_bytes:
        sizes.append(size)
        size *= 4
    sizes.append(max(4, max_bytes // 4 * 4))
    return sorted(set(sizes))


def fit_link(sizes: list[int], times: list[float]) -> tuple[float, float]:
    """Least squares of ``latency + bytes / bandwidth`` on relative error; latency >= 0, bandwidth > 0."""
    x = np.asarray(sizes, dtype=float)
    latency, inverse = fit_latency_and_rate(np.ones_like(x), x, np.asarray(times, dtype=float))
    bandwidth = 1.0 / inverse if inverse > 0 else float("inf")
    return latency, float(bandwidth)


def measure_links(num_ranks: int = 2, *, max_bytes: int = 4 << 20, repeats: int = 30, warmup: int = 5,
                  timeout_s: float = 300.0, backend: str = "gloo") -> tuple[Topology, list[LinkFit]]:
    """Ping-pong every pair of neighbouring ranks on this machine (gloo on CPU tensors, or NCCL on
    one GPU per rank); fit each link.

    Returns:
        a Topology (uniform for two ranks, else pairwise links between neighbours), and the fits.

    Raises:
        ConfigError: ranks outside 2..``MAX_PROCESSES``, a size below 4 bytes, or fewer than one
            repeat; RunFailedError: a rank failed.
    """
    check_processes("ranks", num_ranks, least=2)
    if max_bytes < 4:
        raise ConfigError("max_bytes", max_bytes, "must be >= 4")
    if repeats < 1:
        raise ConfigError("repeats", repeats, "must be >= 1")
    if warmup < 0:
        raise ConfigError("warmup", warmup, "must be >= 0")
    sizes = message_sizes(max_bytes)
    pairs = _run_ranks("linkbench", num_ranks, backend, timeout_s, [json.dumps(sizes), str(repeats), str(warmup)])
    fits = []
    for pair in pairs:
        latency, bandwidth = fit_link(pair["sizes_bytes"], pair["one_way_s"])
        fits.append(LinkFit(pair["src"], pair["dst"], tuple(pair["sizes_bytes"]), tuple(pair["one_way_s"]),
                            latency, bandwidth))
    return topology_of(num_ranks, fits), fits


def measure_collectives(num_ranks: int, *, max_bytes: int = 1 << 28, repeats: int = 10, warmup: int = 3,
                        timeout_s: float = 600.0, backend: str = "nccl") -> dict[str, Any]:
    """Time all-reduce, reduce-scatter and all-gather across ``num_ranks`` ranks on this machine
    (NCCL on one GPU per rank, or gloo on CPU tensors), whole buffers from 4 x ranks x 16 bytes to
    ``max_bytes`` in x4 steps: what ``pipesim.spec.calibration.fit_collectives`` reads.

    Raises:
        ConfigError: ranks outside 2..``MAX_PROCESSES`` or an unknown backend; RunFailedError: a rank failed.
    """
    check_processes("ranks", num_ranks, least=2)
    unit = 4 * num_ranks
    sizes = sorted({max(unit, size // unit * unit) for size in message_sizes(max_bytes) if size >= 16 * unit})
    rows = _run_ranks("collectives", num_ranks, backend, timeout_s, [json.dumps(sizes), str(repeats), str(warmup)])
    return {"schema": "pipesim.collective-measurements/1", "backend": backend, "world_size": num_ranks, **rows}


def _run_ranks(mode: str, num_ranks: int, backend: str, timeout_s: float, args: list[str]) -> Any:
    """pipesim.harness.rank.linkbench_rank in ``mode`` (``linkbench``: ping-pong, ``collectives``) on
    ``num_ranks`` ranks in a folder of its own, removed after: what rank 0 wrote.

    Raises:
        ConfigError: an unknown backend, or one this machine cannot run; RunFailedError: a rank failed.
    """
    from pipesim.harness.launch import check_backend, spawn, wait_all

    if backend not in ("gloo", "nccl"):
        raise ConfigError("backend", backend, "must be gloo or nccl")
    check_backend(backend, "cuda" if backend == "nccl" else "cpu", num_ranks)
    folder = Path(tempfile.mkdtemp(prefix=f"pipesim-{mode}-"))
    try:
        processes = spawn("pipesim.harness.rank.linkbench_rank", [*args, backend, RESULT, mode], num_ranks, folder,
                          threads=1)
        wait_all(processes, folder, mode, timeout_s)
        return json.loads((folder / RESULT).read_text(encoding="utf-8"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def topology_of(num_ranks: int, fits: list[LinkFit]) -> Topology:
    """The Topology of measured links: uniform when there is one link, else one link per pair."""
    if len(fits) == 1:
        return Topology.uniform(num_devices=num_ranks, bandwidth=fits[0].bandwidth_bytes_per_s,
                                latency=fits[0].latency_s)
    devices = [{"name": f"rank{rank}"} for rank in range(num_ranks)]
    links = [{"src": f.src, "dst": f.dst, "bandwidth_bytes_per_s": f.bandwidth_bytes_per_s, "latency_s": f.latency_s}
             for f in fits]
    return build(Topology, {"devices": devices, "links": links})
