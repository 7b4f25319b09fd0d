"""Invariants of a timed run: spans against the lowered program, memory against the spans, trace pairs."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import NamedTuple

import numpy as np

from pipesim.engine.lowering import Program
from pipesim.engine.trace import CATEGORIES, KINDS, STREAMS, Trace
from pipesim.metrics import compute_metrics
from pipesim.schedule.ir import Op, OpKind
from pipesim.schedule.validate import Violation

_COMPUTE, _SEND = STREAMS.index("compute"), STREAMS.index("send")
_ACTIVATIONS = CATEGORIES.index("activations")


class _Row(NamedTuple):
    device: int
    position: int
    start_s: float
    end_s: float
    peer: int


class _Index(NamedTuple):
    compute: dict[Op, _Row]
    sends: dict[Op, _Row]


def _index(trace: Trace) -> _Index:
    """Compute and send spans by op (a send is keyed by the op whose output it carries)."""
    s = trace.spans
    compute: dict[Op, _Row] = {}
    sends: dict[Op, _Row] = {}
    for row in range(trace.num_spans):
        op = Op(int(s["stage"][row]), OpKind(KINDS[int(s["kind"][row])]), int(s["microbatch"][row]))
        entry = _Row(int(s["device"][row]), int(s["position"][row]), float(s["start_s"][row]),
                     float(s["end_s"][row]), int(s["peer"][row]))
        (compute if int(s["stream"][row]) == _COMPUTE else sends)[op] = entry
    return _Index(compute, sends)


def versions_from_trace(trace: Trace) -> dict[Op, int]:
    """The weight version each compute op ran on, as the trace recorded it."""
    s = trace.spans
    compute = s["stream"] == _COMPUTE
    return {
        Op(stage, OpKind(KINDS[kind]), microbatch): version
        for stage, kind, microbatch, version in zip(
            s["stage"][compute].tolist(), s["kind"][compute].tolist(), s["microbatch"][compute].tolist(),
            s["weight_version"][compute].tolist(), strict=True)
    }


def find_trace_violations(program: Program, trace: Trace, *, exact_durations: bool = True) -> list[Violation]:
    """Every time and memory invariant of ``trace`` as a run of ``program``.

    Args:
        exact_durations: also require each span to last exactly its op's duration (false for
            jittered runs and for measured traces).
    """
    found = find_missing_spans(program, trace)
    if found:
        return found
    found += find_overlaps(trace)
    found += find_early_starts(program, trace)
    found += find_idle_waits(program, trace)
    if exact_durations:
        found += find_duration_mismatches(program, trace)
    found += find_stash_mismatches(trace)
    found += find_memory_floor_violations(trace)
    return found


def find_missing_spans(program: Program, trace: Trace) -> list[Violation]:
    """Every op of the program has one compute span on its rank, and every send one send span."""
    index = _index(trace)
    found = []
    for rank_index, ops in enumerate(program.ranks):
        for position, lowered in enumerate(ops):
            span = index.compute.get(lowered.op)
            if span is None or (span.device, span.position) != (rank_index, position):
                found.append(Violation(rank_index, position, str(lowered.op), "has no compute span at its place"))
            if lowered.send_rank not in (-1, rank_index) and lowered.op not in index.sends:
                found.append(Violation(rank_index, position, str(lowered.op), "has no send span"))
    return found


def find_overlaps(trace: Trace) -> list[Violation]:
    """No two compute spans overlap on a device. Sends on a link direction may overlap by their
    latency, which pipelines (``find_idle_waits`` checks when each one leaves)."""
    index = _index(trace)
    streams: dict[tuple[int, int], list[tuple[float, float, int, Op]]] = defaultdict(list)
    for op, row in index.compute.items():
        streams[(row.device, -1)].append((row.start_s, row.end_s, row.position, op))
    found = []
    for (device, _), spans in streams.items():
        spans.sort(key=lambda item: (item[0], item[1], item[2]))
        for before, after in zip(spans, spans[1:], strict=False):
            if after[0] < before[1]:
                message = f"starts at {after[0]!r} s, before {before[3]} ends at {before[1]!r} s, on its compute stream"
                found.append(Violation(device, after[2], str(after[3]), message))
    return found


def _ready_s(program: Program, index: _Index, rank_index: int, position: int) -> list[tuple[float, str]]:
    """When each input of op ``position`` on ``rank_index`` is available, with what it is."""
    lowered = program.ranks[rank_index][position]
    ready = []
    if position > 0:
        previous = program.ranks[rank_index][position - 1].op
        ready.append((index.compute[previous].end_s, f"{previous} (before it on the rank) ends"))
    for dep in lowered.waits_for:
        send = index.sends.get(dep)
        if send is not None:
            ready.append((send.end_s, f"{dep}'s output arrives"))
        else:
            ready.append((index.compute[dep].end_s, f"{dep} ends"))
    return ready


def find_early_starts(program: Program, trace: Trace) -> list[Violation]:
    """Every span starts after what it needs: a compute span after the op before it on the rank
    and after each input's producer ends plus its link time; a send after its producer ends."""
    index = _index(trace)
    found = []
    for rank_index, ops in enumerate(program.ranks):
        for position, lowered in enumerate(ops):
            start = index.compute[lowered.op].start_s
            needs = [(end, what) for end, what in _ready_s(program, index, rank_index, position)]
            for dep in lowered.waits_for:
                producer = index.compute[dep]
                link_s = program.ranks[producer.device][producer.position].transfer_s
                needs.append((producer.end_s + link_s, f"{dep} ends plus its link time {link_s!r} s"))
            for ready, what in needs:
                if start < ready:
                    found.append(Violation(rank_index, position, str(lowered.op),
                                           f"starts at {start!r} s, before {what} at {ready!r} s"))
            send = index.sends.get(lowered.op)
            if send is not None and send.start_s < index.compute[lowered.op].end_s:
                found.append(Violation(rank_index, position, str(lowered.op), "its send starts before it ends"))
    return found


