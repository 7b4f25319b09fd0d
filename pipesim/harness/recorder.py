"""What a rank records while it runs, in a memory-mapped file that outlives it, and the merge into a Trace.

Each rank writes rows into its own file as ops finish; the pages belong to the file, so a rank
killed mid-run still leaves everything it recorded, and the launcher can read a rank's progress
(the op it is at and since when) while it runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from pipesim.engine.run_info import RunInfo
from pipesim.engine.trace import CATEGORIES, KINDS, STREAMS, Trace, TraceBuilder
from pipesim.harness.config import RunConfig
from pipesim.schedule.ir import Op, OpKind, Schedule

# Phases a rank reports in its header.
STARTING, WAITING, COMPUTING, FINISHED, FAILED = range(5)
PHASE_NAMES = ("starting", "waiting for input", "computing", "finished", "failed")

HEADER = 16
# Header cells.
POSITION, PHASE, SINCE, NUM_COMPUTE, NUM_SENDS, NUM_ARRIVALS, NUM_MEMORY, ORIGIN, PID, RANK, CPU_S, WALL_S = range(12)
# position, version, minibatch, start, end, thread CPU seconds, seconds before the work (the receive),
# seconds after it (the send and the records)
COMPUTE_COLUMNS = 8
SEND_COLUMNS = 5  # position, start, bytes, peer, tag
ARRIVAL_COLUMNS = 3  # source rank, tag, time
MEMORY_COLUMNS = 5  # time, stage, category, delta_bytes, delta_count


def message_tag(kind: OpKind, stage: int, microbatch: int, num_stages: int) -> int:
    """The p2p tag of the output of stage ``stage``'s op for ``microbatch``: activations even,
    gradients odd, one tag per (stage, microbatch) so that two stages on one rank never share one."""
    return 2 * (microbatch * num_stages + stage) + (0 if kind is OpKind.F else 1)


@dataclass(frozen=True)
class Layout:
    """Row capacities of a rank's file, from its number of ops."""

    num_ops: int

    @property
    def memory_rows(self) -> int:
        """Memory events: a few per op, plus the initial ones."""
        return 4 * self.num_ops + 16

    @property
    def size(self) -> int:
        """Float64 cells in the file."""
        n = self.num_ops
        return HEADER + n * (COMPUTE_COLUMNS + SEND_COLUMNS + ARRIVAL_COLUMNS) + self.memory_rows * MEMORY_COLUMNS

    def views(self, cells: npt.NDArray[np.float64]) -> dict[str, npt.NDArray[np.float64]]:
        """The header and the four row blocks of a file's cells."""
        n = self.num_ops
        offset = HEADER
        blocks = {"header": cells[:HEADER]}
        for name, rows, columns in (("compute", n, COMPUTE_COLUMNS), ("sends", n, SEND_COLUMNS),
                                    ("arrivals", n, ARRIVAL_COLUMNS), ("memory", self.memory_rows, MEMORY_COLUMNS)):
            blocks[name] = cells[offset:offset + rows * columns].reshape(rows, columns)
            offset += rows * columns
        return blocks


