"""Metrics as single passes over a trace's columns, compiled by numba when installed (pipesim.jit).

Each public function takes ``compiled``: True calls the numba-compiled kernel (the kernel
itself where numba is absent), False its plain-Python form (``py_func``); both give the same
bits. Rows in any stored order are accepted: a function puts them in the order its kernel
reads (a stable sort) only when they are not in it already, as the engines write them.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from pipesim.engine.trace import CATEGORIES, KINDS, STREAMS, Trace, shared_position
from pipesim.errors import ConfigError
from pipesim.jit import jit, pick

_F, _B, _I, _W, _U = range(len(KINDS))
_COMPUTE, _SEND = STREAMS.index("compute"), STREAMS.index("send")
_ACTIVATIONS, _WEIGHTS = CATEGORIES.index("activations"), CATEGORIES.index("weights")
_NUM_KINDS, _NUM_CATEGORIES = len(KINDS), len(CATEGORIES)  # 5 categories: weights .. working
# Largest table of waits (stages x kinds x microbatches) the exposure kernel allocates; past it,
# microbatch indices are renumbered densely (only their equality matters there).
MAX_TABLE = 1 << 26

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


# What _exposed found: the sums are done, or the caller must first sort the compute rows,
# renumber the microbatches, or reject the trace.
_DONE, _UNSORTED, _TOO_LARGE, _OUT_OF_RANGE = range(4)


@jit
def _exposed(stream: IntArray, device: IntArray, stage: IntArray, kind: IntArray, micro: IntArray,
             start: FloatArray, end: FloatArray, peer: IntArray, position: IntArray, rows: IntArray,
             low: float, high: float, num_devices: int, num_stages: int, per_stage: bool) -> tuple[FloatArray, int]:
    """Exposed communication per stage (or device) from the compute spans ``rows``, which must
    be in (device, position) order (else _UNSORTED); see ``exposed_communication``.

    A gap is the idle time before a compute op after the previous op of its device (from 0 for
    the device's first). A send is matched to the gap of the op it feeds on its peer (an
    activation to the F of the next stage, a gradient to the B, then the I, of the one before;
    of several gaps with that op's key there, the last), and their overlap inside
    [low, high] is added, in send order, to that op's stage (or the peer device)."""
    num_groups = num_stages if per_stage else num_devices
    sums = np.zeros(num_groups)
    total = 1
    for r in range(stream.size):
        if stage[r] < 0 or stage[r] >= num_stages or micro[r] < 0 or kind[r] < 0 or kind[r] >= _NUM_KINDS:
            return sums, _OUT_OF_RANGE
        total = max(total, micro[r] + 1)
    # Slots for target stages -1..num_stages (a gradient from stage 0, an activation from the last).
    num_slots = num_stages + 2
    if num_slots * _NUM_KINDS * total > MAX_TABLE:
        return sums, _TOO_LARGE
    table = np.full(num_slots * _NUM_KINDS * total, -1, dtype=np.int64)
    # Per gap j (written and read for gaps only): where it starts, and the gap before it with its key.
    gap_start = np.empty(rows.size)
    earlier = np.empty(rows.size, dtype=np.int64)
    previous = 0.0
    last_device = -1
    for j in range(rows.size):
        r = rows[j]
        if j > 0 and (device[r] < last_device or (device[r] == last_device and position[r] <= position[rows[j - 1]])):
            return sums, _UNSORTED
        if j == 0 or device[r] != last_device:
            previous = 0.0
            last_device = device[r]
        if start[r] > previous:
            key = ((stage[r] + 1) * _NUM_KINDS + kind[r]) * total + micro[r]
            earlier[j] = table[key]
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
            j = table[((target + 1) * _NUM_KINDS + target_kind) * total + micro[s]]
            while j >= 0 and device[rows[j]] != peer[s]:
                j = earlier[j]
            if j < 0:
                continue
            low_edge = max(max(gap_start[j], start[s]), low)
            high_edge = min(min(start[rows[j]], end[s]), high)
            overlap = high_edge - low_edge
            if overlap > 0.0:
                group = min(max(target, 0), max(num_stages - 1, 0)) if per_stage else peer[s]
                sums[group] += overlap
    return sums, _DONE


@jit
def _levels(keys: IntArray, time: FloatArray, category: IntArray, delta: FloatArray, count: IntArray,
            num_groups: int) -> tuple[FloatArray, FloatArray, IntArray, IntArray, bool]:
    """Peak, breakdown at the peak, most weight versions and stashed microbatches per group of
    memory events whose times never decrease: a running level per category (row by row, as a
    cumulative sum down a table of the group's events does it), read after each instant.
    False (the rest not to be read) when some event's time is not at least its predecessor's.

    Events are read in stored order, each group keeping its own levels; a group's instant
    is read when its next event comes later (or at the end). The table's sum adds 0.0 to the
    other categories at each row, which changes only a -0.0: a group's first category may hold
    one until another category's event comes (``signed``), and is then made 0.0."""
    peaks = np.zeros(num_groups)
    breakdown = np.zeros((num_groups, _NUM_CATEGORIES))
    versions = np.zeros(num_groups, dtype=np.int64)
    inflight = np.zeros(num_groups, dtype=np.int64)
    level = np.zeros((num_groups, _NUM_CATEGORIES))
    held = np.zeros((num_groups, _NUM_CATEGORIES), dtype=np.int64)
    pending = np.zeros(num_groups, dtype=np.bool_)
    seen = np.zeros(num_groups, dtype=np.bool_)
    signed = np.full(num_groups, -1, dtype=np.int64)  # the one category that may hold -0.0, or -1
    instant = np.zeros(num_groups)
    for i in range(keys.size + num_groups):
        # After the events, one step per group reads its last instant.
        if 0 < i < keys.size and not time[i] >= time[i - 1]:
            return peaks, breakdown, versions, inflight, False
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
        if c < 0 or c >= _NUM_CATEGORIES:
            continue
        if pending[g]:
            if signed[g] >= 0 and signed[g] != c:
                level[g, signed[g]] += 0.0
                signed[g] = -1
            level[g, c] += delta[i]
        else:
            level[g, c] = delta[i]
            signed[g] = c
        held[g, c] += count[i]
        pending[g] = True
        instant[g] = time[i]
    return peaks, breakdown, versions, inflight, True


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


@jit
def _first_drained(stream: IntArray, device: IntArray, kind: IntArray, minibatch: IntArray, end: FloatArray,
                   num: int) -> int:
    """The first minibatch with a compute span ending after the last forward of its device has
    ended; ``num`` when none (see ``first_drained``)."""
    num_devices = 0
    for r in range(stream.size):
        if stream[r] == _COMPUTE and device[r] >= num_devices:
            num_devices = device[r] + 1
    last = np.full(num_devices, -np.inf)
    for r in range(stream.size):
        if stream[r] == _COMPUTE and kind[r] == _F and device[r] >= 0 and end[r] > last[device[r]]:
            last[device[r]] = end[r]
    first = num
    for r in range(stream.size):
        if stream[r] == _COMPUTE and device[r] >= 0 and end[r] > last[device[r]] and minibatch[r] < first:
            first = minibatch[r]
    return first


def first_drained(stream: IntArray, device: IntArray, kind: IntArray, minibatch: IntArray, end: FloatArray,
                  num: int, *, compiled: bool) -> int:
    """The first minibatch 0..num-1 with a compute span that ends after the last forward of its
    device has ended (``num`` when there is none): from there on, the devices drain.

    In the drain a device runs backwards alone; where it ran them beside forwards (PipeMare's
    paper pipeline, a step of max(F, B)) they go faster than in the steady state, and where the
    warm-up is deeper than a minibatch (PipeDream with m < p), the drain takes more than the
    last minibatch.
    """
    return int(pick(_first_drained, compiled)(stream, device, kind, minibatch, end, num))


def minibatch_ends(stream: IntArray, minibatch: IntArray, end: FloatArray, num: int, *, compiled: bool) -> FloatArray:
    """Per minibatch 0..num-1, the largest end of its compute spans (0 without any).

    Raises:
        ConfigError: a compute span's minibatch index outside 0..num-1.
    """
    ends, ok = pick(_minibatch_ends, compiled)(stream, minibatch, end, num)
    if not ok:
        bad = minibatch[(stream == _COMPUTE) & ((minibatch < 0) | (minibatch >= num))]
        raise ConfigError("spans.minibatch", int(bad[0]), f"must be in 0..{num - 1} (num_minibatches {num})")
    result: FloatArray = ends
    return result


def exposed_communication(trace: Trace, num_devices: int, num_stages: int, low: float, high: float, *,
                          per_stage: bool = True, compiled: bool,
                          compute_rows: npt.NDArray[np.intp] | None = None) -> list[float]:
    """Per stage (or, with ``per_stage=False``, per device) the idle time before an op that
    overlaps, inside [low, high], the arrival of the send the op waited for (see ``_exposed``).

    Args:
        compute_rows: the compute spans' rows, when the caller has them.

    Raises:
        ConfigError: a span's stage outside 0..num_stages-1, or a negative microbatch or kind.
    """
    s = trace.spans
    rows = np.flatnonzero(s["stream"] == _COMPUTE) if compute_rows is None else compute_rows
    micro = s["microbatch"]
    kernel = pick(_exposed, compiled)
    ordered = False
    while True:
        sums, status = kernel(s["stream"], s["device"], s["stage"], s["kind"], micro, s["start_s"], s["end_s"],
                              s["peer"], s["position"], rows.astype(np.int64, copy=False), float(low), float(high),
                              num_devices, num_stages, per_stage)
        if status == _DONE:
            found: list[float] = sums.tolist()
            return found
        if status == _UNSORTED and ordered:  # sorted by (device, position), two compute spans share both
            twice = shared_position(s, rows)
            assert twice is not None  # the kernel found rows out of (device, position) order
            raise twice
        if status == _UNSORTED:
            rows = rows[np.lexsort((s["position"][rows], s["device"][rows]))]
            ordered = True
        elif status == _TOO_LARGE and micro is s["microbatch"]:
            micro = np.unique(micro, return_inverse=True)[1].astype(np.int64).reshape(-1)
        else:
            raise _out_of_range(trace, num_stages)


def _out_of_range(trace: Trace, num_stages: int) -> ConfigError:
    """The error naming the first span column whose value the exposure kernel cannot index by."""
    s = trace.spans
    for column, bad, rule in (
        ("stage", (s["stage"] < 0) | (s["stage"] >= num_stages), f"must be in 0..{num_stages - 1}"),
        ("microbatch", s["microbatch"] < 0, "must be >= 0"),
        ("kind", (s["kind"] < 0) | (s["kind"] >= _NUM_KINDS), f"must be in 0..{_NUM_KINDS - 1}"),
    ):
        if bool(bad.any()):
            return ConfigError(f"spans.{column}", int(s[column][bad][0]), rule)
    return ConfigError("spans", trace.num_spans, f"need more than {MAX_TABLE} table cells for their waits")


def level_peaks(trace: Trace, keys: IntArray, num_groups: int, *, compiled: bool) -> tuple[
        FloatArray, FloatArray, IntArray, IntArray]:
    """Per group 0..num_groups-1 of memory events (``keys``: each event's group, by stage or
    device): the peak of the summed levels, the levels by category at that peak, the most
    weight versions and stashed microbatches held (see ``_levels``).

    A group's levels are running sums of its events in time order (ties in stored order),
    read after the last event of each instant; the peak is the first largest total. Events
    not in time order (as the engines write them) are first put in it by a stable sort.
    """
    m = trace.memory
    times, category, delta, count = m["time_s"], m["category"], m["delta_bytes"], m["delta_count"]
    kernel = pick(_levels, compiled)
    peaks, breakdown, versions, inflight, in_order = kernel(keys, times, category, delta, count, num_groups)
    if not in_order:
        order = np.argsort(times, kind="stable")
        peaks, breakdown, versions, inflight, _ = kernel(keys[order], times[order], category[order], delta[order],
                                                         count[order], num_groups)
    return peaks, breakdown, versions, inflight


def staleness_all(trace: Trace, key: IntArray, num_groups: int, *, compiled: bool) -> tuple[
        IntArray, FloatArray, IntArray]:
    """Forward delay (max, mean) and discrepancy (max) per group 0..num_groups-1 of compute
    spans (``key``: each span's group, outside 0..num_groups-1 for none); 0 where a group has
    none (see pipesim.metrics.staleness).

    Raises:
        ConfigError: an F, B, I or W with a microbatch outside 0..K*m-1.
    """
    s = trace.spans
    total = trace.info.num_minibatches * trace.info.num_microbatches
    delay_max, delay_mean, discrepancy_max, ok = pick(_staleness, compiled)(
        s["stream"], key, s["kind"], s["microbatch"], s["weight_version"], s["position"], num_groups, total)
    if not ok:
        micro = s["microbatch"]
        bad = micro[(s["stream"] == _COMPUTE) & (s["kind"] != _U) & ((micro < 0) | (micro >= total))]
        raise ConfigError("spans.microbatch", int(bad[0]), f"must be in 0..{total - 1} for F, B, I and W "
                          "(num_minibatches x num_microbatches)")
    return delay_max, delay_mean, discrepancy_max
