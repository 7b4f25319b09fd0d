"""Sweep rows: every column as the schema (METRIC_SCHEMA) computes it from a direct simulation,
summaries that agree with the per-stage lists, and failed points' rows of the same types."""

from __future__ import annotations

import json
import math
from typing import Any

import pipesim
from pipesim.sweep import COLUMNS, PointRunner, Resolved, parse_spec
from pipesim.sweep.points import METRIC_SCHEMA, empty_metrics, json_list, metrics_row

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


def same(a: Any, b: Any) -> bool:
    return (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)) or (
        type(a) is type(b) and a == b)


def check_summaries(row: dict[str, Any]) -> None:
    """The scalar columns summarize the per-stage lists as their names say."""
    utilization = json.loads(row["stage_utilization"])
    assert (row["utilization_min"], row["utilization_max"]) == (min(utilization), max(utilization))
    assert row["peak_memory_bytes"] == max(json.loads(row["device_peak_memory_bytes"]))
    assert row["peak_memory_bytes"] >= max(json.loads(row["stage_peak_memory_bytes"]))
    assert row["weight_versions_max"] == max(json.loads(row["stage_weight_versions"]))
    assert row["forward_delay_steps_max"] == max(json.loads(row["stage_forward_delay_steps"]))
    assert row["discrepancy_max"] == max(json.loads(row["stage_discrepancy_max"]))
    delays = json.loads(row["stage_forward_delay_mean"])
    assert row["forward_delay_mean"] == sum(delays) / len(delays)
    parts = sum(row[f"peak_{category}_bytes"]
                for category in ("weights", "gradients", "optimizer", "activations", "working"))
    assert math.isclose(parts, row["peak_memory_bytes"], rel_tol=1e-12)
    assert row["fits_memory"] == (row["peak_memory_bytes"] <= (row["memory_limit_bytes"] if not math.isnan(
        row["memory_limit_bytes"]) else math.inf))


def test_rows_equal_the_schema_on_direct_simulations() -> None:
    resolved = Resolved(parse_spec(SPEC))
    points = resolved.points()
    rows = PointRunner(resolved).run_batch(points)
    profile = resolved.profiles[0][1]
    checked = 0
    for point, row in zip(points, rows, strict=True):
        assert list(row) == list(COLUMNS)
        if row["error"]:
            assert point["schedule"] == "2bw" and point["num_microbatches"] < point["num_stages"]
            assert all(same(row[column], value) for column, value in empty_metrics().items())
            continue
        # A column holds one type, filled or failed (a table column keeps its type).
        assert all(type(row[column.name]) is type(column.empty) for column in METRIC_SCHEMA)
        check_summaries(row)
        topology = pipesim.Topology.uniform(num_devices=point["num_stages"], bandwidth=point["bandwidth_bytes_per_s"],
                                            latency=point["latency_s"])
        result = pipesim.simulate(profile, topology, schedule=point["schedule"], num_stages=point["num_stages"],
                                  num_microbatches=point["num_microbatches"], num_minibatches=point["num_minibatches"],
                                  recompute=point["recompute"], engine="auto")
        limit = point["memory_limit_bytes"] if point["memory_limit_bytes"] is not None else min(
            d.memory_bytes for d in topology.devices)
        expected = metrics_row(result.metrics, result.plan.partition, limit)
        for column, value in expected.items():
            assert same(row[column], value), (point, column, row[column], value)
        checked += 1
    assert checked > len(points) // 2


def test_json_lists_are_what_json_writes() -> None:
    for values in ([], [0, 1, -3], [0.1, 1e300, 5e-324, -0.0, 2.0, 1 / 3], [1, 2.5], [float("nan"), math.inf],
                   [True, False], [10**30]):
        assert json_list(values) == json.dumps(values, separators=(",", ":"))


def test_rows_of_several_stages_per_rank_read_the_device() -> None:
    """Issue 18's example as a sweep point: 8 stages on 4 ranks; a row's peak is device 0's
    summed memory (3.40 GB), not the largest stage's (2.20 GB), and its breakdown adds up to it."""
    spec = {"profile": {"uniform": {"layers": 16, "forward_ms": 1, "backward_ms": 2, "activation_bytes": 1e8,
                                    "param_bytes": 1e8}},
            "stages": [8], "stages_per_rank": [2], "microbatches": [8], "schedule": ["interleaved-1f1b"],
            "memory_limit": ["3GB", "3.5GB"]}
    resolved = Resolved(parse_spec(spec))
    rows = PointRunner(resolved).run_batch(resolved.points())
    for row in rows:
        assert row["error"] == ""
        check_summaries(row)
        assert json.loads(row["device_peak_memory_bytes"]) == [3.4e9, 3.0e9, 2.6e9, 2.2e9]
        assert max(json.loads(row["stage_peak_memory_bytes"])) == 2.2e9
    assert [row["fits_memory"] for row in rows] == [False, True]
