"""Simulating sweep points: one point in, one row of scalars out (inputs, metrics, engine, version)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pipesim.errors import ConfigError, PipesimError
from pipesim.metrics import Metrics, StageMetrics
from pipesim.jit import COMPILED_FROM_OPS, JitSetting, setting_from_environment
from pipesim.reuse import Reuse
from pipesim.simulation import make_plan, simulate_plan
from pipesim.spec.partition import balance_partition, even_partition
from pipesim.spec.topology import Topology
from pipesim.sweep.spec import AXES, Resolved

@dataclass(frozen=True)
class RowSource:
    """What a row's metric columns are computed from: one point's metrics, its partition and
    memory limit, and the peak breakdown of its device with the highest peak (the device, not
    the stage: several stages on one rank share its memory)."""

    metrics: Metrics
    partition: Sequence[tuple[int, int]]
    memory_limit_bytes: float
    peak_breakdown_bytes: dict[str, float]


@dataclass(frozen=True)
class MetricColumn:
    """One metric column of a sweep row: its name, how it is computed, and its value in the row
    of a point that failed (of the same type, so that a table's column keeps one type)."""

    name: str
    compute: Callable[[RowSource], Any]
    empty: Any


def _stages(source: RowSource) -> tuple[StageMetrics, ...]:
    return source.metrics.stages


# The metric columns of a row, in order: per-stage values summarized (min/max/mean) or kept as
# compact JSON lists; a failed point has NaN numbers, -1 counts, empty text and fits_memory False.
METRIC_SCHEMA: tuple[MetricColumn, ...] = (
    MetricColumn("engine", lambda r: r.metrics.engine, ""),
    MetricColumn("num_ops", lambda r: r.metrics.num_ops, -1),
    MetricColumn("iteration_time_s", lambda r: r.metrics.iteration_time_s, math.nan),
    MetricColumn("makespan_s", lambda r: r.metrics.makespan_s, math.nan),
    MetricColumn("throughput_samples_per_s", lambda r: r.metrics.throughput_samples_per_s, math.nan),
    MetricColumn("bubble_fraction", lambda r: r.metrics.bubble_fraction, math.nan),
    MetricColumn("window_start_s", lambda r: r.metrics.window_start_s, math.nan),
    MetricColumn("window_end_s", lambda r: r.metrics.window_end_s, math.nan),
    MetricColumn("warmup_minibatches", lambda r: r.metrics.warmup_minibatches, -1),
    MetricColumn("cooldown_minibatches", lambda r: r.metrics.cooldown_minibatches, -1),
    MetricColumn("peak_memory_bytes", lambda r: r.metrics.peak_memory_bytes, math.nan),
    MetricColumn("peak_weights_bytes", lambda r: r.peak_breakdown_bytes["weights"], math.nan),
    MetricColumn("peak_gradients_bytes", lambda r: r.peak_breakdown_bytes["gradients"], math.nan),
    MetricColumn("peak_optimizer_bytes", lambda r: r.peak_breakdown_bytes["optimizer"], math.nan),
    MetricColumn("peak_activations_bytes", lambda r: r.peak_breakdown_bytes["activations"], math.nan),
    MetricColumn("peak_working_bytes", lambda r: r.peak_breakdown_bytes["working"], math.nan),
    MetricColumn("fits_memory", lambda r: bool(r.metrics.peak_memory_bytes <= r.memory_limit_bytes), False),
    MetricColumn("utilization_min", lambda r: min(s.utilization for s in _stages(r)), math.nan),
    MetricColumn("utilization_max", lambda r: max(s.utilization for s in _stages(r)), math.nan),
    MetricColumn("exposed_communication_max_s", lambda r: max(s.exposed_communication_s for s in _stages(r)),
                 math.nan),
    MetricColumn("weight_versions_max", lambda r: max(s.weight_versions_max for s in _stages(r)), -1),
    MetricColumn("max_inflight_microbatches", lambda r: max(s.max_inflight_microbatches for s in _stages(r)), -1),
    MetricColumn("forward_delay_steps_max", lambda r: max(s.forward_delay_steps for s in _stages(r)), -1),
    MetricColumn("forward_delay_mean", lambda r: sum(s.forward_delay_mean for s in _stages(r)) / len(_stages(r)),
                 math.nan),
    MetricColumn("discrepancy_max", lambda r: max(s.discrepancy_max for s in _stages(r)), -1),
    MetricColumn("partition", lambda r: "[" + ",".join(json_list(bounds) for bounds in r.partition) + "]", ""),
    MetricColumn("stage_utilization", lambda r: json_list([s.utilization for s in _stages(r)]), ""),
    MetricColumn("stage_peak_memory_bytes", lambda r: json_list([s.peak_memory_bytes for s in _stages(r)]), ""),
    MetricColumn("device_peak_memory_bytes", lambda r: json_list(list(r.metrics.device_peak_memory_bytes)), ""),
    MetricColumn("stage_weight_versions", lambda r: json_list([s.weight_versions_max for s in _stages(r)]), ""),
    MetricColumn("stage_forward_delay_steps", lambda r: json_list([s.forward_delay_steps for s in _stages(r)]), ""),
    MetricColumn("stage_forward_delay_mean", lambda r: json_list([s.forward_delay_mean for s in _stages(r)]), ""),
    MetricColumn("stage_discrepancy_max", lambda r: json_list([s.discrepancy_max for s in _stages(r)]), ""),
)
METRIC_COLUMNS: tuple[str, ...] = tuple(column.name for column in METRIC_SCHEMA)
COLUMNS: tuple[str, ...] = ("point", *AXES.values(), "pipesim_version", "error", *METRIC_COLUMNS)

# What each column holds, checked when a table is read (``pipesim.sweep.store.read_table``):
# "integer", "number" (NaN and inf allowed), "boolean" or "text" (not checked). A metric's kind is
# that of its failed point's value.
_EMPTY_KINDS = {int: "integer", float: "number", bool: "boolean", str: "text"}
COLUMN_KINDS: dict[str, str] = {
    "point": "integer", "profile": "text", "topology": "text", "bandwidth_bytes_per_s": "number",
    "latency_s": "number", "num_stages": "integer", "num_microbatches": "integer", "num_minibatches": "integer",
    "schedule": "text", "partition_strategy": "text", "recompute": "boolean", "memory_limit_bytes": "number",
    "optimizer_state_multiplier": "number", "pipemare_update": "text", "jitter": "number", "seed": "integer",
    "stages_per_rank": "integer", "pipesim_version": "text", "error": "text",
    **{column.name: _EMPTY_KINDS[type(column.empty)] for column in METRIC_SCHEMA},
}


# The axes that decide a point's schedule and stage costs, outermost first: points equal in these
# (differing in bandwidth, latency, topology or recomputation, say) reuse each other's work when
# they run one after another (``shared_work_order``).
SHARED_WORK = ("profile", "num_stages", "stages_per_rank", "partition_strategy", "schedule", "pipemare_update",
               "num_minibatches", "num_microbatches")
# The outer axes of SHARED_WORK, without the counts: points equal in these share their stage costs
# (``pipesim.reuse``) and their partition, and are kept together on a worker where they fit.
SHARED_COSTS = SHARED_WORK[:-2]


def shared_work_order(points: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``points`` reordered (stably) so that those equal in ``SHARED_WORK`` are adjacent."""
    # (type name, value): an axis may mix None with numbers or text, which do not compare.
    return sorted(points, key=lambda point: tuple((type(point[axis]).__name__, point[axis]) for axis in SHARED_WORK))


class PointRunner:
    """Simulates the points of one resolved spec, reusing profiles, topologies and partitions.

    One instance lives on each Dask worker for the whole sweep (it travels once, as a task).
    Consecutive points that share a schedule's shape share its order, stage costs and
    staleness (``pipesim.reuse``; ``SHARED_WORK`` orders the points for that).
    """

    def __init__(self, resolved: Resolved, kernels: JitSetting | None = None) -> None:
        from pipesim import __version__

        self.resolved = resolved
        self.kernels = kernels
        self.version = __version__
        self._topologies: dict[tuple[Any, ...], Topology] = {}
        self._partitions: dict[tuple[int, int, str], tuple[tuple[int, int], ...]] = {}
        self.reuse = Reuse()

    def __getstate__(self) -> dict[str, Any]:
        return {"resolved": self.resolved, "kernels": self.kernels}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["resolved"], state.get("kernels"))  # type: ignore[misc]

    def run_batch(self, points: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Rows of ``points``, in the given order."""
        return [self.run(point) for point in points]

    def run(self, point: dict[str, Any]) -> dict[str, Any]:
        """The row of one point; a point whose inputs break a rule gets its message in ``error``."""
        label, profile = self.resolved.profiles[point["profile"]]
        row: dict[str, Any] = {column: point[column] for column in _INPUT_COLUMNS}
        row["profile"] = label
        row["topology"] = self.resolved.topologies[point["topology"]][0]
        row["memory_limit_bytes"] = math.nan if point["memory_limit_bytes"] is None else point["memory_limit_bytes"]
        row["pipesim_version"] = self.version
        row["error"] = ""
        try:
            result_row = self._simulate(point, profile)
        except (PipesimError, MemoryError) as exc:  # a point too large for this machine ends only itself
            row["error"] = str(exc).splitlines()[0] if isinstance(exc, PipesimError) else f"out of memory: {exc}"
            row.update(empty_metrics())
        else:
            row.update(result_row)
        return row

    def _simulate(self, point: dict[str, Any], profile: Any) -> dict[str, Any]:
        num_stages = point["num_stages"]
        key = (point["profile"], num_stages, point["partition_strategy"])
        if key not in self._partitions:
            if point["partition_strategy"] == "even":
                self._partitions[key] = even_partition(profile.num_layers, num_stages)
            else:
                self._partitions[key] = balance_partition(profile, num_stages)
        plan = make_plan(
            profile, schedule=point["schedule"], num_stages=num_stages,
            num_microbatches=point["num_microbatches"], num_minibatches=point["num_minibatches"],
            partition=self._partitions[key], recompute=point["recompute"],
            optimizer_state_multiplier=point["optimizer_state_multiplier"],
            pipemare_update=point["pipemare_update"], stages_per_rank=point["stages_per_rank"],
        )
        topology = self._topology(point)
        result = simulate_plan(profile, topology, plan, engine=self.resolved.spec.engine, jitter=point["jitter"],
                               seed=point["seed"], reuse=self.reuse, kernels=self.kernels)
        limit = point["memory_limit_bytes"]
        if limit is None:
            limit = min(d.memory_bytes for d in topology.devices[:num_stages])
        return metrics_row(result.metrics, plan.partition, limit)

    def _topology(self, point: dict[str, Any]) -> Topology:
        given: Topology | None = self.resolved.topologies[point["topology"]][1]
        if given is not None:
            return given
        key = (point["num_stages"], point["bandwidth_bytes_per_s"], point["latency_s"])
        if key not in self._topologies:
            self._topologies[key] = Topology.uniform(
                num_devices=point["num_stages"], bandwidth=point["bandwidth_bytes_per_s"],
                latency=point["latency_s"],
            )
        return self._topologies[key]


def metrics_row(metrics: Metrics, partition: Sequence[tuple[int, int]], memory_limit_bytes: float) -> dict[str, Any]:
    """The metric columns of a row (``METRIC_SCHEMA``): scalars, with per-stage lists as compact JSON strings."""
    peaks = metrics.device_peak_memory_bytes
    peak_device = max(range(len(peaks)), key=peaks.__getitem__)
    source = RowSource(metrics, partition, memory_limit_bytes, metrics.device_peak_breakdown_bytes[peak_device])
    return {column.name: column.compute(source) for column in METRIC_SCHEMA}


def json_list(values: Sequence[Any]) -> str:
    """``json.dumps(list(values), separators=(",", ":"))``, written directly for the common case
    (plain ints and finite floats, where JSON's text is Python's repr)."""
    if all(type(value) is int or (type(value) is float and math.isfinite(value)) for value in values):
        return "[" + ",".join(map(repr, values)) + "]"
    return json.dumps(list(values), separators=(",", ":"))


_INPUT_COLUMNS = ("point", *AXES.values())


def empty_metrics() -> dict[str, Any]:
    """The metric columns of a failed point's row (each column's ``empty`` value)."""
    return {column.name: column.empty for column in METRIC_SCHEMA}


def sweep_kernels(points: Sequence[dict[str, Any]], num_workers: int) -> JitSetting:
    """The kernels a sweep's points run: compiled when each worker's share of the ops (about
    three per stage, microbatch and minibatch) pays for numba's start-up, else plain Python;
    an explicit ``PIPESIM_JIT`` setting wins (``pipesim.jit.use_compiled``)."""
    setting = setting_from_environment()
    if setting != "auto":
        return setting
    ops = sum(3 * point["num_stages"] * point["num_microbatches"] * max(1, point["num_minibatches"] or 4)
              for point in points)
    return "always" if ops >= COMPILED_FROM_OPS * max(1, num_workers) else "never"
