"""Chrome/Perfetto trace export: a process per device, a thread per stream, memory counters."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from pipesim.engine.trace import CATEGORIES, STREAMS, Trace


def to_chrome(trace: Trace) -> dict[str, Any]:
    """The trace in Chrome's JSON trace-event format (opens in ui.perfetto.dev).

    Times are microseconds. Each rank is a process ("device N") with a "compute" and a "send"
    thread; memory per stage is a counter track of bytes by category.
    """
    events: list[dict[str, Any]] = []
    num_ranks = int(trace.meta["num_ranks"])
    for device in range(num_ranks):
        events.append({"ph": "M", "pid": device, "name": "process_name", "args": {"name": f"device {device}"}})
        for stream_index, stream in enumerate(STREAMS):
            events.append({"ph": "M", "pid": device, "tid": stream_index, "name": "thread_name",
                           "args": {"name": stream}})
    for span in trace.iter_spans():
        name = span.op if span.stream == "compute" else f"{span.op} -> device {span.peer}"
        events.append({
            "ph": "X", "pid": span.device, "tid": STREAMS.index(span.stream), "name": name,
            "cat": span.op[len(str(span.stage))], "ts": span.start_s * 1e6,
            "dur": (span.end_s - span.start_s) * 1e6,
            "args": {"stage": span.stage, "microbatch": span.microbatch, "minibatch": span.minibatch,
                     "weight_version": span.weight_version, "bytes": span.bytes},
        })
    memory = trace.memory
    order = np.lexsort((memory["category"], memory["stage"], memory["time_s"]))
    level: dict[tuple[int, int], dict[str, float]] = {}
    for row in order.tolist():
        device = int(memory["device"][row])
        stage = int(memory["stage"][row])
        current = level.setdefault((device, stage), {c: 0.0 for c in CATEGORIES})
        current[CATEGORIES[int(memory["category"][row])]] += float(memory["delta_bytes"][row])
        events.append({"ph": "C", "pid": device, "name": f"memory stage {stage} (bytes)",
                       "ts": float(memory["time_s"][row]) * 1e6, "args": dict(current)})
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"pipesim": trace.meta}}


def chrome_json(trace: Trace) -> str:
    """Deterministic JSON text of ``to_chrome(trace)``."""
    return json.dumps(to_chrome(trace), sort_keys=True, separators=(",", ":")) + "\n"
