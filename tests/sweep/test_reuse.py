"""pipesim.reuse: what a sweep's points share gives the rows and traces a fresh simulation gives."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from pipesim.metrics import compute_metrics, stage_staleness
from pipesim.reuse import Reuse
from pipesim.schedule.registry import build_schedule
from pipesim.simulation import make_plan, prepare, simulate_plan
from pipesim.spec.profile import uniform_profile
from pipesim.spec.topology import Topology
from pipesim.sweep import PointRunner, Resolved, parse_spec
from pipesim.sweep.points import SHARED_WORK, shared_work_order

SPEC = {
    "profile": {"uniform": {"layers": 16, "forward_ms": 1.3, "backward_ms": 2.1, "activation_bytes": 3000000,
                            "param_bytes": 2000000}},
    "bandwidth": ["1GB/s", "100GB/s"],
    "latency": ["5us", "1ms"],
    "stages": [2, 5],
    "microbatches": [5, 10],
    "minibatches": [3],
    "schedule": ["gpipe", "1f1b", "pipedream", "2bw", "pipemare"],
    "recompute": [False, True],
}


def same_row(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal rows, NaN equal to NaN."""
    return a.keys() == b.keys() and all(
        x == y or (isinstance(x, float) and math.isnan(x) and isinstance(y, float) and math.isnan(y))
        for x, y in zip(a.values(), b.values(), strict=True))


def rows_both_ways(spec: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]], PointRunner]:
    """The sweep's rows run in shared-work order with reuse, the rows of a fresh run of each
    point (by point), and the sharing runner."""
    resolved = Resolved(parse_spec(spec))
    points = resolved.points()
    fresh = PointRunner(resolved)
    fresh.reuse = None  # type: ignore[assignment]
    expected = {point["point"]: fresh.run(point) for point in points}
    shared = PointRunner(resolved)
    return shared.run_batch(shared_work_order(points)), expected, shared


def test_rows_with_reuse_equal_rows_without() -> None:
    rows, expected, shared = rows_both_ways(SPEC)
    points = list(expected)
    assert sorted(row["point"] for row in rows) == sorted(expected)
    assert all(same_row(row, expected[row["point"]]) for row in rows)
    stats = shared.reuse.stats()
    # 2 bandwidths x 2 latencies x 2 recompute settings share each order; the counts share the costs.
    assert stats["order_misses"] == len(points) // 8
    assert stats["order_hits"] == len(points) - len(points) // 8
    assert stats["costs_hits"] > 0


def test_zb_auto_orders_are_shared_only_between_points_of_equal_costs() -> None:
    # zb-auto's order follows the link times: reuse must not hand one link's order to another.
    spec = {"profile": {"uniform": {"layers": 8, "forward_ms": 1.3, "backward_ms": 2.1, "activation_bytes": 3e6}},
            "bandwidth": ["1GB/s", "100GB/s"], "stages": [2, 4], "microbatches": [6], "minibatches": [1, 3],
            "schedule": ["zb-h1", "zb-auto"]}
    rows, expected, _ = rows_both_ways(spec)
    assert all(same_row(row, expected[row["point"]]) for row in rows) and len(rows) == len(expected)
    times: dict[tuple[Any, ...], dict[str, float]] = {}
    for row in rows:
        key = (row["bandwidth_bytes_per_s"], row["num_stages"], row["num_minibatches"])
        times.setdefault(key, {})[row["schedule"]] = row["iteration_time_s"]
    assert all(pair["zb-auto"] <= pair["zb-h1"] for pair in times.values())


def test_shared_work_order_groups_points_and_keeps_their_order_within_a_group() -> None:
    points = Resolved(parse_spec(SPEC)).points()
    ordered = shared_work_order(points)
    assert sorted(point["point"] for point in ordered) == [point["point"] for point in points]
    keys = [tuple(point[axis] for axis in SHARED_WORK) for point in ordered]
    runs = [key for i, key in enumerate(keys) if i == 0 or keys[i - 1] != key]
    assert len(runs) == len(set(keys))  # each group is one run of adjacent points
    for key in set(keys):
        members = [point["point"] for point in ordered if tuple(point[axis] for axis in SHARED_WORK) == key]
        assert members == sorted(members)


def test_a_reused_trace_is_the_fresh_trace() -> None:
    profile = uniform_profile(num_layers=12, forward_s=0.001, backward_s=0.002, activation_bytes=1e6,
                              param_bytes=1e6)
    reuse = Reuse()
    for bandwidth in ("1GB/s", "10GB/s"):
        topology = Topology.uniform(num_devices=4, bandwidth=bandwidth, latency="10us")
        for recompute in (False, True):
            plan = make_plan(profile, schedule="pipedream", num_stages=4, num_microbatches=6, num_minibatches=2,
                             recompute=recompute)
            got = simulate_plan(profile, topology, plan, engine="analytic", reuse=reuse)
            want = simulate_plan(profile, topology, plan, engine="analytic")
            assert got.metrics == want.metrics
            for name, column in want.trace.spans.items():
                assert np.array_equal(got.trace.spans[name], column), name
    assert reuse.stats()["order_misses"] == 1 and reuse.stats()["order_hits"] == 3