class Recorder:
    """A rank's writer: progress in the header, rows as ops finish (times are absolute seconds).

    Writes go through a flat memoryview of the mapped file: a handful of float stores per row,
    about a microsecond, where numpy's row assignment costs several.
    """

    def __init__(self, path: Path, num_ops: int, rank: int, pid: int, now: float) -> None:
        self.layout = Layout(num_ops)
        self.cells = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(self.layout.size,))
        self.blocks = self.layout.views(self.cells)
        self.flat = self.cells.data.cast("B").cast("d")
        self.offsets: dict[str, tuple[int, int]] = {}
        offset = HEADER
        for name, rows, columns in (("compute", num_ops, COMPUTE_COLUMNS), ("sends", num_ops, SEND_COLUMNS),
                                    ("arrivals", num_ops, ARRIVAL_COLUMNS),
                                    ("memory", self.layout.memory_rows, MEMORY_COLUMNS)):
            self.offsets[name] = (offset, columns)
            offset += rows * columns
        flat = self.flat
        flat[RANK], flat[PID], flat[PHASE], flat[SINCE], flat[POSITION] = rank, pid, STARTING, now, -1

    def progress(self, position: int, phase: int, now: float) -> None:
        """The rank is now in ``phase`` at op ``position``."""
        flat = self.flat
        flat[POSITION], flat[PHASE], flat[SINCE] = position, phase, now

    def set_origin(self, origin: float) -> None:
        """The common time origin of the run (absolute seconds)."""
        self.flat[ORIGIN] = origin

    def _append(self, block: str, counter: int, row: tuple[float, ...]) -> None:
        flat = self.flat
        index = int(flat[counter])
        base, columns = self.offsets[block]
        start = base + index * columns
        for column, value in enumerate(row):
            flat[start + column] = value
        flat[counter] = index + 1

    def compute(self, position: int, version: int, minibatch: int, start: float, end: float,
                cpu_s: float = -1.0, receive_s: float = -1.0, send_s: float = -1.0) -> None:
        """A compute span of op ``position``, the CPU time its thread used for it, and how much of it
        came before its work (taking its input) and after it (handing its output on, the records);
        -1: unknown."""
        self._append("compute", NUM_COMPUTE, (position, version, minibatch, start, end, cpu_s, receive_s, send_s))

    def cpu_time(self, cpu_s: float, wall_s: float) -> None:
        """Add to the totals of thread CPU time and wall time spent inside compute spans."""
        self.flat[CPU_S] += cpu_s
        self.flat[WALL_S] += wall_s

    def send(self, position: int, start: float, num_bytes: float, peer: int, tag: int) -> None:
        """Op ``position``'s output handed to the link towards ``peer`` at ``start``."""
        self._append("sends", NUM_SENDS, (position, start, num_bytes, peer, tag))

    def arrival(self, source: int, tag: int, time: float) -> None:
        """The message ``tag`` from ``source`` was received at ``time``."""
        self._append("arrivals", NUM_ARRIVALS, (source, tag, time))

    def memory(self, time: float, stage: int, category: str, delta_bytes: float, delta_count: int) -> None:
        """A memory event of ``stage``."""
        self._append("memory", NUM_MEMORY, (time, stage, CATEGORIES.index(category), delta_bytes, delta_count))

    def flush(self) -> None:
        """Push the rows to the file (they survive a crash anyway; this makes them durable)."""
        self.cells.flush()


def read_rank(path: Path) -> dict[str, npt.NDArray[np.float64]] | None:
    """A rank's blocks, with only the rows written so far; None if the file is missing or torn."""
    try:
        cells = np.load(path, mmap_mode="r")
    except (OSError, ValueError, EOFError):
        return None
    num_ops = (cells.shape[0] - HEADER - 16 * MEMORY_COLUMNS) // (
        COMPUTE_COLUMNS + SEND_COLUMNS + ARRIVAL_COLUMNS + 4 * MEMORY_COLUMNS)
    blocks = Layout(int(num_ops)).views(np.array(cells))
    header = blocks["header"]
    for name, counter in (("compute", NUM_COMPUTE), ("sends", NUM_SENDS), ("arrivals", NUM_ARRIVALS),
                          ("memory", NUM_MEMORY)):
        blocks[name] = blocks[name][: int(header[counter])]
    return blocks


def header_of(path: Path) -> npt.NDArray[np.float64] | None:
    """Just the header of a rank's file (progress), or None before the rank created it."""
    try:
        cells = np.load(path, mmap_mode="r")
        return np.array(cells[:HEADER])
    except (OSError, ValueError, EOFError):
        return None