def find_idle_waits(program: Program, trace: Trace) -> list[Violation]:
    """Work conservation for the given order: no device or link idles while its next op is ready.

    A compute span starts exactly when the last of its inputs is available (the op before it
    on the rank ended, each input arrived); a send starts exactly when its producer ends or the
    link's previous send (in the rank's order) stops holding the link (``link_hold_s`` after it
    leaves: latency pipelines), whichever is later.
    """
    index = _index(trace)
    found = []
    link_free: dict[tuple[int, int], float] = defaultdict(float)
    for rank_index, ops in enumerate(program.ranks):
        for position, lowered in enumerate(ops):
            start = index.compute[lowered.op].start_s
            ready = max((end for end, _ in _ready_s(program, index, rank_index, position)), default=0.0)
            if start > ready:
                found.append(Violation(rank_index, position, str(lowered.op),
                                       f"idles from {ready!r} s to {start!r} s although it is ready"))
            send = index.sends.get(lowered.op)
            if send is None:
                continue
            pair = (rank_index, lowered.send_rank)
            expected = max(index.compute[lowered.op].end_s, link_free[pair])
            if send.start_s != expected:
                found.append(Violation(rank_index, position, str(lowered.op),
                                       f"its send starts at {send.start_s!r} s, the link is ready at {expected!r} s"))
            link_free[pair] = send.start_s + lowered.link_hold_s
    return found


def find_duration_mismatches(program: Program, trace: Trace) -> list[Violation]:
    """Each compute span lasts its op's duration and each send its link time (no jitter)."""
    index = _index(trace)
    found = []
    for rank_index, ops in enumerate(program.ranks):
        for position, lowered in enumerate(ops):
            span = index.compute[lowered.op]
            if span.end_s != span.start_s + lowered.duration_s:
                lasts = span.end_s - span.start_s
                found.append(Violation(rank_index, position, str(lowered.op),
                                       f"lasts {lasts!r} s, its duration is {lowered.duration_s!r} s"))
            send = index.sends.get(lowered.op)
            if send is not None and send.end_s != send.start_s + lowered.transfer_s:
                found.append(Violation(rank_index, position, str(lowered.op),
                                       f"its send lasts {send.end_s - send.start_s!r} s, the link takes "
                                       f"{lowered.transfer_s!r} s"))
    return found


