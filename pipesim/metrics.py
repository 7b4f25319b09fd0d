"""Metrics: pure functions of a Trace (iteration time, bubbles, memory, staleness)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from pipesim.engine.trace import CATEGORIES, KINDS, STREAMS, Trace

_F, _B, _I, _W, _U = range(len(KINDS))
_COMPUTE, _SEND = STREAMS.index("compute"), STREAMS.index("send")
_ACTIVATIONS, _WEIGHTS = CATEGORIES.index("activations"), CATEGORIES.index("weights")


@dataclass(frozen=True)
class StageMetrics:
    """What one stage did.

    Attributes:
        stage: stage index; device: rank it ran on.
        utilization: busy fraction of its device's compute stream in the steady-state window.
        bubble_fraction: ``1 - utilization``.
        exposed_communication_s: idle time of the device spent waiting for this stage's inputs
            in flight, inside the window.
        peak_memory_bytes: peak of weights + gradients + optimizer state + stashed activations.
        peak_breakdown_bytes: that peak by category.
        weight_versions_max: most weight versions held at once.
        max_inflight_microbatches: most microbatches' activations held at once.
        forward_delay_steps: most updates between a forward and the update that uses its gradient.
        forward_delay_mean: the same, averaged over microbatches that have such an update.
        discrepancy_max: most of ``version(backward) - version(forward)`` over microbatches.
    """

    stage: int
    device: int
    utilization: float
    bubble_fraction: float
    exposed_communication_s: float
    peak_memory_bytes: float
    peak_breakdown_bytes: dict[str, float]
    weight_versions_max: int
    max_inflight_microbatches: int
    forward_delay_steps: int
    forward_delay_mean: float
    discrepancy_max: int


@dataclass(frozen=True)
class Metrics:
    """Whole-run metrics; ``to_dict()`` is the ``--json`` form.

    Attributes:
        iteration_time_s: seconds per minibatch in the steady-state window.
        makespan_s: end of the last op.
        throughput_samples_per_s: ``num_microbatches * microbatch_size / iteration_time_s``.
        bubble_fraction: mean idle fraction of the devices in the window.
        window_start_s, window_end_s: the steady-state window; it excludes the first
            (warm-up) minibatch when there are 2 or more and the last (drain) when there are 3
            or more; ``warmup_minibatches`` and ``cooldown_minibatches`` say how many.
        stages: per-stage metrics.
    """

    schedule: str
    engine: str
    num_stages: int
    num_microbatches: int
    num_minibatches: int
    num_ops: int
    iteration_time_s: float
    makespan_s: float
    throughput_samples_per_s: float
    bubble_fraction: float
    window_start_s: float
    window_end_s: float
    warmup_minibatches: int
    cooldown_minibatches: int
    peak_memory_bytes: float
    stages: tuple[StageMetrics, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        data = asdict(self)
        data["stages"] = [asdict(stage) for stage in self.stages]
        return data


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


def _groups(keys: npt.NDArray[np.int64], count: int) -> list[npt.NDArray[np.intp]]:
    """Row indices holding each key 0..count-1, each in stored order (one sort instead of a mask per key)."""
    order = np.argsort(keys, kind="stable")
    bounds = np.searchsorted(keys[order], np.arange(count + 1))
    return [order[bounds[key]:bounds[key + 1]] for key in range(count)]


def _level_peak(trace: Trace, stage: int) -> tuple[float, dict[str, float], int, int]:
    """Peak bytes of a stage (levels after all events at one instant), its breakdown, and the
    most weight versions and stashed microbatches held."""
    return _level_peak_of(trace, np.flatnonzero(trace.memory["stage"] == stage))


def _level_peak_of(trace: Trace, rows: npt.NDArray[np.intp]) -> tuple[float, dict[str, float], int, int]:
    """``_level_peak`` of the memory events at ``rows`` (one stage's, in stored order)."""
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
    """``staleness`` of the compute spans at ``rows`` (one stage's, in stored order)."""
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


def _exposed_communication(trace: Trace, device: int, low: float, high: float) -> float:
    """Idle time on ``device`` before an op, overlapping the arrival of the send it waited for."""
    return float(_exposed_by_device(trace, low, high)[device])


def _exposed_by_device(trace: Trace, low: float, high: float) -> npt.NDArray[np.float64]:
    """Per device: idle time before an op, inside [low, high], while the send it waited for was
    in flight. A gap is the time between an op and the one before it in its rank's order; an
    F waits for stage s-1's activation send, a B or I for stage s+1's gradient send."""
    s = trace.spans
    num_devices = int(trace.meta["num_ranks"])
    exposed = np.zeros(max(num_devices, int(s["device"].max()) + 1 if s["device"].size else 0))
    compute = np.flatnonzero(s["stream"] == _COMPUTE)
    sends = np.flatnonzero((s["stream"] == _SEND) & (s["peer"] >= 0))
    if compute.size == 0 or sends.size == 0:
        return exposed
    # Compute spans in (device, position) order; a gap opens where an op starts after its predecessor ended.
    ordered = compute[np.lexsort((s["position"][compute], s["device"][compute]))]
    device = s["device"][ordered]
    starts = s["start_s"][ordered]
    previous_end = np.r_[0.0, s["end_s"][ordered][:-1]]
    previous_end[np.r_[True, device[1:] != device[:-1]]] = 0.0
    gap = starts > previous_end
    span = int(s["microbatch"].max()) + 2

    def code(stage: npt.NDArray[np.int64], kind: npt.NDArray[np.int64] | int, micro: npt.NDArray[np.int64]) -> Any:
        return (stage * len(KINDS) + kind) * span + micro

    gap_rows = ordered[gap]
    gap_code = code(s["stage"][gap_rows], s["kind"][gap_rows], s["microbatch"][gap_rows])
    by_code = np.argsort(gap_code, kind="stable")
    gap_code, gap_start, gap_end = gap_code[by_code], previous_end[gap][by_code], starts[gap][by_code]
    gap_device = device[gap][by_code]
    if gap_code.size == 0:
        return exposed
    # Each send in stored order names the op it feeds: F -> (s+1, F); a gradient -> (s-1, B), then (s-1, I).
    is_forward = s["kind"][sends] == _F
    repeats = np.where(is_forward, 1, 2)
    owner = np.repeat(sends, repeats)
    second = np.r_[False, owner[1:] == owner[:-1]]
    forward_owner = s["kind"][owner] == _F
    target_stage = s["stage"][owner] + np.where(forward_owner, 1, -1)
    target_kind = np.where(forward_owner, _F, np.where(second, _I, _B))
    wanted = code(target_stage, target_kind, s["microbatch"][owner])
    index = np.minimum(np.searchsorted(gap_code, wanted), gap_code.size - 1)
    peer = s["peer"][owner]
    found = (target_stage >= 0) & (gap_code[index] == wanted) & (gap_device[index] == peer)
    index, owner, peer = index[found], owner[found], peer[found]
    low_edge = np.maximum(np.maximum(gap_start[index], s["start_s"][owner]), low)
    high_edge = np.minimum(np.minimum(gap_end[index], s["end_s"][owner]), high)
    # Accumulated one by one in the sends' stored order, as a loop over them would.
    np.add.at(exposed, peer, np.maximum(0.0, high_edge - low_edge))
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
    num_ranks, num_stages = int(meta["num_ranks"]), len(stage_to_rank)
    # Group rows by device and by stage once: a mask per device or stage would cost O(p * ops).
    compute_rows = np.flatnonzero(compute)
    by_device = [compute_rows[rows] for rows in _groups(s["device"][compute_rows], num_ranks)]
    by_stage = [compute_rows[rows] for rows in _groups(s["stage"][compute_rows], num_stages)]
    memory_by_stage = _groups(trace.memory["stage"], num_stages)
    exposed = _exposed_by_device(trace, low, high)
    utilization_by_device = []
    for mine in by_device:
        busy = _overlap(s["start_s"][mine], s["end_s"][mine], low, high)
        utilization_by_device.append(busy / width if width > 0 else 1.0)
    stages = []
    for stage, device in enumerate(stage_to_rank):
        peak, breakdown, versions, inflight = _level_peak_of(trace, memory_by_stage[stage])
        delay_max, delay_mean, discrepancy = _staleness_of(trace, by_stage[stage])
        utilization = utilization_by_device[device]
        stages.append(StageMetrics(
            stage=stage,
            device=device,
            utilization=utilization,
            bubble_fraction=1.0 - utilization,
            exposed_communication_s=float(exposed[device]),
            peak_memory_bytes=peak,
            peak_breakdown_bytes=breakdown,
            weight_versions_max=versions,
            max_inflight_microbatches=inflight,
            forward_delay_steps=delay_max,
            forward_delay_mean=delay_mean,
            discrepancy_max=discrepancy,
        ))
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
    )


def memory_over_time(trace: Trace) -> Any:
    """A DataFrame of memory levels: time_s, stage, and one column of bytes per category."""
    import pandas as pd

    frame = trace.memory_frame()
    frame = frame.sort_values(["stage", "time_s"], kind="stable")
    wide = frame.pivot_table(index=["stage", "time_s"], columns="category", values="delta_bytes",
                             aggfunc="sum", fill_value=0.0)
    for category in CATEGORIES:
        if category not in wide.columns:
            wide[category] = 0.0
    wide = wide[list(CATEGORIES)].groupby(level="stage").cumsum()
    wide["total"] = wide.sum(axis=1)
    return pd.DataFrame(wide).reset_index()
