"""The rank's links: a receive says whether its wait blocked, which gloo cannot say before the wait."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

torch = pytest.importorskip("torch")

from pipesim.harness.launch import free_port  # noqa: E402
from pipesim.harness.rank.p2p import Incoming, Links  # noqa: E402


def _rank(rank: int, port: int, results: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    if rank == 0:
        links = Links(0, [], torch.float32, torch.device("cpu"), window=2, now=time.perf_counter)
        links.send(torch.ones(1024), 1, tag=1)  # at once: long there when rank 1 asks for it
        time.sleep(0.2)
        links.send(torch.ones(1024), 1, tag=2)  # while rank 1 already waits for it
        links.finish()
    else:
        incoming = [Incoming(0, 0, 1, (1024,)), Incoming(1, 0, 2, (1024,))]
        links = Links(1, incoming, torch.float32, torch.device("cpu"), window=2, now=time.perf_counter)
        time.sleep(0.1)
        first = links.receive(0, 1)
        second = links.receive(0, 2)
        results.put((first[2], second[2], float(first[0].sum()), float(second[0].sum())))
    dist.destroy_process_group()


def test_a_receive_blocks_only_for_a_message_that_has_not_arrived() -> None:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    ranks = [context.Process(target=_rank, args=(rank, port, results)) for rank in (0, 1)]
    for process in ranks:
        process.start()
    got = results.get(timeout=120)
    for process in ranks:
        process.join(timeout=60)
    assert got == (False, True, 1024.0, 1024.0)
