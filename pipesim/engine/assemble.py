"""Assembling a Trace from the span times an engine computed.

Span order, the same for every engine: first one compute span per op in OpTable order (rank by
rank, each in its op order), then one send span per op whose output crosses to another rank, in
the same order. Sends to the same rank take no time and have no span.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from pipesim.engine.lowering import Program
from pipesim.engine.memory import memory_columns
from pipesim.engine.run_info import RunInfo
from pipesim.engine.trace import SPAN_COLUMNS, STREAMS, Trace

FloatArray = npt.NDArray[np.float64]
COMPUTE, SEND = STREAMS.index("compute"), STREAMS.index("send")
TIMES = ("start_s", "end_s")


def trace_from_times(program: Program, times: dict[str, FloatArray], info: RunInfo, *,
                     compiled: bool | None = None) -> Trace:
    """The Trace of a run from its spans' times (``start_s`` and ``end_s``, in the module's span
    order); the other span columns are the program's (``shared_span_columns``).

    Args:
        compiled: compute the memory events with numba's kernel (``memory.memory_columns``).
    """
    n = program.ops.num_ops
    shared = shared_span_columns(program)
    spans = {column: times[column] if column in TIMES else shared[column] for column in SPAN_COLUMNS}
    return Trace(info=info, spans=spans, memory=memory_columns(program, spans["start_s"][:n], spans["end_s"][:n],
                                                                   compiled=compiled))


def shared_span_columns(program: Program) -> dict[str, npt.NDArray[Any]]:
    """The span columns other than the times, read only, shared by every program lowered from
    one schedule (``Program.derived``): they depend on the order alone, but for the bytes sent,
    so the last stage costs' output bytes are part of the key. A Trace takes these arrays as
    its columns, without a copy."""
    derived = program.derived
    key = tuple(program.costs.output_bytes)
    known = derived.get("span_columns")
    if known is not None and known[0] == key:
        columns: dict[str, npt.NDArray[Any]] = known[1]
        return columns
    remote = np.flatnonzero(program.ops.is_remote_send)
    size = program.ops.num_ops + remote.size
    columns = {column: np.empty(size, np.float64 if column == "bytes" else np.int64)
               for column in SPAN_COLUMNS if column not in TIMES}
    fill_span_columns(program, columns, remote)
    for values in columns.values():
        values.flags.writeable = False
    derived["span_columns"] = (key, columns)
    return columns


def fill_span_columns(program: Program, spans: dict[str, npt.NDArray[Any]], remote: npt.NDArray[np.int64]) -> None:
    """Write every span column but the times, from the OpTable: per column its values for the
    compute spans, then for the send spans of the ops ``remote`` (flat indices, rising)."""
    ops = program.ops
    n = ops.num_ops
    assert spans["device"].shape == (n + remote.size,)
    for column, compute, send in (
        ("device", ops.rank, None), ("stream", COMPUTE, SEND), ("kind", ops.kind, None),
        ("stage", ops.stage, None), ("microbatch", ops.microbatch, None), ("minibatch", ops.minibatch, None),
        ("weight_version", ops.version, -1), ("bytes", 0.0, ops.send_bytes), ("peer", -1, ops.send_rank),
        ("position", ops.position, None),
    ):
        target = spans[column]
        target[:n] = compute
        source = compute if send is None else send
        if isinstance(source, np.ndarray):
            np.take(source, remote, out=target[n:], mode="clip")
        else:
            target[n:] = source
