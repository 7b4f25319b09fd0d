"""The rank's links: a receive says whether its wait blocked, which gloo cannot say before the wait."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

torch = pytest.importorskip("torch")

from pipesim.harness.launch import free_port  # noqa: E402
from pipesim.harness.rank.p2p import Incoming, Links  # noqa: E402


HELD = 5  # messages that have arrived long before the rank asks for them


def _rank(rank: int, port: int, results: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    window = HELD + 1
    if rank == 0:
        links = Links(0, [], torch.float32, torch.device("cpu"), window=window, now=time.perf_counter)
        for tag in range(1, HELD + 1):  # at once: long there when rank 1 asks for them
            links.send(torch.ones(1024), 1, tag=tag)
        time.sleep(0.2)
        links.send(torch.ones(1024), 1, tag=HELD + 1)  # while rank 1 already waits for it
        links.finish()
    else:
        incoming = [Incoming(i, 0, tag, (1024,)) for i, tag in enumerate(range(1, HELD + 2))]
        links = Links(1, incoming, torch.float32, torch.device("cpu"), window=window, now=time.perf_counter)
        time.sleep(0.1)
        got = [links.receive(0, tag) for tag in range(1, HELD + 2)]
        results.put(([blocked for _, _, blocked in got], [float(tensor.sum()) for tensor, _, _ in got]))
    dist.destroy_process_group()


def test_a_receive_blocks_only_for_a_message_that_has_not_arrived() -> None:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    ranks = [context.Process(target=_rank, args=(rank, port, results)) for rank in (0, 1)]
    for process in ranks:
        process.start()
    blocked, sums = results.get(timeout=120)
    for process in ranks:
        process.join(timeout=60)
    assert sums == [1024.0] * (HELD + 1)
    assert blocked[-1], "the receive that waited 0.1 s for its message must say it blocked"
    # A wait on a message already there returns within microseconds; the host may preempt one of
    # them (a busy host, the process's first wait), not most.
    assert sum(not b for b in blocked[:-1]) >= HELD - 1, blocked