def find_stash_mismatches(trace: Trace) -> list[Violation]:
    """At every instant, a stage's stashed-activation count = its F done minus its B (or W) done."""
    s, m = trace.spans, trace.memory
    found = []
    compute = s["stream"] == _COMPUTE
    frees = (s["kind"] == KINDS.index("B")) | (s["kind"] == KINDS.index("W"))
    for stage in range(trace.info.num_stages):
        mine = compute & (s["stage"] == stage)
        forward_ends = np.sort(s["end_s"][mine & (s["kind"] == KINDS.index("F"))])
        backward_ends = np.sort(s["end_s"][mine & frees])
        events = (m["stage"] == stage) & (m["category"] == _ACTIVATIONS)
        order = np.argsort(m["time_s"][events], kind="stable")
        times = m["time_s"][events][order]
        counts = np.cumsum(m["delta_count"][events][order])
        instants = np.unique(np.concatenate([times, forward_ends, backward_ends]))
        recorded = np.zeros(instants.size, dtype=np.int64)
        if times.size:
            last = np.searchsorted(times, instants, side="right") - 1
            recorded = np.where(last >= 0, counts[np.maximum(last, 0)], 0)
        expected = (np.searchsorted(forward_ends, instants, side="right")
                    - np.searchsorted(backward_ends, instants, side="right"))
        for instant, got, want in zip(instants.tolist(), recorded.tolist(), expected.tolist(), strict=True):
            if got != want:
                device = trace.info.stage_to_rank[stage]
                found.append(Violation(device, -1, f"stage {stage}",
                                       f"holds {got} stashed activations at {instant!r} s, but F done minus "
                                       f"B done is {want}"))
                break
    return found


def find_memory_floor_violations(trace: Trace) -> list[Violation]:
    """No stage's peak memory is below its weights plus its optimizer state."""
    multiplier = float(trace.info.optimizer_state_multiplier)
    found = []
    for stage in compute_metrics(trace).stages:
        params = float(trace.info.param_bytes[stage.stage])
        floor = params * (1.0 + multiplier)
        if stage.peak_memory_bytes < floor:
            found.append(Violation(stage.device, -1, f"stage {stage.stage}",
                                   f"peak memory {stage.peak_memory_bytes!r} B is below weights + optimizer "
                                   f"state {floor!r} B"))
    return found


def find_scaling_violations(base: Trace, scaled: Trace, factor: float, *, rel_tol: float = 1e-12) -> list[Violation]:
    """Scaling every time by ``factor`` must scale every span's start and end by ``factor``."""
    first, second = _index(base), _index(scaled)
    found = []
    for kind, table, other in (("compute", first.compute, second.compute), ("send", first.sends, second.sends)):
        for op, row in table.items():
            twin = other.get(op)
            if twin is None:
                found.append(Violation(row.device, row.position, str(op), f"has no {kind} span in the scaled run"))
                continue
            for name, value, scaled_value in (("start", row.start_s, twin.start_s), ("end", row.end_s, twin.end_s)):
                if not math.isclose(value * factor, scaled_value, rel_tol=rel_tol, abs_tol=1e-300):
                    found.append(Violation(row.device, row.position, str(op),
                                           f"{kind} {name} {scaled_value!r} s is not {factor!r} x {value!r} s"))
    return found


def find_makespan_increase(candidate: Trace, reference: Trace, why: str) -> list[Violation]:
    """``candidate`` must not end later than ``reference`` (``why`` says why it should not)."""
    if candidate.makespan_s > reference.makespan_s:
        message = f"{candidate.makespan_s!r} s > {reference.makespan_s!r} s although {why}"
        return [Violation(-1, -1, "makespan", message)]
    return []
