"""Metrics of many groups at once in numpy (stages or devices): the path used without numba."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from pipesim.engine.trace import CATEGORIES, KINDS, STREAMS, Trace

_F, _B, _I, _W, _U = range(len(KINDS))
_COMPUTE, _SEND = STREAMS.index("compute"), STREAMS.index("send")
_ACTIVATIONS, _WEIGHTS = CATEGORIES.index("activations"), CATEGORIES.index("weights")


def segments(keys: npt.NDArray[np.int64], num_groups: int) -> tuple[npt.NDArray[np.intp] | None,
                                                                      npt.NDArray[np.intp]]:
    """Rows grouped by key 0..num_groups-1, each group in stored order: the stable sorting
    permutation (None when the keys are already in order, as an engine writes them) and the
    bounds of each group in it (rows with other keys fall outside every group)."""
    if keys.size > 1 and not bool((keys[1:] >= keys[:-1]).all()):
        order = np.argsort(narrow(keys, num_groups), kind="stable")
        sorted_keys = keys[order]
    else:
        order, sorted_keys = None, keys
    return order, np.searchsorted(sorted_keys, np.arange(num_groups + 1), side="left")


def narrow(keys: npt.NDArray[np.int64], num_groups: int) -> npt.NDArray[Any]:
    """The keys as int16 when they fit (numpy sorts those stably by radix, in linear time)."""
    if num_groups < 2**15 and keys.size and int(keys.min()) >= -(2**15) and int(keys.max()) < 2**15:
        return keys.astype(np.int16)
    return keys


def level_peaks(trace: Trace, keys: npt.NDArray[np.int64], num_groups: int) -> tuple[
        npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Per group of memory events (keyed by stage or device): the peak of the summed levels, the
    levels by category at that peak, the most weight versions and stashed microbatches held.

    A group's levels are running sums of its events in time order (ties in stored order),
    read after the last event of each instant; the peak is the first largest total. Every
    group's sums run in one table (groups by events by categories), each along its own row,
    so each level is the same sequence of additions as a loop over that group alone.
    """
    m = trace.memory
    peaks = np.zeros(num_groups)
    breakdown = np.zeros((num_groups, len(CATEGORIES)))
    versions = np.zeros(num_groups, dtype=np.int64)
    inflight = np.zeros(num_groups, dtype=np.int64)
    times = m["time_s"]
    if keys.size == 0 or num_groups == 0:
        return peaks, breakdown, versions, inflight
    if keys.size > 1 and bool((times[1:] >= times[:-1]).all()):
        order = np.argsort(narrow(keys, num_groups), kind="stable")
    else:
        order = np.lexsort((times, keys))
    bounds = np.searchsorted(keys[order], np.arange(num_groups + 1), side="left")
    order = order[bounds[0]:bounds[-1]]
    sizes = np.diff(bounds)
    group = np.repeat(np.arange(num_groups), sizes)
    index = np.arange(order.size) - np.repeat(bounds[:-1] - bounds[0], sizes)
    category = m["category"][order]
    width = int(sizes.max())
    levels = np.zeros((num_groups, width, len(CATEGORIES)))
    levels[group, index, category] = m["delta_bytes"][order]
    np.cumsum(levels, axis=1, out=levels)
    counts = np.zeros((num_groups, width, len(CATEGORIES)), dtype=np.int64)
    counts[group, index, category] = m["delta_count"][order]
    np.cumsum(counts, axis=1, out=counts)
    times = times[order]
    last = np.ones(order.size, dtype=bool)
    last[:-1] = (times[1:] != times[:-1]) | (group[1:] != group[:-1])
    group, index = group[last], index[last]
    at_last = levels[group, index]
    totals = at_last.sum(axis=1)
    firsts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    present = group[firsts]
    largest = np.maximum.reduceat(totals, firsts)
    peak_rows = np.flatnonzero(totals == np.repeat(largest, np.diff(np.r_[firsts, group.size])))
    peak_rows = peak_rows[np.r_[True, group[peak_rows][1:] != group[peak_rows][:-1]]]
    peaks[present] = totals[peak_rows]
    breakdown[present] = at_last[peak_rows]
    held = counts[group, index]
    versions[present] = np.maximum.reduceat(held[:, _WEIGHTS], firsts)
    inflight[present] = np.maximum.reduceat(held[:, _ACTIVATIONS], firsts)
    return peaks, breakdown, versions, inflight


