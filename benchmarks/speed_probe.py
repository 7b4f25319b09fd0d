"""A probe of the host's speed: the same fixed work on both cores, timed before and after a measurement.

``make bench-variance`` shows that this machine's core speed drifts with no ranks running. A
prediction made from measurements taken seconds before a run cannot see a drift that comes between
them and the run. The probe tells when that happened: two worker processes (one per core, as the two
ranks are), started once, each run the bench-validate MLP stage's forward and backward (1 torch
thread) for a fixed time on request and report the mean thread CPU time of one unit; the ratio of a
probe after the measurement to one before it is the host's drift over the measurement.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from collections.abc import Callable
from typing import Any

PROBE_S = 0.3


def mlp_stage_unit() -> Callable[[], None]:
    """The bench-validate MLP stage's forward and backward (4 x Linear(512)+ReLU, batch 64), as a callable."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(512, 512), nn.ReLU()) for _ in range(4)])
    x = torch.randn(64, 512)

    def unit() -> None:
        model(x).sum().backward()

    return unit


def _serve(commands: Any, results: Any) -> None:
    """A probe process: on each ``seconds`` command, time units for that long and put their mean CPU time."""
    from pipesim.harness.rank.process import configure_process

    configure_process(1)  # 1 torch thread, freed memory kept: as every rank
    unit = mlp_stage_unit()
    for _ in range(20):  # warm-up
        unit()
    results.put(0.0)
    while (seconds := commands.get()) is not None:
        cpus: list[float] = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            cpu = time.thread_time()
            unit()
            cpus.append(time.thread_time() - cpu)
        results.put(statistics.fmean(cpus))


class SpeedProbe:
    """Two probe processes; ``measure()`` gives the mean CPU time of one unit over both."""

    def __init__(self, processes: int = 2) -> None:
        context = mp.get_context("spawn")  # a fresh interpreter: the caller's torch thread pools stay out
        self._commands = [context.Queue() for _ in range(processes)]
        self._results = context.Queue()
        self._workers = [context.Process(target=_serve, args=(commands, self._results), daemon=True)
                         for commands in self._commands]
        for worker in self._workers:
            worker.start()
        for _ in self._workers:
            self._results.get(timeout=120)

    def measure(self, seconds: float = PROBE_S) -> float:
        """Mean thread CPU time of one unit, both processes running at once for ``seconds``."""
        for commands in self._commands:
            commands.put(seconds)
        return statistics.fmean(self._results.get(timeout=60 + 10 * seconds) for _ in self._workers)

    def close(self) -> None:
        """Stop the probe processes."""
        for commands in self._commands:
            commands.put(None)
        for worker in self._workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.kill()

    def __enter__(self) -> SpeedProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
