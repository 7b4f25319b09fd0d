"""Assembling a Trace from what an engine computed: per op its end and the arrival of its output."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from pipesim.engine.lowering import Program
from pipesim.engine.memory import MemoryMethod, memory_columns
from pipesim.engine.run_info import RunInfo
from pipesim.engine.trace import SPAN_COLUMNS, STREAMS, Trace

FloatArray = npt.NDArray[np.float64]
COMPUTE, SEND = STREAMS.index("compute"), STREAMS.index("send")
_FLOAT_SPANS = frozenset({"start_s", "end_s", "bytes"})


def op_starts(program: Program, end_s: FloatArray, arrival_s: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Start of every op and of every op's send, implied by the ends and arrivals.

    An op starts when its rank is free and its input has arrived; a send starts when its op
    has ended and the send before it on the same link has arrived.
    """
    ops = program.ops
    previous_end = np.zeros_like(end_s)
    if ops.num_ops:
        previous_end[1:] = end_s[:-1]
        previous_end[ops.rank_offsets[:-1][ops.rank_offsets[:-1] < ops.num_ops]] = 0.0
    ready = np.where(ops.wait >= 0, arrival_s[np.maximum(ops.wait, 0)], 0.0)
    start = np.maximum(previous_end, ready)
    link_free = np.where(ops.previous_send >= 0, arrival_s[np.maximum(ops.previous_send, 0)], 0.0)
    return start, np.maximum(end_s, link_free)


def build_trace(
    program: Program,
    end_s: FloatArray,
    arrival_s: FloatArray,
    info: RunInfo,
    *,
    start_s: FloatArray | None = None,
    send_start_s: FloatArray | None = None,
    memory_method: MemoryMethod = "auto",
) -> Trace:
    """The Trace of a run: spans in a fixed order, memory events from the ends.

    Span order, the same for every engine: first one compute span per op in OpTable order
    (rank by rank, each in its op order), then one send span per op whose output crosses to
    another rank, in the same order. Sends to the same rank take no time and have no span.

    Args:
        end_s: per op (OpTable order), when it ended.
        arrival_s: per op, when its output reached the receiving rank (its send's end; the
            op's end when it sends nothing or sends to its own rank).
        info: the Trace's run info.
        start_s, send_start_s: starts as the engine saw them; by default implied by the ends.
        memory_method: how to compute the memory events (``memory.memory_columns``).
    """
    ops = program.ops
    if start_s is None or send_start_s is None:
        start_s, send_start_s = op_starts(program, end_s, arrival_s)
    n, remote = ops.num_ops, np.flatnonzero(ops.is_remote_send)
    spans = span_block(n + remote.size)
    start, end = spans["start_s"], spans["end_s"]
    start[:n], end[:n] = start_s, end_s
    np.take(np.asarray(send_start_s, dtype=np.float64), remote, out=start[n:], mode="clip")
    np.take(np.asarray(arrival_s, dtype=np.float64), remote, out=end[n:], mode="clip")
    return trace_from_times(program, spans, info, remote=remote, memory_method=memory_method)


def span_block(num_spans: int) -> dict[str, npt.NDArray[Any]]:
    """Empty span columns (SPAN_COLUMNS, int64 or float64 as the Trace defines them), all in
    one allocation: each column is a row of one block, viewed with its dtype, so an engine can
    write times straight into the Trace's own columns."""
    block = np.empty((len(SPAN_COLUMNS), num_spans), dtype=np.float64)
    return {column: block[i] if column in _FLOAT_SPANS else block[i].view(np.int64)
            for i, column in enumerate(SPAN_COLUMNS)}


def trace_from_times(program: Program, spans: dict[str, npt.NDArray[Any]], info: RunInfo, *,
                     remote: npt.NDArray[np.int64] | None = None, memory_method: MemoryMethod = "auto") -> Trace:
    """The Trace of a run whose span times are already in place (see ``build_trace``).

    Args:
        spans: columns from ``span_block`` whose ``start_s`` and ``end_s`` hold every span's
            times in span order; the other columns are filled here from the OpTable.
        remote: the ops that send to another rank (flat indices, rising), if known.
        memory_method: how to compute the memory events (``memory.memory_columns``).
    """
    n = program.ops.num_ops
    if remote is None:
        remote = np.flatnonzero(program.ops.is_remote_send)
    shared = shared_span_columns(program, remote)
    if shared is None:
        fill_span_columns(program, spans, remote)
    else:
        spans.update(shared)
    return Trace(info=info, spans=spans, memory=memory_columns(program, spans["end_s"][:n], method=memory_method))


def shared_span_columns(program: Program, remote: npt.NDArray[np.int64]) -> dict[str, npt.NDArray[Any]] | None:
    """The span columns other than the times, read only, shared by every program lowered from
    one columnar order (``Program.derived``; None for other programs): they depend on the order
    alone, but for the bytes sent, so the last stage costs' output bytes are part of the key.
    A Trace takes these arrays as its columns, without a copy."""
    derived = program.derived
    if derived is None:
        return None
    key = tuple(program.costs.output_bytes)
    known = derived.get("span_columns")
    if known is not None and known[0] == key:
        columns: dict[str, npt.NDArray[Any]] = known[1]
        return columns
    spans = span_block(program.ops.num_ops + remote.size)
    fill_span_columns(program, spans, remote)
    columns = {column: values for column, values in spans.items() if column not in ("start_s", "end_s")}
    for values in columns.values():
        values.flags.writeable = False
    derived["span_columns"] = (key, columns)
    return columns


def fill_span_columns(program: Program, spans: dict[str, npt.NDArray[Any]], remote: npt.NDArray[np.int64]) -> None:
    """Write every span column but the times, from the OpTable: per column its values for the
    compute spans, then for the send spans of the ops ``remote`` (flat indices, rising)."""
    ops = program.ops
    n = ops.num_ops
    assert spans["start_s"].shape == (n + remote.size,)
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
