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
    remote = np.flatnonzero(ops.is_remote_send)
    num_sends = remote.size
    columns: dict[str, npt.NDArray[Any]] = {
        "device": np.concatenate([ops.rank, ops.rank[remote]]),
        "stream": np.concatenate([np.full(ops.num_ops, COMPUTE, np.int64), np.full(num_sends, SEND, np.int64)]),
        "kind": np.concatenate([ops.kind, ops.kind[remote]]),
        "stage": np.concatenate([ops.stage, ops.stage[remote]]),
        "microbatch": np.concatenate([ops.microbatch, ops.microbatch[remote]]),
        "minibatch": np.concatenate([ops.minibatch, ops.minibatch[remote]]),
        "weight_version": np.concatenate([ops.version, np.full(num_sends, -1, np.int64)]),
        "start_s": np.concatenate([start_s, send_start_s[remote]]),
        "end_s": np.concatenate([end_s, arrival_s[remote]]),
        "bytes": np.concatenate([np.zeros(ops.num_ops), ops.send_bytes[remote]]),
        "peer": np.concatenate([np.full(ops.num_ops, -1, np.int64), ops.send_rank[remote]]),
        "position": np.concatenate([ops.position, ops.position[remote]]),
    }
    assert tuple(columns) == SPAN_COLUMNS
    spans = {c: np.ascontiguousarray(v, dtype=np.float64 if v.dtype.kind == "f" else np.int64)
             for c, v in columns.items()}
    return Trace(meta=meta, spans=spans, memory=memory_columns(program, end_s))
