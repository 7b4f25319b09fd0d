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
        exposed_communication_s: idle time of the device before this stage's ops spent waiting
            for their inputs in flight, inside the window.
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
        num_ranks: devices of the pipeline (several stages per rank when fewer than stages).
        device_utilization: per device (rank), busy fraction of its compute stream in the window.
        device_peak_memory_bytes: per device, the peak of the sum over the stages it holds.
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
    num_ranks: int = 1
    device_utilization: tuple[float, ...] = ()
    device_peak_memory_bytes: tuple[float, ...] = ()

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


def _level_peak(trace: Trace, stage: int, *, column: str = "stage") -> tuple[float, dict[str, float], int, int]:
    """Peak bytes of a stage (levels after all events at one instant), its breakdown, and the
    most weight versions and stashed microbatches held; ``column="device"`` sums the stages
    of device ``stage`` instead."""
    m = trace.memory
    mask = m[column] == stage
    times = m["time_s"][mask]
    order = np.argsort(times, kind="stable")
    times = times[order]
    categories = m["category"][mask][order]
    delta = m["delta_bytes"][mask][order]
    count = m["delta_count"][mask][order]
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
    on_stage = (s["stage"] == stage) & (s["stream"] == _COMPUTE)
    kinds = s["kind"][on_stage]
    micro = s["microbatch"][on_stage]
    version = s["weight_version"][on_stage]
    position = s["position"][on_stage]
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
    s = trace.spans
    compute = (s["device"] == device) & (s["stream"] == _COMPUTE)
    order = np.argsort(s["position"][compute])
    starts = s["start_s"][compute][order]
    previous_end = np.r_[0.0, s["end_s"][compute][order][:-1]]
    gaps = {}
    for op_stage, kind, micro, start, previous in zip(
        s["stage"][compute][order].tolist(), s["kind"][compute][order].tolist(),
        s["microbatch"][compute][order].tolist(), starts.tolist(), previous_end.tolist(), strict=True,
    ):
        if start > previous:
            gaps[(op_stage, kind, micro)] = (previous, start)
    sends = (s["stream"] == _SEND) & (s["peer"] == device)
    exposed = 0.0
    for source, kind, micro, start, end in zip(
        s["stage"][sends].tolist(), s["kind"][sends].tolist(), s["microbatch"][sends].tolist(),
        s["start_s"][sends].tolist(), s["end_s"][sends].tolist(), strict=True,
    ):
        if kind == _F:
            candidates = [(source + 1, _F, micro)]
        else:
            candidates = [(source - 1, _B, micro), (source - 1, _I, micro)]
        for key in candidates:
            if stage is not None and key[0] != stage:
                continue
            if key in gaps:
                gap_start, gap_end = gaps[key]
                low_edge, high_edge = max(gap_start, start, low), min(gap_end, end, high)
                exposed += max(0.0, high_edge - low_edge)
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
    utilization_by_device = []
    for device in range(int(meta["num_ranks"])):
        mine = compute & (s["device"] == device)
        busy = _overlap(s["start_s"][mine], s["end_s"][mine], low, high)
        utilization_by_device.append(busy / width if width > 0 else 1.0)
    stages = []
    for stage, device in enumerate(stage_to_rank):
        peak, breakdown, versions, inflight = _level_peak(trace, stage)
        delay_max, delay_mean, discrepancy = staleness(trace, stage)
        utilization = utilization_by_device[device]
        stages.append(StageMetrics(
            stage=stage,
            device=device,
            utilization=utilization,
            bubble_fraction=1.0 - utilization,
            exposed_communication_s=_exposed_communication(trace, device, low, high, stage),
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
        num_ranks=int(meta["num_ranks"]),
        device_utilization=tuple(utilization_by_device),
        device_peak_memory_bytes=tuple(
            _level_peak(trace, device, column="device")[0] for device in range(int(meta["num_ranks"]))
        ),
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
