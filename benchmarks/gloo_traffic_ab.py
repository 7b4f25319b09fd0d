"""A/B check: one MLP stage's F+B timed on two gloo ranks while they exchange activation-sized messages, and while idle.

Each rank runs 4 Linear(512)+ReLU layers on a microbatch of 64 (the bench-validate MLP's stage)
in 1 torch thread; rounds alternate an idle block and a busy block (before every F+B an
``irecv`` and an ``isend`` of a 64 x 512 activation to the peer, as a pipeline moves them).
Prints, per rank, the median over rounds of the mean F+B wall and thread CPU time, and busy/idle.
Usage: ``python benchmarks/gloo_traffic_ab.py [NICE]`` (NICE as ``pipesim validate --nice``).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402

from pipesim.harness.launch import free_port  # noqa: E402
from pipesim.harness.priority import raise_priority  # noqa: E402
from pipesim.harness.rank.process import configure_process  # noqa: E402

ROUNDS, ITERATIONS, WARMUP = 8, 40, 3


def worker(rank: int, port: int, results: Any) -> None:
    """One rank: alternate idle and busy blocks; put ``(rank, {mode: [(wall, cpu), ...]})``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    configure_process(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(rank)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(512, 512), nn.ReLU()) for _ in range(4)])
    x = torch.randn(64, 512)
    blocks: dict[str, list[tuple[float, float]]] = {"idle": [], "busy": []}
    for _ in range(ROUNDS):
        for mode in ("idle", "busy"):
            dist.barrier()
            walls: list[float] = []
            cpus: list[float] = []
            pending: list[tuple[Any, torch.Tensor]] = []
            for step in range(ITERATIONS):
                if mode == "busy":
                    buffer, payload = torch.empty(64, 512), x.clone()
                    pending += [(dist.irecv(buffer, src=1 - rank, tag=step), buffer),
                                (dist.isend(payload, dst=1 - rank, tag=step), payload)]
                wall, cpu = time.perf_counter(), time.thread_time()
                model(x).sum().backward()
                walls.append(time.perf_counter() - wall)
                cpus.append(time.thread_time() - cpu)
                if len(pending) > 8:
                    for work, _ in pending[:4]:
                        work.wait()
                    pending = pending[4:]
            for work, _ in pending:
                work.wait()
            blocks[mode].append((statistics.fmean(walls[WARMUP:]), statistics.fmean(cpus[WARMUP:])))
    results.put((rank, blocks))
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    """Run both ranks and print the comparison."""
    raise_priority(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    context = mp.get_context("fork")
    results = context.Queue()
    port = free_port()
    ranks = [context.Process(target=worker, args=(rank, port, results)) for rank in range(2)]
    for process in ranks:
        process.start()
    found = dict(results.get() for _ in ranks)
    for process in ranks:
        process.join()
    for rank, blocks in sorted(found.items()):
        median = {mode: [statistics.median(v[i] for v in blocks[mode]) for i in range(2)] for mode in blocks}
        print(f"rank {rank}: F+B idle {1e3 * median['idle'][0]:.3f} ms (CPU {1e3 * median['idle'][1]:.3f}), busy "
              f"{1e3 * median['busy'][0]:.3f} ms (CPU {1e3 * median['busy'][1]:.3f}); busy/idle wall "
              f"{median['busy'][0] / median['idle'][0]:.3f}, CPU {median['busy'][1] / median['idle'][1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
