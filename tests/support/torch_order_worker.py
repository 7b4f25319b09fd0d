"""One rank of tests/test_torch_executed_order.py: run PyTorch's ScheduleGPipe and Schedule1F1B for real.

Usage: python torch_order_worker.py RANK WORLD PORT P:M[,M...] ... Joins a gloo group of WORLD
processes on 127.0.0.1:PORT (importing torch once), and for each P runs a pipeline of P stages on
the subgroup of ranks 0..P-1: for each schedule and each M, one warm-up step (shape inference
runs the module too) and one recorded step, logging "F" when the stage's module runs forward
and "B" when the gradient of its output arrives. Prints {P: {"gpipe": {M: [...]}, "1f1b": {...}}}
as JSON (only the P this rank takes part in).
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

WIDTH = 4


class Logged(torch.nn.Module):
    """A linear layer that appends "F" to ``log`` on forward and "B" when its output's gradient arrives."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, WIDTH)
        self.log = log

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.log.append("F")
        y = self.linear(x)
        if y.requires_grad:
            y.register_hook(lambda grad: self.log.append("B"))
        return y


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((output - target) ** 2).mean()


def run(rank: int, world: int, group: dist.ProcessGroup, name: str, num_microbatches: int) -> list[str]:
    log: list[str] = []
    stage = PipelineStage(Logged(log), stage_index=rank, num_stages=world, device=torch.device("cpu"), group=group)
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[name]
    schedule = cls(stage, n_microbatches=num_microbatches, loss_fn=loss_fn)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2 * num_microbatches, WIDTH, generator=generator)
    target = torch.randn(2 * num_microbatches, WIDTH, generator=generator)
    for _ in range(2):  # the first step also runs shape inference; the log keeps the second
        log.clear()
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=target, losses=[])
        else:
            schedule.step()
    return list(log)


def main() -> None:
    rank, world, port = (int(arg) for arg in sys.argv[1:4])
    pipelines = {int(p): [int(m) for m in ms.split(",")] for p, ms in (arg.split(":") for arg in sys.argv[4:])}
    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
    result: dict[int, dict[str, dict[int, list[str]]]] = {}
    try:
        for p, microbatches in pipelines.items():
            group = dist.new_group(list(range(p)))  # collective: every rank calls it
            if rank < p:
                result[p] = {name: {m: run(rank, p, group, name, m) for m in microbatches}
                             for name in ("gpipe", "1f1b")}
    finally:
        dist.destroy_process_group()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
