"""The metrics implementation of main before the vectorized rewrite, kept verbatim as the reference."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from pipesim.engine.trace import CATEGORIES, KINDS, STREAMS, Trace
from pipesim.metrics import Metrics, StageMetrics

_F, _B, _I, _W, _U = range(len(KINDS))
_COMPUTE, _SEND = STREAMS.index("compute"), STREAMS.index("send")
_ACTIVATIONS, _WEIGHTS = CATEGORIES.index("activations"), CATEGORIES.index("weights")


def minibatch_ends(trace: Trace) -> npt.NDArray[np.float64]:
    """End time of each minibatch: the end of its last compute op (its update included)."""
    s = trace.spans
    compute = s["stream"] == _COMPUTE
    num = int(trace.meta["num_minibatches"])
    ends = np.zeros(num)
    np.maximum.at(ends, s["minibatch"][compute], s["end_s"][compute])
    return ends


def steady_window(trace: Trace) -> tuple[float, float, int, int]:
    """``(start_s, end_s, warmup, cooldown)`` of the steady-state window (see Metrics)."""
    ends = minibatch_ends(trace)
    k = len(ends)
    if k >= 3:
        return float(ends[0]), float(ends[k - 2]), 1, 1
    if k == 2:
        return float(ends[0]), float(ends[1]), 1, 0
    return 0.0, trace.makespan_s, 0, 0


def _overlap(starts: npt.NDArray[np.float64], ends: npt.NDArray[np.float64], low: float, high: float) -> float:
    return float(np.clip(np.minimum(ends, high) - np.maximum(starts, low), 0.0, None).sum())


def _groups(keys: npt.NDArray[np.int64], num_groups: int) -> list[npt.NDArray[np.intp]]:
    """Row indices holding each key 0..num_groups-1, each group in stored order (one sort, not a
    mask per group)."""
    order = np.argsort(keys, kind="stable")
    bounds = np.searchsorted(keys[order], np.arange(num_groups + 1), side="left")
    return [order[bounds[i]:bounds[i + 1]] for i in range(num_groups)]


def _level_peak(trace: Trace, stage: int) -> tuple[float, dict[str, float], int, int]:
    """Peak bytes of a stage (levels after all events at one instant), its breakdown, and the
    most weight versions and stashed microbatches held."""
    return _level_peak_of(trace, np.flatnonzero(trace.memory["stage"] == stage))


def _level_peak_of(trace: Trace, rows: npt.NDArray[np.intp]) -> tuple[float, dict[str, float], int, int]:
    m = trace.memory
    times = m["time_s"][rows]
    order = np.argsort(times, kind="stable")
    times = times[order]
    categories = m["category"][rows][order]
    delta = m["delta_bytes"][rows][order]
    count = m["delta_count"][rows][order]
    if times.size == 0:
        return 0.0, {c: 0.0 for c in CATEGORIES}, 0, 0
    last_at_time = np.r_[times[1:] != times[:-1], True]
    levels = np.zeros((times.size, len(CATEGORIES)))
    levels[np.arange(times.size), categories] = delta
    levels = np.cumsum(levels, axis=0)[last_at_time]
    totals = levels.sum(axis=1)
    peak_row = int(np.argmax(totals))
    counts = np.zeros((times.size, len(CATEGORIES)), dtype=np.int64)
    counts[np.arange(times.size), categories] = count
    counts = np.cumsum(counts, axis=0)[last_at_time]
    breakdown = {c: float(levels[peak_row, i]) for i, c in enumerate(CATEGORIES)}
    return float(totals[peak_row]), breakdown, int(counts[:, _WEIGHTS].max()), int(counts[:, _ACTIVATIONS].max())


def staleness(trace: Trace, stage: int) -> tuple[int, float, int]:
    """``(forward_delay_max, forward_delay_mean, discrepancy_max)`` of a stage, from versions.

    The update that consumes microbatch i's gradient is the first U of the stage after i's
    B (or W) in the rank's order; forward delay = the version that U updates minus the
    version i's F ran on. Discrepancy = version of i's B (or I) minus version of its F.
    """
    s = trace.spans
    return _staleness_of(trace, np.flatnonzero((s["stage"] == stage) & (s["stream"] == _COMPUTE)))


def _staleness_of(trace: Trace, rows: npt.NDArray[np.intp]) -> tuple[int, float, int]:
    s = trace.spans
    kinds = s["kind"][rows]
    micro = s["microbatch"][rows]
    version = s["weight_version"][rows]
    position = s["position"][rows]
    total = int(trace.meta["num_minibatches"]) * int(trace.meta["num_microbatches"])
    forward_version = np.full(total, -1)
    forward_version[micro[kinds == _F]] = version[kinds == _F]
    backward = (kinds == _B) | (kinds == _I)
    discrepancy = version[backward] - forward_version[micro[backward]]
    last_backward = (kinds == _B) | (kinds == _W)
    updates = kinds == _U
    update_positions = position[updates]
    order = np.argsort(update_positions)
    update_positions = update_positions[order]
    update_versions = version[updates][order]
    index = np.searchsorted(update_positions, position[last_backward])
    consumed = index < update_positions.size
    delays = update_versions[index[consumed]] - forward_version[micro[last_backward][consumed]]
    return (
        int(delays.max()) if delays.size else 0,
        float(delays.mean()) if delays.size else 0.0,
        int(discrepancy.max()) if discrepancy.size else 0,
    )


def _exposed_communication(trace: Trace, device: int, low: float, high: float, stage: int | None = None) -> float:
    """Idle time on ``device`` before an op (of ``stage``, when given), overlapping the arrival of
    the send it waited for: an activation for F, a gradient (from B or I) for B or I."""
    num_devices, num_stages = int(trace.meta["num_ranks"]), int(trace.meta["num_stages"])
    if stage is None:
        return _exposed_communication_all(trace, num_devices, num_stages, low, high, per_stage=False)[device]
    if int(trace.meta["stage_to_rank"][stage]) != device:
        return 0.0
    return _exposed_communication_all(trace, num_devices, num_stages, low, high)[stage]


def _exposed_communication_all(trace: Trace, num_devices: int, num_stages: int, low: float, high: float, *,
                               per_stage: bool = True) -> list[float]:
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
    rows = np.flatnonzero(s["stream"] == _COMPUTE)
    rows = rows[np.lexsort((s["position"][rows], s["device"][rows]))]
    device = s["device"][rows]
    starts, ends = s["start_s"][rows], s["end_s"][rows]
    previous = np.r_[0.0, ends[:-1]]
    previous[np.r_[True, device[1:] != device[:-1]]] = 0.0
    gap = np.flatnonzero(starts > previous)
    total = max(int(s["microbatch"].max(initial=0)) + 1, 1)
    stages = max(int(s["stage"].max(initial=0)) + 2, 2)

    def key(dev: npt.NDArray[np.int64], stage: npt.NDArray[np.int64], kind: int | npt.NDArray[np.int64],
            micro: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        return ((dev * stages + stage + 1) * len(KINDS) + kind) * total + micro

    gap_rows = rows[gap]
    gap_keys = key(device[gap], s["stage"][gap_rows], s["kind"][gap_rows], s["microbatch"][gap_rows])
    order = np.argsort(gap_keys, kind="stable")
    sorted_keys = gap_keys[order]
    gap_start, gap_end = previous[gap][order], starts[gap][order]

    sends = np.flatnonzero((s["stream"] == _SEND) & (s["peer"] >= 0) & (s["peer"] < num_devices))
    peer, stage, kind, micro = s["peer"][sends], s["stage"][sends], s["kind"][sends], s["microbatch"][sends]
    forward = kind == _F
    # Candidates in loop order: per send, F's target, or B's then I's.
    cand_send = np.repeat(np.arange(sends.size), np.where(forward, 1, 2))
    second = np.r_[False, cand_send[1:] == cand_send[:-1]]
    cand_kind = np.where(forward[cand_send], _F, np.where(second, _I, _B))
    cand_stage = np.where(forward[cand_send], stage[cand_send] + 1, stage[cand_send] - 1)
    cand_keys = key(peer[cand_send], cand_stage, cand_kind, micro[cand_send])
    found = np.searchsorted(sorted_keys, cand_keys, side="right") - 1
    hit = (found >= 0) & (sorted_keys[np.maximum(found, 0)] == cand_keys) if sorted_keys.size else found < -1
    where = np.maximum(found, 0)
    send_start, send_end = s["start_s"][sends][cand_send], s["end_s"][sends][cand_send]
    if sorted_keys.size:
        low_edge = np.maximum(np.maximum(gap_start[where], send_start), low)
        high_edge = np.minimum(np.minimum(gap_end[where], send_end), high)
        overlap = np.where(hit, np.maximum(0.0, high_edge - low_edge), 0.0)
    else:
        overlap = np.zeros(cand_send.size)
    exposed = []
    keys, num_groups = (np.clip(cand_stage, 0, max(num_stages - 1, 0)), num_stages) if per_stage else (
        peer[cand_send], num_devices)
    for group in _groups(keys, num_groups):
        exposed.append(float(np.cumsum(overlap[group])[-1]) if group.size else 0.0)
    return exposed


def compute_metrics(trace: Trace) -> Metrics:
    """All metrics of a trace."""
    meta = trace.meta
    s = trace.spans
    low, high, warmup, cooldown = steady_window(trace)
    steady = max(1, int(meta["num_minibatches"]) - warmup - cooldown)
    iteration = (high - low) / steady
    width = high - low
    compute = s["stream"] == _COMPUTE
    stage_to_rank = list(meta["stage_to_rank"])
    num_ranks = int(meta["num_ranks"])
    compute_rows = np.flatnonzero(compute)
    utilization_by_device = []
    for rows in _groups(s["device"][compute_rows], num_ranks):
        mine = compute_rows[rows]
        busy = _overlap(s["start_s"][mine], s["end_s"][mine], low, high)
        utilization_by_device.append(busy / width if width > 0 else 1.0)
    exposed = _exposed_communication_all(trace, num_ranks, len(stage_to_rank), low, high)
    memory_rows = _groups(trace.memory["stage"], len(stage_to_rank))
    span_rows = [compute_rows[rows] for rows in _groups(s["stage"][compute_rows], len(stage_to_rank))]
    stages = []
    for stage, device in enumerate(stage_to_rank):
        peak, breakdown, versions, inflight = _level_peak_of(trace, memory_rows[stage])
        delay_max, delay_mean, discrepancy = _staleness_of(trace, span_rows[stage])
        utilization = utilization_by_device[device]
        stages.append(StageMetrics(
            stage=stage,
            device=device,
            utilization=utilization,
            bubble_fraction=1.0 - utilization,
            exposed_communication_s=exposed[stage],
            peak_memory_bytes=peak,
            peak_breakdown_bytes=breakdown,
            weight_versions_max=versions,
            max_inflight_microbatches=inflight,
            forward_delay_steps=delay_max,
            forward_delay_mean=delay_mean,
            discrepancy_max=discrepancy,
        ))
    device_peaks = _device_peaks(trace, stage_to_rank, num_ranks, stages)
    samples = int(meta["num_microbatches"]) * int(meta.get("microbatch_size", 1))
    return Metrics(
        schedule=str(meta["schedule"]),
        engine=str(meta.get("engine", "unknown")),
        num_stages=int(meta["num_stages"]),
        num_microbatches=int(meta["num_microbatches"]),
        num_minibatches=int(meta["num_minibatches"]),
        num_ops=int(compute.sum()),
        iteration_time_s=iteration,
        makespan_s=trace.makespan_s,
        throughput_samples_per_s=samples / iteration if iteration > 0 else float("inf"),
        bubble_fraction=1.0 - float(np.mean(utilization_by_device)),
        window_start_s=low,
        window_end_s=high,
        warmup_minibatches=warmup,
        cooldown_minibatches=cooldown,
        peak_memory_bytes=max((stage.peak_memory_bytes for stage in stages), default=0.0),
        stages=tuple(stages),
        num_ranks=num_ranks,
        device_utilization=tuple(utilization_by_device),
        device_peak_memory_bytes=device_peaks,
    )


def _device_peaks(trace: Trace, stage_to_rank: list[int], num_ranks: int,
                  stages: list[StageMetrics]) -> tuple[float, ...]:
    """Per device, the peak of the summed levels of its stages (its one stage's peak when it
    holds one)."""
    held: list[list[int]] = [[] for _ in range(num_ranks)]
    for stage, rank in enumerate(stage_to_rank):
        held[rank].append(stage)
    several = [device for device in range(num_ranks) if len(held[device]) > 1]
    rows = _groups(trace.memory["device"], num_ranks) if several else []
    return tuple(
        stages[held[device][0]].peak_memory_bytes if len(held[device]) == 1
        else _level_peak_of(trace, rows[device])[0] if held[device] else 0.0
        for device in range(num_ranks)
    )