def staleness_all(trace: Trace, rows: npt.NDArray[np.intp], group: npt.NDArray[np.int64], num_groups: int) -> tuple[
        npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """Forward delay (max, mean) and discrepancy (max) per group of compute spans (``rows``,
    each of one stage, ``group`` its index); 0 where a group has none. Integer delays sum
    exactly in any order, so the means equal a loop's."""
    s = trace.spans
    kinds = s["kind"][rows]
    micro = s["microbatch"][rows]
    version = s["weight_version"][rows]
    position = s["position"][rows]
    total = int(trace.meta["num_minibatches"]) * int(trace.meta["num_microbatches"])
    # Version each (group, microbatch)'s F ran on; -1 where it has none.
    forward_version = np.full(num_groups * total, -1, dtype=np.int64)
    forwards = kinds == _F
    forward_version[group[forwards] * total + micro[forwards]] = version[forwards]
    backward = (kinds == _B) | (kinds == _I)
    discrepancy = version[backward] - forward_version[group[backward] * total + micro[backward]]
    discrepancy_max = group_max(group[backward], discrepancy, num_groups)
    # The consuming update: the first U of the group at or after the last backward's position.
    updates = np.flatnonzero(kinds == _U)
    last_backward = np.flatnonzero((kinds == _B) | (kinds == _W))
    low = int(position.min(initial=0))
    span = int(position.max(initial=0)) - low + 2
    update_keys = group[updates] * span + (position[updates] - low)
    update_order = np.argsort(update_keys)
    update_keys = update_keys[update_order]
    update_versions = version[updates][update_order]
    index = np.searchsorted(update_keys, group[last_backward] * span + (position[last_backward] - low))
    consumed = index < update_keys.size
    consumed[consumed] = update_keys[index[consumed]] // span == group[last_backward][consumed]
    rows_consumed = last_backward[consumed]
    delays = update_versions[index[consumed]] - forward_version[group[rows_consumed] * total + micro[rows_consumed]]
    consumed_group = group[rows_consumed]
    delay_max = group_max(consumed_group, delays, num_groups)
    count = np.bincount(consumed_group, minlength=num_groups)
    delay_sum = np.bincount(consumed_group, weights=delays.astype(np.float64), minlength=num_groups)
    delay_mean = np.zeros(num_groups)
    np.divide(delay_sum, count, out=delay_mean, where=count > 0)
    return delay_max, delay_mean, discrepancy_max


def group_max(group: npt.NDArray[np.int64], values: npt.NDArray[np.int64], num_groups: int) -> npt.NDArray[np.int64]:
    """Largest value per group, 0 for a group without values."""
    largest = np.full(num_groups, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(largest, group, values)
    largest[np.bincount(group, minlength=num_groups) == 0] = 0
    return largest


def exposed_communication_all(trace: Trace, num_devices: int, num_stages: int, low: float, high: float, *,
                               per_stage: bool = True, compute_rows: npt.NDArray[np.intp] | None = None) -> list[float]:
    """Per stage (or per device), idle time before an op overlapping the arrival of the send it
    waited for.

    A gap is the idle time before a compute op (after the previous op of its device in
    position order, or 0). A send to a device is matched to the gap of the op it feeds
    (an activation to the F of the next stage, a gradient to the B or I of the one before),
    and their overlap inside [low, high] is charged to the stage of that op (so a device
    holding several stages counts each wait once, for the stage that waited), or with
    ``per_stage=False`` summed per device. Sums run in send order, as a loop would.
    """
    s = trace.spans
    rows = np.flatnonzero(s["stream"] == _COMPUTE) if compute_rows is None else compute_rows
    device, position = s["device"][rows], s["position"][rows]
    if rows.size > 1:
        step, advance = np.diff(device), np.diff(position)
        if not bool(((step > 0) | ((step == 0) & (advance > 0))).all()):
            order = np.lexsort((position, device))
            rows, device = rows[order], device[order]
    starts, ends = s["start_s"][rows], s["end_s"][rows]
    previous = np.empty_like(ends)
    if rows.size:
        previous[0] = 0.0
        previous[1:] = ends[:-1]
        previous[1:][device[1:] != device[:-1]] = 0.0
    gap = np.flatnonzero(starts > previous)
    total = max(int(s["microbatch"].max(initial=0)) + 1, 1)
    stages = max(int(s["stage"].max(initial=0)) + 2, 2)

    def key(dev: npt.NDArray[np.int64], stage: npt.NDArray[np.int64], kind: int | npt.NDArray[np.int64],
            micro: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        return ((dev * stages + stage + 1) * len(KINDS) + kind) * total + micro

    num_groups = num_stages if per_stage else num_devices
    sends = np.flatnonzero(s["stream"] == _SEND)
    if gap.size == 0 or sends.size == 0:
        return [0.0] * num_groups
    gap_rows = rows[gap]
    gap_keys = key(device[gap], s["stage"][gap_rows], s["kind"][gap_rows], s["microbatch"][gap_rows])
    order = np.argsort(gap_keys, kind="stable")
    sorted_keys = gap_keys[order]
    gap_start, gap_end = previous[gap][order], starts[gap][order]

    # Sends wholly outside the window overlap nothing; dropping them changes no sum.
    send_start, send_end, peer = s["start_s"][sends], s["end_s"][sends], s["peer"][sends]
    sends = sends[(peer >= 0) & (peer < num_devices) & (send_end > low) & (send_start < high)]
    peer, stage, kind, micro = s["peer"][sends], s["stage"][sends], s["kind"][sends], s["microbatch"][sends]
    forward = kind == _F
    # Candidates in loop order: per send, F's target, or B's then I's.
    cand_send = np.repeat(np.arange(sends.size), np.where(forward, 1, 2))
    second = np.zeros(cand_send.size, dtype=bool)
    second[1:] = cand_send[1:] == cand_send[:-1]
    cand_forward = forward[cand_send]
    cand_kind = np.where(cand_forward, _F, np.where(second, _I, _B))
    cand_stage = stage[cand_send] + np.where(cand_forward, 1, -1)
    cand_keys = key(peer[cand_send], cand_stage, cand_kind, micro[cand_send])
    found = np.searchsorted(sorted_keys, cand_keys, side="right") - 1
    where = np.maximum(found, 0)
    hit = np.flatnonzero((found >= 0) & (sorted_keys[where] == cand_keys))
    where, cand_send = where[hit], cand_send[hit]
    low_edge = np.maximum(np.maximum(gap_start[where], s["start_s"][sends][cand_send]), low)
    high_edge = np.minimum(np.minimum(gap_end[where], s["end_s"][sends][cand_send]), high)
    overlap = high_edge - low_edge
    positive = overlap > 0.0
    groups = (np.clip(cand_stage[hit], 0, max(num_stages - 1, 0)) if per_stage else peer[cand_send])[positive]
    sums: list[float] = sequential_sums(groups, overlap[positive], num_groups).tolist()
    return sums


def sequential_sums(groups: npt.NDArray[np.int64], values: npt.NDArray[np.float64],
                     num_groups: int) -> npt.NDArray[np.float64]:
    """Per group 0..num_groups-1, its positive ``values`` added one after another in the given
    order, as a loop would (bit for bit): each group's values go to its own row of a table,
    padded with zeros (adding 0.0 changes no positive sum), summed along the rows."""
    inside = (groups >= 0) & (groups < num_groups)
    groups, values = groups[inside], values[inside]
    if groups.size == 0:
        return np.zeros(num_groups)
    order = np.argsort(groups, kind="stable")
    groups = groups[order]
    sizes = np.bincount(groups, minlength=num_groups)
    starts = np.cumsum(sizes) - sizes
    table = np.zeros((num_groups, int(sizes.max())))
    table[groups, np.arange(groups.size) - starts[groups]] = values[order]
    return np.cumsum(table, axis=1)[:, -1]
