"""Assembling a Trace from what an engine computed: per op its end and the arrival of its output."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from pipesim.engine.lowering import Program
from pipesim.engine.memory import memory_columns
from pipesim.engine.trace import SPAN_COLUMNS, STREAMS, Trace

FloatArray = npt.NDArray[np.float64]
COMPUTE, SEND = STREAMS.index("compute"), STREAMS.index("send")


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
    meta: dict[str, Any],
    *,
    start_s: FloatArray | None = None,
    send_start_s: FloatArray | None = None,
) -> Trace:
    """The Trace of a run: spans in a fixed order, memory events from the ends.

    Span order, the same for every engine: first one compute span per op in OpTable order
    (rank by rank, each in its op order), then one send span per op whose output crosses to
    another rank, in the same order. Sends to the same rank take no time and have no span.

    Args:
        end_s: per op (OpTable order), when it ended.
        arrival_s: per op, when its output reached the receiving rank (its send's end; the
            op's end when it sends nothing or sends to its own rank).
        meta: the Trace's meta.
        start_s, send_start_s: starts as the engine saw them; by default implied by the ends.
    """
    ops = program.ops
    if start_s is None or send_start_s is None:
        start_s, send_start_s = op_starts(program, end_s, arrival_s)
    n, remote = ops.num_ops, np.flatnonzero(ops.is_remote_send)
    start, end = np.empty(n + remote.size), np.empty(n + remote.size)
    start[:n], end[:n] = start_s, end_s
    np.take(np.asarray(send_start_s, dtype=np.float64), remote, out=start[n:], mode="clip")
    np.take(np.asarray(arrival_s, dtype=np.float64), remote, out=end[n:], mode="clip")
    return trace_from_times(program, start, end, meta, remote=remote)


def trace_from_times(program: Program, start_s: FloatArray, end_s: FloatArray, meta: dict[str, Any], *,
                     remote: npt.NDArray[np.int64] | None = None) -> Trace:
    """The Trace of a run whose span times are already in span order (see ``build_trace``).

    ``start_s`` and ``end_s`` become the Trace's columns as they are (not copied); the other
    columns come from the OpTable, each written once into its final array.
    """
    ops = program.ops
    n = ops.num_ops
    if remote is None:
        remote = np.flatnonzero(ops.is_remote_send)
    spans: dict[str, npt.NDArray[Any]] = {
        "device": _stacked(n, ops.rank, remote, np.int64),
        "stream": _stacked(n, COMPUTE, remote, np.int64, SEND),
        "kind": _stacked(n, ops.kind, remote, np.int64),
        "stage": _stacked(n, ops.stage, remote, np.int64),
        "microbatch": _stacked(n, ops.microbatch, remote, np.int64),
        "minibatch": _stacked(n, ops.minibatch, remote, np.int64),
        "weight_version": _stacked(n, ops.version, remote, np.int64, -1),
        "start_s": start_s,
        "end_s": end_s,
        "bytes": _stacked(n, 0.0, remote, np.float64, ops.send_bytes),
        "peer": _stacked(n, -1, remote, np.int64, ops.send_rank),
        "position": _stacked(n, ops.position, remote, np.int64),
    }
    assert tuple(spans) == SPAN_COLUMNS and start_s.shape == end_s.shape == (n + remote.size,)
    return Trace(meta=meta, spans=spans, memory=memory_columns(program, end_s[:n]))


def _stacked(n: int, compute: npt.NDArray[Any] | float, remote: npt.NDArray[np.int64], dtype: type,
             send: npt.NDArray[Any] | float | None = None) -> npt.NDArray[Any]:
    """A span column: ``compute`` for the ``n`` compute spans, then per send span ``send`` (an
    op column, read at the sending ops, or one value; by default ``compute`` read there)."""
    column = np.empty(n + remote.size, dtype=dtype)
    column[:n] = compute
    source = compute if send is None else send
    if isinstance(source, np.ndarray):
        np.take(source, remote, out=column[n:], mode="clip")
    else:
        column[n:] = source
    return column
