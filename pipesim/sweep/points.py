"""Simulating sweep points: one point in, one row of scalars out (inputs, metrics, engine, version)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from pipesim.errors import PipesimError
from pipesim.metrics import Metrics
from pipesim.reuse import Reuse
from pipesim.simulation import make_plan, simulate_plan
from pipesim.spec.partition import balance_partition, even_partition
from pipesim.spec.topology import Topology
from pipesim.sweep.spec import AXES, Resolved

# Metric columns of a row, in order; per-stage values are summarized (min/max/mean) or kept as JSON lists.
METRIC_COLUMNS: tuple[str, ...] = (
    "engine", "num_ops", "iteration_time_s", "makespan_s", "throughput_samples_per_s", "bubble_fraction",
    "window_start_s", "window_end_s", "warmup_minibatches", "cooldown_minibatches", "peak_memory_bytes",
    "peak_weights_bytes", "peak_gradients_bytes", "peak_optimizer_bytes", "peak_activations_bytes",
    "fits_memory", "utilization_min", "utilization_max", "exposed_communication_max_s", "weight_versions_max",
    "max_inflight_microbatches", "forward_delay_steps_max", "forward_delay_mean", "discrepancy_max",
    "partition", "stage_utilization", "stage_peak_memory_bytes", "stage_weight_versions",
    "stage_forward_delay_steps", "stage_forward_delay_mean", "stage_discrepancy_max",
)
COLUMNS: tuple[str, ...] = ("point", *AXES.values(), "pipesim_version", "error", *METRIC_COLUMNS)


# The axes that decide a point's schedule and stage costs, outermost first: points equal in these
# (differing in bandwidth, latency, topology or recomputation, say) reuse each other's work when
# they run one after another (``shared_work_order``).
SHARED_WORK = ("profile", "num_stages", "stages_per_rank", "partition_strategy", "schedule", "pipemare_update",
               "num_minibatches", "num_microbatches")


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

    def __init__(self, resolved: Resolved) -> None:
        from pipesim import __version__

        self.resolved = resolved
        self.version = __version__
        self._topologies: dict[tuple[Any, ...], Topology] = {}
        self._partitions: dict[tuple[int, int, str], tuple[tuple[int, int], ...]] = {}
        self.reuse = Reuse()

    def __getstate__(self) -> dict[str, Any]:
        return {"resolved": self.resolved}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["resolved"])  # type: ignore[misc]

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
        except PipesimError as exc:
            row["error"] = str(exc).splitlines()[0]
            row.update(_empty_metrics())
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
                               seed=point["seed"], reuse=self.reuse)
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
    """The metric columns of a row: scalars, with per-stage lists as compact JSON strings."""
    stages = metrics.stages
    peak_stage = max(stages, key=lambda s: s.peak_memory_bytes)
    breakdown = peak_stage.peak_breakdown_bytes
    as_json = json_list
    return {
        "engine": metrics.engine,
        "num_ops": metrics.num_ops,
        "iteration_time_s": metrics.iteration_time_s,
        "makespan_s": metrics.makespan_s,
        "throughput_samples_per_s": metrics.throughput_samples_per_s,
        "bubble_fraction": metrics.bubble_fraction,
        "window_start_s": metrics.window_start_s,
        "window_end_s": metrics.window_end_s,
        "warmup_minibatches": metrics.warmup_minibatches,
        "cooldown_minibatches": metrics.cooldown_minibatches,
        "peak_memory_bytes": metrics.peak_memory_bytes,
        "peak_weights_bytes": breakdown["weights"],
        "peak_gradients_bytes": breakdown["gradients"],
        "peak_optimizer_bytes": breakdown["optimizer"],
        "peak_activations_bytes": breakdown["activations"],
        "fits_memory": bool(metrics.peak_memory_bytes <= memory_limit_bytes),
        "utilization_min": min(s.utilization for s in stages),
        "utilization_max": max(s.utilization for s in stages),
        "exposed_communication_max_s": max(s.exposed_communication_s for s in stages),
        "weight_versions_max": max(s.weight_versions_max for s in stages),
        "max_inflight_microbatches": max(s.max_inflight_microbatches for s in stages),
        "forward_delay_steps_max": max(s.forward_delay_steps for s in stages),
        "forward_delay_mean": sum(s.forward_delay_mean for s in stages) / len(stages),
        "discrepancy_max": max(s.discrepancy_max for s in stages),
        "partition": "[" + ",".join(json_list(bounds) for bounds in partition) + "]",
        "stage_utilization": as_json([s.utilization for s in stages]),
        "stage_peak_memory_bytes": as_json([s.peak_memory_bytes for s in stages]),
        "stage_weight_versions": as_json([s.weight_versions_max for s in stages]),
        "stage_forward_delay_steps": as_json([s.forward_delay_steps for s in stages]),
        "stage_forward_delay_mean": as_json([s.forward_delay_mean for s in stages]),
        "stage_discrepancy_max": as_json([s.discrepancy_max for s in stages]),
    }


def json_list(values: Sequence[Any]) -> str:
    """``json.dumps(list(values), separators=(",", ":"))``, written directly for the common case
    (plain ints and finite floats, where JSON's text is Python's repr)."""
    if all(type(value) is int or (type(value) is float and math.isfinite(value)) for value in values):
        return "[" + ",".join(map(repr, values)) + "]"
    return json.dumps(list(values), separators=(",", ":"))


_INPUT_COLUMNS = ("point", *AXES.values())
_INT_METRICS = frozenset({"num_ops", "warmup_minibatches", "cooldown_minibatches", "weight_versions_max",
                          "max_inflight_microbatches", "forward_delay_steps_max", "discrepancy_max"})


def _empty_metrics() -> dict[str, Any]:
    """Metric columns of a failed point: NaN numbers (-1 counts), empty text, fits_memory False."""
    row: dict[str, Any] = {}
    for column in METRIC_COLUMNS:
        if column in _INT_METRICS:
            row[column] = -1
        elif column == "engine" or column == "partition" or column.startswith("stage_"):
            row[column] = ""
        elif column == "fits_memory":
            row[column] = False
        else:
            row[column] = math.nan
    return row
