"""Metrics: pure functions of a Trace (iteration time, bubbles, memory, staleness)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from pipesim import jit

from pipesim.engine.trace import CATEGORIES, STREAMS, Trace
from pipesim.metrics import kernels

_COMPUTE = STREAMS.index("compute")


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
            (warm-up) minibatch when there are 2 or more and, when there are 3 or more, the
            drain: the last minibatch and any other that has an op after its device's last
            forward (a deep warm-up, as PipeMare's paper pipeline has, leaves several), keeping
            at least one minibatch; ``warmup_minibatches`` and ``cooldown_minibatches`` say how many.
        stages: per-stage metrics.
        peak_memory_bytes: the largest device's peak (``max(device_peak_memory_bytes)``): what
            must fit on one GPU. With one stage per rank it is the largest stage's peak.
        num_ranks: devices of the pipeline (several stages per rank when fewer than stages).
        device_utilization: per device (rank), busy fraction of its compute stream in the window.
        device_peak_memory_bytes: per device, the peak of the summed memory of the stages it
            holds over time (the peak of the sum, not the sum of the stages' peaks).
        device_peak_breakdown_bytes: per device, that peak by category.
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
    device_peak_breakdown_bytes: tuple[dict[str, float], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        data = asdict(self)
        data["stages"] = [asdict(stage) for stage in self.stages]
        return data


def use_compiled(trace: Trace, compiled: bool | None) -> bool:
    """Whether the metrics of ``trace`` run the compiled kernels: ``compiled`` when given, else
    as ``jit.use_compiled`` decides for its number of compute spans."""
    if compiled is not None:
        return compiled
    return jit.use_compiled(int(np.count_nonzero(trace.spans["stream"] == _COMPUTE)))


def minibatch_ends(trace: Trace, *, compiled: bool | None = None) -> npt.NDArray[np.float64]:
    """End time of each minibatch: the end of its last compute op (its update included).

    Args:
        compiled: run the numba-compiled kernel (True) or its plain-Python form (False);
            the same bits either way. None: ``use_compiled`` decides.
    """
    s = trace.spans
    return kernels.minibatch_ends(s["stream"], s["minibatch"], s["end_s"], trace.info.num_minibatches,
                                  compiled=use_compiled(trace, compiled))


Window = tuple[float, float, int, int]


def steady_window(trace: Trace, *, compiled: bool | None = None) -> Window:
    """``(start_s, end_s, warmup, cooldown)`` of the steady-state window (see Metrics)."""
    s = trace.spans
    return window_of(s, s["end_s"], trace.info.num_minibatches, compiled=use_compiled(trace, compiled))


def window_of(spans: Mapping[str, npt.NDArray[Any]], end_s: npt.NDArray[np.float64], num_minibatches: int, *,
              compiled: bool) -> Window:
    """``steady_window`` from span columns (``spans``: stream, minibatch, kind, device) and ends:
    the first minibatch's end to the end of the last one before the drain (``kernels.first_drained``)."""
    stream, minibatch = spans["stream"], spans["minibatch"]
    ends = kernels.minibatch_ends(stream, minibatch, end_s, num_minibatches, compiled=compiled)
    k = len(ends)
    if k >= 3:
        drained = kernels.first_drained(stream, spans["device"], spans["kind"], minibatch, end_s, k, compiled=compiled)
        last = min(k - 2, max(1, drained - 1))
        return float(ends[0]), float(ends[last]), 1, k - 1 - last
    if k == 2:
        return float(ends[0]), float(ends[1]), 1, 0
    return 0.0, float(end_s.max()) if end_s.size else 0.0, 0, 0


def iteration_time(trace: Trace, *, compiled: bool | None = None, window: Window | None = None) -> float:
    """Seconds per minibatch in the steady-state window (``window``: ``steady_window(trace)``
    when known); what a run of drawn durations is summarised by."""
    return seconds_per_minibatch(steady_window(trace, compiled=compiled) if window is None else window,
                                 trace.info.num_minibatches)


def seconds_per_minibatch(window: Window, num_minibatches: int) -> float:
    """The window's length over the minibatches inside it."""
    low, high, warmup, cooldown = window
    return (high - low) / max(1, num_minibatches - warmup - cooldown)


