"""Chrome/Perfetto trace export: a process per device, a thread per stream, memory counters, and
flow arrows from each op that sends to the op that receives."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from pipesim.engine.trace import CATEGORIES, KINDS, STREAMS, Trace

COMPUTE_TID = 1
_COMPUTE, _SEND = STREAMS.index("compute"), STREAMS.index("send")


def _pid(device: int) -> int:
    # Perfetto gives pid 0 and tid 0 special meaning (the idle "swapper" task), so ids start at 1.
    return device + 1


def _send_tid(peer: int) -> int:
    return 2 + peer


def _ns(seconds: Any) -> Any:
    """Integer nanoseconds: start and end are rounded once, so touching spans stay touching."""
    return np.rint(np.asarray(seconds, dtype=np.float64) * 1e9).astype(np.int64)


def _clipped_sends(s: Any, start_ns: Any, end_ns: Any, send: Any) -> Any:
    """Every span's end, a send's cut at the start of the next send on the same link."""
    shown = end_ns.copy()
    rows = np.flatnonzero(send)
    rows = rows[np.lexsort((start_ns[rows], s["peer"][rows], s["device"][rows]))]
    same_link = (s["device"][rows][1:] == s["device"][rows][:-1]) & (s["peer"][rows][1:] == s["peer"][rows][:-1])
    before, after = rows[:-1][same_link], rows[1:][same_link]
    shown[before] = np.minimum(end_ns[before], start_ns[after])
    return shown


def to_chrome(trace: Trace, *, run: dict[str, Any] | None = None) -> dict[str, Any]:
    """The trace in Chrome's JSON trace-event format, as ui.perfetto.dev and chrome://tracing read it.

    Each device is a process ``device N`` (pid N+1); its compute stream is the thread
    ``compute`` and each link it sends on is a thread ``send -> device K``, so every thread's
    slices follow one another without overlapping (Perfetto drops slices that overlap without
    nesting): a send's slice ends where the next send on its link starts when latency, which
    pipelines, lets the two overlap (its ``arrives_us`` argument keeps the arrival). Times are microseconds with nanosecond resolution (whole nanoseconds, so an op
    that starts when another ends touches it exactly). Memory is a counter per stage, by
    category and in total, stepping after all the events of one instant. Each message is a flow
    (an arrow in Perfetto) from the op that sent it to the op that received it, so a microbatch
    can be followed across devices. ``run`` (the inputs, ``pipesim.export.provenance``) goes in
    the top-level ``metadata`` and, flattened to text, in ``otherData``, which Perfetto shows
    under "Info and stats".
    """
    events: list[dict[str, Any]] = []
    s = trace.spans
    num_ranks = trace.info.num_ranks
    stage_to_rank = list(trace.info.stage_to_rank)
    send = s["stream"] == _SEND
    for device in range(num_ranks):
        stages = ",".join(str(stage) for stage, rank in enumerate(stage_to_rank) if rank == device)
        pid = _pid(device)
        events.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": f"device {device}"}})
        events.append({"ph": "M", "pid": pid, "name": "process_labels", "args": {"labels": f"stage {stages}"}})
        events.append({"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": device}})
        threads = [(COMPUTE_TID, "compute")] + [
            (_send_tid(peer), f"send -> device {peer}")
            for peer in sorted(set(s["peer"][send & (s["device"] == device)].tolist()))
        ]
        for tid, name in threads:
            events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}})
            events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index",
                           "args": {"sort_index": tid}})
    start_ns, end_ns = _ns(s["start_s"]), _ns(s["end_s"])
    shown_end_ns = _clipped_sends(s, start_ns, end_ns, send)
    order = np.lexsort((s["position"], start_ns, s["stream"], s["device"]))
    for row in order.tolist():
        kind = KINDS[int(s["kind"][row])]
        stage, microbatch = int(s["stage"][row]), int(s["microbatch"][row])
        op = f"{stage}{kind}{microbatch}"
        device = int(s["device"][row])
        event: dict[str, Any] = {"ph": "X", "pid": _pid(device), "ts": int(start_ns[row]) / 1000,
                                 "dur": int(shown_end_ns[row] - start_ns[row]) / 1000}
        if s["stream"][row] == _COMPUTE:
            event.update(tid=COMPUTE_TID, name=op, cat=kind, args={
                "stage": stage, "microbatch": microbatch, "minibatch": int(s["minibatch"][row]),
                "weight_version": int(s["weight_version"][row])})
        else:
            peer = int(s["peer"][row])
            what = "activations" if kind == "F" else "gradients"
            event.update(tid=_send_tid(peer), name=f"{op} {what}", cat="send", args={
                "op": op, "to_device": peer, "bytes": float(s["bytes"][row]), "minibatch": int(s["minibatch"][row]),
                "arrives_us": int(end_ns[row]) / 1000})
        events.append(event)
    events.extend(_flows(trace, (start_ns + end_ns) // 2))
    events.extend(_memory_counters(trace))
    meta = {key: value if isinstance(value, str) else json.dumps(value, sort_keys=True)
            for key, value in sorted(trace.info.to_dict().items())}
    for key, value in sorted((run or {}).items()):
        meta[f"run.{key}"] = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    # traceEvents first: older Perfetto importers stop at the first top-level key they do not know.
    document: dict[str, Any] = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": meta}
    if run is not None:
        document["metadata"] = {"run": run}
    return document


def _flows(trace: Trace, middle_ns: Any) -> list[dict[str, Any]]:
    """A flow per message: it starts inside the sending op's slice and ends bound to the receiving
    op's slice (``bp: e``: the slice that encloses its timestamp); both at the slice's middle,
    which no touching neighbour shares.

    An F's activation goes to the same microbatch's F on the next stage; a B's or I's gradient
    to the previous stage's B or I.
    """
    s = trace.spans
    compute = np.flatnonzero(s["stream"] == _COMPUTE).tolist()
    rows = {(int(s["stage"][row]), KINDS[int(s["kind"][row])], int(s["microbatch"][row])): row for row in compute}
    events: list[dict[str, Any]] = []
    for flow_id, row in enumerate(np.flatnonzero(s["stream"] == _SEND).tolist(), start=1):
        stage, kind, microbatch = int(s["stage"][row]), KINDS[int(s["kind"][row])], int(s["microbatch"][row])
        sender = rows.get((stage, kind, microbatch))
        targets = [(stage + 1, "F")] if kind == "F" else [(stage - 1, "B"), (stage - 1, "I")]
        receiver = next((rows[(t, k, microbatch)] for t, k in targets if (t, k, microbatch) in rows), None)
        if sender is None or receiver is None:
            continue
        name = f"{stage}{kind}{microbatch} -> {stage + 1 if kind == 'F' else stage - 1}" \
               f"{KINDS[int(s['kind'][receiver])]}{microbatch}"
        common = {"name": name, "cat": "message", "id": flow_id, "tid": COMPUTE_TID}
        events.append({**common, "ph": "s", "pid": _pid(int(s["device"][sender])),
                       "ts": int(middle_ns[sender]) / 1000})
        events.append({**common, "ph": "f", "bp": "e", "pid": _pid(int(s["device"][receiver])),
                       "ts": int(middle_ns[receiver]) / 1000})
    return events


def _memory_counters(trace: Trace) -> list[dict[str, Any]]:
    """One counter event per (stage, instant): the levels after every event at that instant."""
    m = trace.memory
    if not len(m["time_s"]):
        return []
    time_ns = _ns(m["time_s"])
    order = np.lexsort((m["category"], time_ns, m["stage"]))
    events = []
    level: dict[int, list[float]] = {}
    rows = order.tolist()
    for index, row in enumerate(rows):
        stage = int(m["stage"][row])
        current = level.setdefault(stage, [0.0] * len(CATEGORIES))
        current[int(m["category"][row])] += float(m["delta_bytes"][row])
        following = rows[index + 1] if index + 1 < len(rows) else None
        if following is not None and int(m["stage"][following]) == stage and time_ns[following] == time_ns[row]:
            continue
        pid, ts = _pid(int(m["device"][row])), int(time_ns[row]) / 1000
        events.append({"ph": "C", "pid": pid, "name": f"memory stage {stage} (bytes)", "ts": ts,
                       "args": {category: current[i] for i, category in enumerate(CATEGORIES)}})
        events.append({"ph": "C", "pid": pid, "name": f"memory stage {stage} total (bytes)", "ts": ts,
                       "args": {"total": sum(current)}})
    return events


def chrome_json(trace: Trace, *, run: dict[str, Any] | None = None) -> str:
    """Deterministic JSON text of ``to_chrome(trace, run=run)``."""
    return json.dumps(to_chrome(trace, run=run), separators=(",", ":"), allow_nan=False) + "\n"
