"""What a sweep's Dask worker does: simulate a batch, write its chunk where it sees the output, report back.

A worker that reads this run's token in ``OUT.parts/manifest.json`` (``parts.writer_of``: the
same folder, on this host or a shared file system) writes the batch's chunk itself; one that
cannot leaves it to the sweep. Either way the batch's rows come back once, as the chunk's Arrow
table, which the final merge takes from memory: a chunk is written once and never read back
(except after an interruption, by ``--resume``).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipesim.sweep.points import COLUMNS, PointRunner
from pipesim.sweep.parts import chunk_path, chunk_table, write_chunk, write_reason, writer_of


@dataclass(frozen=True)
class BatchDone:
    """A batch a worker finished.

    Attributes:
        points: its points' numbers, in the order run.
        table: its rows as the chunk's Arrow table (``parts.chunk_table``); None once recorded.
        chunk: the chunk the worker wrote ("" when it did not: the sweep writes ``table``).
        write_error: why the worker's write failed, as ``OSError.strerror`` ("" when it did not).
        worker: the worker, as ``host:pid``.
        started_s, finished_s: the batch's start and end, ``time.time()`` on the worker.
        cpu_s: the worker's CPU seconds on the batch (below ``finished_s - started_s`` where other
            processes took the worker's core).
    """

    points: tuple[int, ...]
    table: Any
    chunk: str
    write_error: str
    worker: str
    started_s: float
    finished_s: float
    cpu_s: float


def run_batch(runner: PointRunner, points: Sequence[dict[str, Any]], parts: str, writer: str) -> BatchDone:
    """The Dask task: simulate ``points``, write their chunk into ``parts`` when this worker reads
    ``writer`` there, and send the chunk's table back either way (not after a refused write)."""
    started, cpu = time.time(), time.process_time()
    rows = runner.run_batch(points)
    numbers = tuple(int(row["point"]) for row in rows)
    table = chunk_table(rows, COLUMNS)
    worker = f"{socket.gethostname()}:{os.getpid()}"
    folder = Path(parts)
    chunk, error = "", ""
    if writer_of(folder) == writer:
        try:
            chunk = str(write_chunk(folder, table))
        except OSError as exc:  # the sweep reports it (a full disk, say), naming the chunk
            chunk, error = str(chunk_path(folder, numbers)), write_reason(exc)
    return BatchDone(numbers, None if error else table, chunk, error, worker, started, time.time(),
                     time.process_time() - cpu)


def warm_up(runner: PointRunner, points: Sequence[dict[str, Any]]) -> None:
    """Simulate ``points`` and drop their rows: the worker unpickles the runner and loads the
    kernels those points' schedules use before its first batch."""
    runner.run_batch(points)


def warm_points(points: Sequence[dict[str, Any]], cost: Any) -> list[dict[str, Any]]:
    """The cheapest of ``points`` (by ``cost``) for each schedule, recomputation setting and PipeMare
    update: together they use every kernel the sweep will."""
    cheapest: dict[tuple[Any, ...], dict[str, Any]] = {}
    for point in points:
        key = (point["schedule"], point["recompute"], point["pipemare_update"], point["stages_per_rank"])
        if key not in cheapest or cost(point) < cost(cheapest[key]):
            cheapest[key] = point
    return list(cheapest.values())
