"""One rank of the link benchmark: ping-pong with each neighbour; rank 0 writes the one-way medians to the file named last on its command line (in PIPESIM_RUN_DIR)."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from pipesim.harness.rank.process import configure_process
from pipesim.harness.rank.rendezvous import join_process_group
from pipesim.spec.files import write_text_atomic


def _work(work: dist.Work | None) -> dist.Work:
    assert work is not None, "a point-to-point call inside the group returns its work"
    return work


def _ping_pong(peer: int, size: int, repeats: int, warmup: int, leader: bool, device: torch.device) -> list[float]:
    """Round trips of ``size`` bytes with ``peer``; the leader times them, the follower echoes.

    On CUDA (NCCL) the host waits for the device after each round trip, so the time is the
    transfer's, not the launch's.
    """
    ping = torch.zeros(size // 4, dtype=torch.float32, device=device)
    pong = torch.zeros_like(ping)
    times = []
    for index in range(warmup + repeats):
        if leader:
            receive = _work(dist.irecv(pong, src=peer, tag=2 * index + 1))
            start = time.perf_counter()
            _work(dist.isend(ping, dst=peer, tag=2 * index)).wait()
            receive.wait()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append((time.perf_counter() - start) / 2)
        else:
            _work(dist.irecv(pong, src=peer, tag=2 * index)).wait()
            _work(dist.isend(pong, dst=peer, tag=2 * index + 1)).wait()
            if device.type == "cuda":
                torch.cuda.synchronize()
    return times[warmup:]


def _worker(sizes: list[int], repeats: int, warmup: int, result: Path, device: torch.device) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    results = []
    for src in range(world - 1):
        dst = src + 1
        dist.barrier()
        medians = []
        for size in sizes:
            if rank in (src, dst):
                times = _ping_pong(dst if rank == src else src, size, repeats, warmup, rank == src, device)
                medians.append(statistics.median(times) if times else 0.0)
        if rank == src:
            results.append({"src": src, "dst": dst, "sizes_bytes": sizes, "one_way_s": medians})
    gathered: list[list[dict[str, object]]] = [[] for _ in range(world)]
    dist.all_gather_object(gathered, results)
    if rank == 0:
        every = [pair for part in gathered for pair in part]
        write_text_atomic(result, json.dumps(every) + "\n")


def main(argv: list[str]) -> int:
    """One rank of the benchmark (environment as torchrun sets it)."""
    sizes, repeats, warmup, backend, result = json.loads(argv[0]), int(argv[1]), int(argv[2]), argv[3], argv[4]
    configure_process(1)
    rank = int(os.environ["RANK"])
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    join_process_group(backend, rank, int(os.environ["WORLD_SIZE"]), timedelta(seconds=120))
    _worker(sizes, repeats, warmup, Path(os.environ["PIPESIM_RUN_DIR"]) / result, device)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
