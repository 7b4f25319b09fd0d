"""One rank of the link benchmark: ping-pong with each neighbour (``linkbench`` as the sixth argument)
or time all-reduce, reduce-scatter and all-gather across every rank (``collectives``); rank 0 writes
the medians to the file named fifth on its command line (in PIPESIM_RUN_DIR)."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable
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


def _timed(operation: Callable[[], object], repeats: int, warmup: int, device: torch.device) -> list[float]:
    """Each repeat's seconds on this rank, started together after a barrier (the device drained)."""
    times = []
    for index in range(warmup + repeats):
        dist.barrier()
        start = time.perf_counter()
        operation()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if index >= warmup:
            times.append(time.perf_counter() - start)
    return times


def _collectives(sizes: list[int], repeats: int, warmup: int, result: Path, device: torch.device) -> None:
    """Per collective and whole-buffer size, the median over repeats of the slowest rank's time."""
    world = dist.get_world_size()
    mine: dict[str, list[list[float]]] = {}
    for size in sizes:
        whole = torch.zeros(size // 4, dtype=torch.float32, device=device)
        part = torch.zeros(size // 4 // world, dtype=torch.float32, device=device)
        for name, operation in (("all_reduce", lambda: dist.all_reduce(whole)),
                                ("reduce_scatter", lambda: dist.reduce_scatter_tensor(part, whole)),
                                ("all_gather", lambda: dist.all_gather_into_tensor(whole, part))):
            mine.setdefault(name, []).append(_timed(operation, repeats, warmup, device))
    gathered: list[dict[str, list[list[float]]]] = [{} for _ in range(world)]
    dist.all_gather_object(gathered, mine)
    if dist.get_rank() == 0:
        from pipesim.harness.rank.device_calibration import machine

        rows = {name: [{"bytes": size, "seconds": statistics.median(max(times) for times in zip(
                    *(ranks[name][index] for ranks in gathered), strict=True))}
                       for index, size in enumerate(sizes)] for name in mine}
        write_text_atomic(result, json.dumps({"machine": machine(device), **rows}) + "\n")


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
    run = _collectives if argv[5:6] == ["collectives"] else _worker
    run(sizes, repeats, warmup, Path(os.environ["PIPESIM_RUN_DIR"]) / result, device)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