def trace_meta(config: RunConfig, schedule: Schedule, param_bytes: list[float],
               stash_bytes: list[float]) -> RunInfo:
    """The measured trace's run info: the simulator's fields, with sizes as measured."""
    simulated = RunInfo.of(schedule, rank_devices=tuple(range(schedule.num_ranks)),
                           microbatch_size=config.microbatch_size, param_bytes=tuple(param_bytes),
                           stash_bytes=tuple(stash_bytes), optimizer_state_multiplier=0.0,
                           device_memory_bytes=(None,) * schedule.num_ranks)
    return replace(simulated, engine="torch", backend=config.backend, device=config.device,
                   partition=tuple((start, end) for start, end in config.partition))


def merge(schedule: Schedule, ranks: list[dict[str, npt.NDArray[np.float64]] | None],
          info: RunInfo) -> Trace:
    """One Trace from the ranks' records, times relative to the run's origin (rank 0's, else the first).

    A send span runs from the sender handing the output over to the receiver getting it; a send
    whose arrival was not recorded (a failed run) ends where it started.
    """
    # How much of its compute spans each rank actually ran for: below 1 when the OS gave its core to
    # someone else mid-op (a loaded machine), which no profile can predict.
    cpu_share = tuple(None if r is None or r["header"][WALL_S] <= 0 else
                      float(r["header"][CPU_S] / r["header"][WALL_S]) for r in ranks)
    # Per rank and op position, a column of its compute row: the thread CPU seconds of its span, and
    # the span's seconds before and after its work (-1: not recorded or not measured).
    per_op: dict[int, list[tuple[float, ...] | None]] = {5: [], 6: [], 7: []}
    for rank_index, r in enumerate(ranks):
        rows = {} if r is None else {int(row[0]): row for row in r["compute"].tolist()}
        for column, values in per_op.items():
            values.append(None if r is None else tuple(float(rows[p][column]) if p in rows else -1.0
                                                       for p in range(len(schedule.ranks[rank_index]))))
    builder = TraceBuilder(info=replace(info, cpu_share=cpu_share, compute_cpu_s=tuple(per_op[5]),
                                        compute_receive_s=tuple(per_op[6]), compute_send_s=tuple(per_op[7])))
    origin = next((float(r["header"][ORIGIN]) for r in ranks if r is not None and r["header"][ORIGIN] > 0), 0.0)
    compute_code, send_code = STREAMS.index("compute"), STREAMS.index("send")
    arrivals: dict[tuple[int, int, int], float] = {}
    for rank_index, blocks in enumerate(ranks):
        if blocks is None:
            continue
        for source, tag, time in blocks["arrivals"].tolist():
            arrivals[(int(source), rank_index, int(tag))] = time
    for rank_index, blocks in enumerate(ranks):
        if blocks is None:
            continue
        ops = schedule.ranks[rank_index]
        for position, version, minibatch, start, end, *_ in blocks["compute"].tolist():
            op = ops[int(position)]
            builder.span(rank_index, compute_code, KINDS.index(op.kind.value), op.stage, op.microbatch,
                         int(minibatch), int(version), start - origin, end - origin, 0.0, -1, int(position))
    for rank_index, blocks in enumerate(ranks):
        if blocks is None:
            continue
        ops = schedule.ranks[rank_index]
        minibatch_of = {int(row[0]): int(row[2]) for row in blocks["compute"].tolist()}
        for position, start, num_bytes, peer, tag in blocks["sends"].tolist():
            sent: Op = ops[int(position)]
            end = max(start, arrivals.get((rank_index, int(peer), int(tag)), start))
            builder.span(rank_index, send_code, KINDS.index(sent.kind.value), sent.stage, sent.microbatch,
                         minibatch_of.get(int(position), 0), -1, start - origin, end - origin, num_bytes,
                         int(peer), int(position))
    for rank_index, blocks in enumerate(ranks):
        if blocks is None:
            continue
        for time, stage, category, delta_bytes, delta_count in blocks["memory"].tolist():
            builder.memory_event(max(0.0, time - origin), rank_index, int(stage), int(category), delta_bytes,
                                 int(delta_count))
    return builder.build()