def test_stage_costs_are_reused_across_counts_only() -> None:
    profile = uniform_profile(num_layers=8, forward_s=0.001, backward_s=0.002, activation_bytes=1e6, param_bytes=1e6)
    topology = Topology.uniform(num_devices=2, bandwidth="10GB/s", latency="10us")
    reuse = Reuse()
    costs = {}
    for m, recompute in ((4, False), (8, False), (4, True)):
        plan = make_plan(profile, schedule="1f1b", num_stages=2, num_microbatches=m, num_minibatches=2,
                         recompute=recompute)
        costs[m, recompute] = prepare(profile, topology, plan, reuse=reuse).costs
    assert costs[4, False] is costs[8, False]
    assert costs[4, True] != costs[4, False]  # recomputation adds the forward to B
    assert reuse.stats() == {"order_hits": 1, "order_misses": 2, "costs_hits": 1, "costs_misses": 2}


def test_orders_are_kept_least_recently_used_first_out() -> None:
    reuse = Reuse(orders=1)
    made: list[int] = []

    def make(m: int) -> Any:
        made.append(m)
        return build_schedule("1f1b", 2, m)

    first = reuse.order(("1f1b", 2, 4), lambda: make(4))
    assert reuse.order(("1f1b", 2, 4), lambda: make(4)) is first
    reuse.order(("1f1b", 2, 6), lambda: make(6))
    assert reuse.order(("1f1b", 2, 4), lambda: make(4)) is not first
    assert made == [4, 6, 4]


def test_staleness_is_kept_only_for_a_held_order() -> None:
    profile = uniform_profile(num_layers=6, forward_s=0.001, backward_s=0.002, activation_bytes=1e6, param_bytes=1e6)
    topology = Topology.uniform(num_devices=3, bandwidth="10GB/s", latency="10us")
    plan = make_plan(profile, schedule="pipemare", num_stages=3, num_microbatches=4, num_minibatches=3)
    reuse = Reuse()
    result = simulate_plan(profile, topology, plan, engine="analytic", reuse=reuse)
    calls: list[int] = []

    def measure() -> Any:
        calls.append(1)
        return stage_staleness(result.trace)

    known = reuse.staleness(result.schedule, measure)  # measured by simulate_plan already
    assert calls == []
    assert compute_metrics(result.trace, staleness=known) == compute_metrics(result.trace)
    other = simulate_plan(profile, topology, plan, engine="analytic")  # its own order, not held
    reuse.staleness(other.schedule, measure)
    reuse.staleness(other.schedule, measure)
    assert calls == [1, 1]


@pytest.mark.parametrize("name", ["gpipe", "2bw"])
def test_a_kept_schedule_is_read_only(name: str) -> None:
    schedule = build_schedule(name, 3, 4, num_minibatches=2)
    for column in (schedule.table.stage, schedule.table.kind, schedule.version, schedule.wait, schedule.forward,
                   schedule.updates_before):
        with pytest.raises(ValueError):
            column[0] = 1


def test_traces_of_one_order_share_their_span_columns_but_the_times_and_bytes() -> None:
    topology = Topology.uniform(num_devices=3, bandwidth="10GB/s", latency="10us")
    reuse = Reuse()
    traces = []
    for activation_bytes in (1e6, 1e6, 2e6):
        profile = uniform_profile(num_layers=6, forward_s=0.001, backward_s=0.002, activation_bytes=activation_bytes,
                                  param_bytes=1e6)
        plan = make_plan(profile, schedule="2bw", num_stages=3, num_microbatches=3, num_minibatches=2)
        traces.append(simulate_plan(profile, topology, plan, engine="analytic", reuse=reuse).trace)
        want = simulate_plan(profile, topology, plan, engine="analytic").trace
        for name, column in want.spans.items():
            assert np.array_equal(traces[-1].spans[name], column), name
    assert reuse.stats()["order_misses"] == 1
    first, second, third = (trace.spans for trace in traces)
    assert first["kind"] is second["kind"] and first["bytes"] is second["bytes"]
    assert first["start_s"] is not second["start_s"]
    assert first["bytes"] is not third["bytes"]  # other output bytes: built again
    assert not first["kind"].flags.writeable


def test_one_runner_shared_by_threads_gives_the_rows_of_fresh_simulations() -> None:
    """A Dask worker with several threads runs batches of one PointRunner at once."""
    resolved = Resolved(parse_spec(SPEC))
    points = shared_work_order(resolved.points())
    fresh = PointRunner(resolved)
    fresh.reuse = None  # type: ignore[assignment]
    expected = {point["point"]: fresh.run(point) for point in points}
    shared = PointRunner(resolved)
    shared.reuse = Reuse(orders=1, costs=2)  # small, so that threads evict each other's entries
    with ThreadPoolExecutor(4) as pool:
        batches = list(pool.map(shared.run_batch, [points[i::4] for i in range(4)] * 3))
    assert all(same_row(row, expected[row["point"]]) for batch in batches for row in batch)


@pytest.mark.parametrize(("schedule", "per_rank"), [("zb-h1", 1), ("zbv", 2), ("interleaved-1f1b", 2)])
def test_a_non_columnar_schedule_is_built_once_and_gives_a_fresh_runs_result(schedule: str, per_rank: int) -> None:
    reuse = Reuse()
    topology = Topology.uniform(num_devices=2, bandwidth="10GB/s", latency="5us")
    results = []
    for forward_s in (1e-3, 2e-3):  # two profiles: the costs differ, the order is the same
        profile = uniform_profile(num_layers=8, forward_s=forward_s, backward_s=2e-3, activation_bytes=1e6)
        plan = make_plan(profile, schedule=schedule, num_stages=2 * per_rank, num_microbatches=4,
                         stages_per_rank=per_rank)
        shared = simulate_plan(profile, topology, plan, engine="analytic", reuse=reuse)
        fresh = simulate_plan(profile, topology, plan, engine="analytic")
        assert shared.trace.to_json() == fresh.trace.to_json()
        results.append(shared)
    assert results[0].schedule is results[1].schedule