def staleness(trace: Trace, stage: int, *, compiled: bool | None = None) -> tuple[int, float, int]:
    """``(forward_delay_max, forward_delay_mean, discrepancy_max)`` of a stage, from versions.

    The update that consumes microbatch i's gradient is the first U of the stage after i's
    B (or W) in the rank's order; forward delay = the version that U updates minus the
    version i's F ran on. Discrepancy = version of i's B (or I) minus version of its F.
    """
    key = np.where(trace.spans["stage"] == stage, 0, -1)
    delay_max, delay_mean, discrepancy = kernels.staleness_all(trace, key, 1, compiled=use_compiled(trace, compiled))
    return int(delay_max[0]), float(delay_mean[0]), int(discrepancy[0])


def _exposed_communication(trace: Trace, device: int, low: float, high: float, stage: int | None = None, *,
                           compiled: bool | None = None) -> float:
    """Idle time on ``device`` before an op (of ``stage``, when given), overlapping the arrival of
    the send it waited for: an activation for F, a gradient (from B or I) for B or I."""
    num_devices, num_stages = trace.info.num_ranks, trace.info.num_stages
    chosen = use_compiled(trace, compiled)
    if stage is None:
        return kernels.exposed_communication(trace, num_devices, num_stages, low, high, per_stage=False,
                                             compiled=chosen)[device]
    if trace.info.stage_to_rank[stage] != device:
        return 0.0
    return kernels.exposed_communication(trace, num_devices, num_stages, low, high, compiled=chosen)[stage]


Staleness = tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.int64]]


def stage_staleness(trace: Trace, *, compiled: bool | None = None) -> Staleness:
    """Per stage: forward delay (max, mean) and discrepancy (max), as ``staleness`` gives them.

    They depend on each rank's order of ops and their weight versions alone, so every trace
    of one schedule has the same (``pipesim.reuse`` keeps them for a sweep's points)."""
    return kernels.staleness_all(trace, trace.spans["stage"], len(trace.info.stage_to_rank),
                                 compiled=use_compiled(trace, compiled))


def _device_segments(devices: npt.NDArray[np.int64], num_devices: int) -> tuple[npt.NDArray[np.intp] | None,
                                                                                  npt.NDArray[np.intp]]:
    """Rows grouped by device 0..num_devices-1, each group in stored order: the stable sorting
    permutation (None when the rows are already in order, as an engine writes them) and the
    bounds of each group in it (rows of other devices fall outside every group)."""
    if devices.size > 1 and not bool((devices[1:] >= devices[:-1]).all()):
        # int16 keys, where they fit, sort stably by radix in linear time.
        fits = num_devices < 2**15 and int(devices.min()) >= -(2**15) and int(devices.max()) < 2**15
        order = np.argsort(devices.astype(np.int16) if fits else devices, kind="stable")
        ordered = devices[order]
    else:
        order, ordered = None, devices
    return order, np.searchsorted(ordered, np.arange(num_devices + 1), side="left")


