"""Sweep rows: every column and value as main's row code built them, from a direct simulation."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import pipesim
from pipesim.metrics import Metrics
from pipesim.sweep import COLUMNS, PointRunner, Resolved, parse_spec
from pipesim.sweep.points import json_list

SPEC = {
    "profile": {"uniform": {"layers": 24, "forward_ms": 1.1, "backward_ms": 2.3, "activation_bytes": 1000.5,
                            "param_bytes": 4000000}},
    "bandwidth": ["1MB/s", "100GB/s"],
    "latency": ["5us"],
    "stages": [3, 8],
    "microbatches": [2, 8, 16],
    "schedule": ["gpipe", "1f1b", "pipedream", "2bw", "pipemare"],
    "recompute": [False, True],
    "memory_limit": [None, "50MB"],
}


def reference_metrics_row(metrics: Metrics, partition: Sequence[tuple[int, int]], memory_limit_bytes: float) -> dict[str, Any]:
    """The metric columns of a row: scalars, with per-stage lists as compact JSON strings."""
    stages = metrics.stages
    peak_stage = max(stages, key=lambda s: s.peak_memory_bytes)
    breakdown = peak_stage.peak_breakdown_bytes

    def as_json(values: Sequence[Any]) -> str:
        return json.dumps(list(values), separators=(",", ":"))

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
        "partition": as_json([list(r) for r in partition]),
        "stage_utilization": as_json([s.utilization for s in stages]),
        "stage_peak_memory_bytes": as_json([s.peak_memory_bytes for s in stages]),
        "stage_weight_versions": as_json([s.weight_versions_max for s in stages]),
        "stage_forward_delay_steps": as_json([s.forward_delay_steps for s in stages]),
        "stage_forward_delay_mean": as_json([s.forward_delay_mean for s in stages]),
        "stage_discrepancy_max": as_json([s.discrepancy_max for s in stages]),
    }


def same(a: Any, b: Any) -> bool:
    return (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)) or (
        type(a) is type(b) and a == b)


def test_rows_equal_main_rows_of_direct_simulations() -> None:
    resolved = Resolved(parse_spec(SPEC))
    points = resolved.points()
    rows = PointRunner(resolved).run_batch(points)
    profile = resolved.profiles[0][1]
    checked = 0
    for point, row in zip(points, rows, strict=True):
        assert list(row) == list(COLUMNS)
        if row["error"]:
            assert point["schedule"] == "2bw" and point["num_microbatches"] < point["num_stages"]
            continue
        topology = pipesim.Topology.uniform(num_devices=point["num_stages"], bandwidth=point["bandwidth_bytes_per_s"],
                                            latency=point["latency_s"])
        result = pipesim.simulate(profile, topology, schedule=point["schedule"], num_stages=point["num_stages"],
                                  num_microbatches=point["num_microbatches"], num_minibatches=point["num_minibatches"],
                                  recompute=point["recompute"], engine="auto")
        limit = point["memory_limit_bytes"] if point["memory_limit_bytes"] is not None else min(
            d.memory_bytes for d in topology.devices)
        expected = reference_metrics_row(result.metrics, result.plan.partition, limit)
        for column, value in expected.items():
            assert same(row[column], value), (point, column, row[column], value)
        checked += 1
    assert checked > len(points) // 2


def test_json_lists_are_what_json_writes() -> None:
    for values in ([], [0, 1, -3], [0.1, 1e300, 5e-324, -0.0, 2.0, 1 / 3], [1, 2.5], [float("nan"), math.inf],
                   [True, False], [10**30]):
        assert json_list(values) == json.dumps(values, separators=(",", ":"))
