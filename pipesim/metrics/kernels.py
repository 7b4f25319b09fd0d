"""Metrics as single passes over a trace's columns, compiled by numba when installed (pipesim.jit).

Each kernel gives the grouped numpy code's results bit for bit (the same floating-point
operations in the same order) or reports that its shortcut does not apply (rows not in an
engine's order, two waits with one key), and the caller then uses the numpy code.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from pipesim.engine.trace import CATEGORIES, KINDS, STREAMS, Trace
from pipesim.jit import jit

_F, _B, _I, _W, _U = range(len(KINDS))
_COMPUTE, _SEND = STREAMS.index("compute"), STREAMS.index("send")
_ACTIVATIONS, _WEIGHTS = CATEGORIES.index("activations"), CATEGORIES.index("weights")
_NUM_KINDS, _NUM_CATEGORIES = len(KINDS), len(CATEGORIES)
# Largest table of waits (stages x kinds x microbatches) the exposure kernel allocates.
MAX_TABLE = 1 << 26

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@jit
def _exposed(stream: IntArray, device: IntArray, stage: IntArray, kind: IntArray, micro: IntArray,
             start: FloatArray, end: FloatArray, peer: IntArray, position: IntArray, low: float, high: float,
             num_devices: int, num_stages: int, per_stage: bool) -> tuple[FloatArray, bool]:
    """Exposed communication per stage (or device); not applicable (False) unless the compute
    spans are stored in (device, position) order, as the engines write them."""
    num_groups = num_stages if per_stage else num_devices
    sums = np.zeros(num_groups)
    num_compute = 0
    total, num_slots = 1, 2
    for r in range(stream.size):
        total = max(total, micro[r] + 1)
        num_slots = max(num_slots, stage[r] + 2)
        if stream[r] == _COMPUTE:
            num_compute += 1
    if num_slots * _NUM_KINDS * total > MAX_TABLE:
        return sums, False
    rows = np.empty(num_compute, dtype=np.int64)
    j = 0
    for r in range(stream.size):
        if stream[r] == _COMPUTE:
            if j > 0 and (device[r] < device[rows[j - 1]]
                          or (device[r] == device[rows[j - 1]] and position[r] <= position[rows[j - 1]])):
                return sums, False
            rows[j] = r
            j += 1
    sums = np.zeros(num_groups)
    table = np.full(num_slots * _NUM_KINDS * total, -1, dtype=np.int64)
    gap_start = np.zeros(rows.size)
    previous = 0.0
    last_device = -1
    for j in range(rows.size):
        r = rows[j]
        if j == 0 or device[r] != last_device:
            previous = 0.0
            last_device = device[r]
        if start[r] > previous:
            if stage[r] < -1 or micro[r] < 0 or stage[r] + 1 >= num_slots or kind[r] >= _NUM_KINDS:
                return sums, False
            key = ((stage[r] + 1) * _NUM_KINDS + kind[r]) * total + micro[r]
            if table[key] != -1:
                return sums, False
            table[key] = j
            gap_start[j] = previous
        previous = end[r]
    for s in range(stream.size):
        if stream[s] != _SEND or peer[s] < 0 or peer[s] >= num_devices:
            continue
        forward = kind[s] == _F
        for candidate in range(1 if forward else 2):
            if forward:
                target, target_kind = stage[s] + 1, _F
            else:
                target, target_kind = stage[s] - 1, (_B if candidate == 0 else _I)
            slot = target + 1
            if slot < 0 or slot >= num_slots or micro[s] < 0 or micro[s] >= total:
                continue
            j = table[(slot * _NUM_KINDS + target_kind) * total + micro[s]]
            if j < 0 or device[rows[j]] != peer[s]:
                continue
            low_edge = max(max(gap_start[j], start[s]), low)
            high_edge = min(min(start[rows[j]], end[s]), high)
            overlap = high_edge - low_edge
            if overlap > 0.0:
                group = min(max(target, 0), max(num_stages - 1, 0)) if per_stage else peer[s]
                sums[group] += overlap
    return sums, True


@jit
def _levels(keys: IntArray, time: FloatArray, category: IntArray, delta: FloatArray, count: IntArray,
            num_groups: int) -> tuple[FloatArray, FloatArray, IntArray, IntArray]:
    """Peak, breakdown at the peak, most weight versions and stashed microbatches per group of
    memory events whose times never decrease: a running level per category (row by row, as a
    cumulative sum down a table of the group's events does it), read after each instant.

    Events are read in stored order, each group keeping its own levels; a group's instant
    is read when its next event comes later (or at the end)."""
    peaks = np.zeros(num_groups)
    breakdown = np.zeros((num_groups, _NUM_CATEGORIES))
    versions = np.zeros(num_groups, dtype=np.int64)
    inflight = np.zeros(num_groups, dtype=np.int64)
    level = np.zeros((num_groups, _NUM_CATEGORIES))
    held = np.zeros((num_groups, _NUM_CATEGORIES), dtype=np.int64)
    pending = np.zeros(num_groups, dtype=np.bool_)
    seen = np.zeros(num_groups, dtype=np.bool_)
    instant = np.zeros(num_groups)
    for i in range(keys.size + num_groups):
        # After the events, one step per group reads its last instant.
        g = keys[i] if i < keys.size else i - keys.size
        if g < 0 or g >= num_groups:
            continue
        if pending[g] and (i >= keys.size or time[i] != instant[g]):
            total = 0.0
            for q in range(_NUM_CATEGORIES):
                total += level[g, q]
            if not seen[g] or total > peaks[g]:
                peaks[g] = total
                breakdown[g, :] = level[g, :]
            if not seen[g] or held[g, _WEIGHTS] > versions[g]:
                versions[g] = held[g, _WEIGHTS]
            if not seen[g] or held[g, _ACTIVATIONS] > inflight[g]:
                inflight[g] = held[g, _ACTIVATIONS]
            seen[g] = True
        if i >= keys.size:
            continue
        c = category[i]
        if pending[g]:
            for q in range(_NUM_CATEGORIES):
                level[g, q] = level[g, q] + (delta[i] if q == c else 0.0)
        else:
            level[g, c] = delta[i]
        held[g, c] += count[i]
        pending[g] = True
        instant[g] = time[i]
    return peaks, breakdown, versions, inflight


@jit
def _staleness(stream: IntArray, key: IntArray, kind: IntArray, micro: IntArray, version: IntArray,
               position: IntArray, num_groups: int, total: int) -> tuple[IntArray, FloatArray, IntArray, bool]:
    """Forward delay (max, mean) and discrepancy (max) per group of compute spans (``key``, the
    group of each span, -1 for none; see pipesim.metrics.staleness)."""
    delay_max = np.zeros(num_groups, dtype=np.int64)
    delay_mean = np.zeros(num_groups)
    discrepancy_max = np.zeros(num_groups, dtype=np.int64)
    forward_version = np.full(num_groups * total, -1, dtype=np.int64)
    num_updates = np.zeros(num_groups + 1, dtype=np.int64)
    for r in range(stream.size):
        if stream[r] != _COMPUTE or key[r] < 0 or key[r] >= num_groups:
            continue
        if kind[r] == _U:
            num_updates[key[r] + 1] += 1
        elif micro[r] < 0 or micro[r] >= total:
            return delay_max, delay_mean, discrepancy_max, False
        elif kind[r] == _F:
            forward_version[key[r] * total + micro[r]] = version[r]
    starts = np.cumsum(num_updates)
    update_position = np.empty(starts[num_groups], dtype=np.int64)
    update_version = np.empty(starts[num_groups], dtype=np.int64)
    fill = starts[:num_groups].copy()
    has_discrepancy = np.zeros(num_groups, dtype=np.bool_)
    for r in range(stream.size):
        if stream[r] != _COMPUTE or key[r] < 0 or key[r] >= num_groups:
            continue
        g = key[r]
        if kind[r] == _U:
            update_position[fill[g]] = position[r]
            update_version[fill[g]] = version[r]
            fill[g] += 1
        elif kind[r] == _B or kind[r] == _I:
            value = version[r] - forward_version[g * total + micro[r]]
            if not has_discrepancy[g] or value > discrepancy_max[g]:
                discrepancy_max[g] = value
            has_discrepancy[g] = True
    for g in range(num_groups):
        first, stop = starts[g], starts[g + 1]
        order = np.argsort(update_position[first:stop], kind="mergesort")
        update_position[first:stop] = update_position[first:stop][order]
        update_version[first:stop] = update_version[first:stop][order]
    delay_sum = np.zeros(num_groups, dtype=np.int64)
    delay_count = np.zeros(num_groups, dtype=np.int64)
    for r in range(stream.size):
        if stream[r] != _COMPUTE or key[r] < 0 or key[r] >= num_groups or (kind[r] != _B and kind[r] != _W):
            continue
        g = key[r]
        first, stop = starts[g], starts[g + 1]
        index = first + np.searchsorted(update_position[first:stop], position[r])
        if index >= stop:
            continue
        value = update_version[index] - forward_version[g * total + micro[r]]
        if delay_count[g] == 0 or value > delay_max[g]:
            delay_max[g] = value
        delay_sum[g] += value
        delay_count[g] += 1
    for g in range(num_groups):
        if delay_count[g]:
            delay_mean[g] = float(delay_sum[g]) / float(delay_count[g])
    return delay_max, delay_mean, discrepancy_max, True


@jit
def _minibatch_ends(stream: IntArray, minibatch: IntArray, end: FloatArray, num: int) -> tuple[FloatArray, bool]:
    """Per minibatch, the largest end of its compute spans (0 without any); False for a
    minibatch index outside 0..num-1."""
    ends = np.zeros(num)
    for r in range(stream.size):
        if stream[r] == _COMPUTE:
            k = minibatch[r]
            if k < 0 or k >= num:
                return ends, False
            if ends[k] == ends[k] and not end[r] <= ends[k]:  # as np.maximum: a NaN wins and stays
                ends[k] = end[r]
    return ends, True


def minibatch_ends(stream: IntArray, minibatch: IntArray, end: FloatArray, num: int) -> FloatArray | None:
    """pipesim.metrics.minibatch_ends, or None for a minibatch index out of range (numpy's
    ``maximum.at`` then raises or wraps as it does)."""
    ends, ok = _minibatch_ends(stream, minibatch, end, num)
    return ends if ok else None


def exposed_communication(trace: Trace, num_devices: int, num_stages: int, low: float, high: float, *,
                          per_stage: bool = True) -> list[float] | None:
    """Per stage (or device) exposed communication (pipesim.metrics.grouped), or None where the
    kernel does not apply: compute rows not in (device, position) order, or ambiguous waits."""
    s = trace.spans
    sums, ok = _exposed(s["stream"], s["device"], s["stage"], s["kind"], s["microbatch"], s["start_s"], s["end_s"],
                        s["peer"], s["position"], float(low), float(high), num_devices, num_stages, per_stage)
    return sums.tolist() if ok else None


def level_peaks(trace: Trace, keys: IntArray, num_groups: int) -> tuple[
        FloatArray, FloatArray, IntArray, IntArray] | None:
    """pipesim.metrics.grouped.level_peaks, or None when the memory events are not in time order."""
    m = trace.memory
    times = m["time_s"]
    if times.size > 1 and not bool((times[1:] >= times[:-1]).all()):
        return None
    return _levels(keys, times, m["category"], m["delta_bytes"], m["delta_count"], num_groups)


def staleness_all(trace: Trace, key: IntArray, num_groups: int) -> tuple[IntArray, FloatArray, IntArray] | None:
    """pipesim.metrics.grouped.staleness_all of the compute spans with ``key`` in 0..num_groups-1,
    or None for microbatch indices out of range."""
    s = trace.spans
    total = int(trace.meta["num_minibatches"]) * int(trace.meta["num_microbatches"])
    delay_max, delay_mean, discrepancy_max, ok = _staleness(
        s["stream"], key, s["kind"], s["microbatch"], s["weight_version"], s["position"], num_groups, total)
    return (delay_max, delay_mean, discrepancy_max) if ok else None