def compute_metrics(trace: Trace, *, staleness: Staleness | None = None, compiled: bool | None = None) -> Metrics:
    """All metrics of a trace.

    Args:
        staleness: ``stage_staleness`` of a trace of the same schedule, when known.
        compiled: run the numba-compiled kernels (True) or their plain-Python form (False);
            the same bits either way. None: ``use_compiled`` decides.
    """
    info = trace.info
    s = trace.spans
    compiled = use_compiled(trace, compiled)
    low, high, warmup, cooldown = window = steady_window(trace, compiled=compiled)
    iteration = iteration_time(trace, window=window)
    width = high - low
    compute_rows = np.flatnonzero(s["stream"] == _COMPUTE)
    stage_to_rank = list(info.stage_to_rank)
    num_stages = len(stage_to_rank)
    num_ranks = info.num_ranks
    # Busy time per device: each device's clipped spans in stored order, summed as numpy sums them.
    # The engines store the compute spans first: then a slice reads them without copying.
    mine: slice | npt.NDArray[np.intp] = compute_rows
    if compute_rows.size and int(compute_rows[-1]) - int(compute_rows[0]) + 1 == compute_rows.size:
        mine = slice(int(compute_rows[0]), int(compute_rows[-1]) + 1)
    order, bounds = _device_segments(s["device"][mine], num_ranks)
    if order is not None:
        mine = compute_rows[order]
    busy = np.clip(np.minimum(s["end_s"][mine], high) - np.maximum(s["start_s"][mine], low), 0.0, None)
    utilization_by_device = [float(busy[bounds[d]:bounds[d + 1]].sum()) / width if width > 0 else 1.0
                             for d in range(num_ranks)]
    exposed = kernels.exposed_communication(trace, num_ranks, num_stages, low, high, compiled=compiled,
                                            compute_rows=compute_rows)
    peaks, breakdowns, versions, inflight = kernels.level_peaks(trace, trace.memory["stage"], num_stages,
                                                                compiled=compiled)
    if staleness is None:
        staleness = stage_staleness(trace, compiled=compiled)
    delay_max, delay_mean, discrepancy = staleness
    stages = []
    peak_list, breakdown_list = peaks.tolist(), breakdowns.tolist()
    versions_list, inflight_list = versions.tolist(), inflight.tolist()
    delay_max_list, delay_mean_list, discrepancy_list = delay_max.tolist(), delay_mean.tolist(), discrepancy.tolist()
    for stage, device in enumerate(stage_to_rank):
        utilization = utilization_by_device[device]
        stages.append(StageMetrics(
            stage=stage,
            device=device,
            utilization=utilization,
            bubble_fraction=1.0 - utilization,
            exposed_communication_s=exposed[stage],
            peak_memory_bytes=peak_list[stage],
            peak_breakdown_bytes=dict(zip(CATEGORIES, breakdown_list[stage], strict=True)),
            weight_versions_max=versions_list[stage],
            max_inflight_microbatches=inflight_list[stage],
            forward_delay_steps=delay_max_list[stage],
            forward_delay_mean=delay_mean_list[stage],
            discrepancy_max=discrepancy_list[stage],
        ))
    device_peaks, device_breakdowns = _device_peaks(trace, stage_to_rank, num_ranks, stages, compiled)
    samples = info.num_microbatches * info.microbatch_size
    return Metrics(
        schedule=info.schedule,
        engine=info.engine if info.engine is not None else "unknown",
        num_stages=info.num_stages,
        num_microbatches=info.num_microbatches,
        num_minibatches=info.num_minibatches,
        num_ops=int(compute_rows.size),
        iteration_time_s=iteration,
        makespan_s=trace.makespan_s,
        throughput_samples_per_s=samples / iteration if iteration > 0 else float("inf"),
        bubble_fraction=1.0 - float(np.mean(utilization_by_device)),
        window_start_s=low,
        window_end_s=high,
        warmup_minibatches=warmup,
        cooldown_minibatches=cooldown,
        peak_memory_bytes=max(device_peaks, default=0.0),
        stages=tuple(stages),
        num_ranks=num_ranks,
        device_utilization=tuple(utilization_by_device),
        device_peak_memory_bytes=device_peaks,
        device_peak_breakdown_bytes=device_breakdowns,
    )


def _device_peaks(trace: Trace, stage_to_rank: list[int], num_ranks: int, stages: list[StageMetrics],
                  compiled: bool) -> tuple[tuple[float, ...], tuple[dict[str, float], ...]]:
    """Per device, the peak of the summed levels of its stages and that peak by category (its
    one stage's when it holds one; 0 for a device without stages)."""
    held: list[list[int]] = [[] for _ in range(num_ranks)]
    for stage, rank in enumerate(stage_to_rank):
        held[rank].append(stage)
    peaks: list[float] = []
    breakdowns: list[dict[str, float]] = []
    if any(len(stages_held) > 1 for stages_held in held):
        found, by_category = kernels.level_peaks(trace, trace.memory["device"], num_ranks, compiled=compiled)[:2]
        summed = (found.tolist(), by_category.tolist())
    for device, stages_held in enumerate(held):
        if len(stages_held) == 1:
            peaks.append(stages[stages_held[0]].peak_memory_bytes)
            breakdowns.append(stages[stages_held[0]].peak_breakdown_bytes)
        elif stages_held:
            peaks.append(summed[0][device])
            breakdowns.append(dict(zip(CATEGORIES, summed[1][device], strict=True)))
        else:
            peaks.append(0.0)
            breakdowns.append(dict.fromkeys(CATEGORIES, 0.0))
    return tuple(peaks), tuple(breakdowns)


def memory_verdict(device_peak_memory_bytes: tuple[float, ...] | list[float], budget_bytes: float) -> dict[str, Any]:
    """Whether each device fits a memory budget of ``budget_bytes``: the keys ``simulate --json``,
    metrics.json and the report carry, ``memory_budget_bytes``, ``device_memory_headroom_bytes``
    (budget minus each device's peak, negative where over) and ``fits`` (every device within)."""
    headroom = [budget_bytes - peak for peak in device_peak_memory_bytes]
    return {"memory_budget_bytes": budget_bytes, "device_memory_headroom_bytes": headroom,
            "fits": all(value >= 0 for value in headroom)}


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
