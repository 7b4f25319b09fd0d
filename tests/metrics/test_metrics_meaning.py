"""compute_metrics against the definitions of its metrics, summed span by span and event by event
in test code, on generated runs; and the compiled kernels against their plain-Python form."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipesim
from pipesim.engine.trace import CATEGORIES, Trace
from pipesim.errors import ConfigError
from pipesim.metrics import Metrics, compute_metrics, kernels, minibatch_ends, stage_staleness
from pipesim.simulation import make_plan, simulate_plan
from engine_strategies import Case, cases


def bits(value: Any) -> Any:
    """``value`` with every float as its hex form, so that equality is bit for bit (-0.0 != 0.0)."""
    if isinstance(value, float):
        return value.hex()
    if isinstance(value, dict):
        return {key: bits(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [bits(item) for item in value]
    return value


def shuffled(trace: Trace, seed: int) -> Trace:
    """The same spans and memory events in another stored order."""
    rng = np.random.default_rng(seed)
    spans, memory = rng.permutation(trace.num_spans), rng.permutation(trace.memory["time_s"].size)
    return Trace(info=trace.info, spans={c: v[spans] for c, v in trace.spans.items()},
                 memory={c: v[memory] for c, v in trace.memory.items()})


def check_definitions(trace: Trace, metrics: Metrics, microbatch_size: int) -> None:
    """Every metric, recomputed from its definition; ``microbatch_size``: the profile's samples per microbatch."""
    spans = list(trace.iter_spans())
    compute = [span for span in spans if span.stream == "compute"]
    ends: dict[int, float] = defaultdict(float)
    for span in compute:
        ends[span.minibatch] = max(ends[span.minibatch], span.end_s)
    assert metrics.makespan_s == max(span.end_s for span in spans)
    low, high = metrics.window_start_s, metrics.window_end_s
    # The window drops the first (warm-up) minibatch from 2 on and, from 3 on, the drain: the last
    # minibatch and every one from the first with an op ending after its device's last forward,
    # keeping at least one minibatch in the window.
    k = metrics.num_minibatches
    last_forward: dict[int, float] = defaultdict(lambda: float("-inf"))
    for span in compute:
        if "F" in span.op:
            last_forward[span.device] = max(last_forward[span.device], span.end_s)
    drained = min((s.minibatch for s in compute if s.end_s > last_forward[s.device]), default=k)
    warmup, cooldown = int(k >= 2), (k - 1 - min(k - 2, max(1, drained - 1)) if k >= 3 else 0)
    assert (metrics.warmup_minibatches, metrics.cooldown_minibatches) == (warmup, cooldown)
    if k >= 2:
        assert low == ends[0] and high == ends[k - 1 - cooldown]
    else:
        assert (low, high) == (0.0, metrics.makespan_s)
    assert metrics.iteration_time_s == pytest.approx((high - low) / (k - warmup - cooldown), rel=1e-12)
    samples = metrics.num_microbatches * microbatch_size
    assert metrics.throughput_samples_per_s == pytest.approx(
        samples / metrics.iteration_time_s if metrics.iteration_time_s > 0 else float("inf"), rel=1e-12)
    assert metrics.bubble_fraction == pytest.approx(1 - sum(metrics.device_utilization) / metrics.num_ranks,
                                                    rel=1e-9, abs=1e-12)
    assert metrics.peak_memory_bytes == max(metrics.device_peak_memory_bytes)
    for device, utilization in enumerate(metrics.device_utilization):
        busy = sum(max(0.0, min(s.end_s, high) - max(s.start_s, low)) for s in compute if s.device == device)
        assert utilization == pytest.approx(busy / (high - low) if high > low else 1.0, rel=1e-9, abs=1e-12)
    for stage in metrics.stages:
        assert stage.device == trace.info.stage_to_rank[stage.stage]
        assert stage.utilization == metrics.device_utilization[stage.device]  # a stage's is its device's
        assert stage.bubble_fraction == pytest.approx(1 - stage.utilization, rel=1e-12, abs=1e-15)
        levels, counts, totals, held = dict.fromkeys(CATEGORIES, 0.0), dict.fromkeys(CATEGORIES, 0), [], []
        events = sorted((e for e in zip(*(trace.memory[c].tolist() for c in trace.memory), strict=True)
                         if e[2] == stage.stage), key=lambda e: e[0])
        for index, (time_s, _, _, category, delta_bytes, delta_count) in enumerate(events):
            levels[CATEGORIES[category]] += delta_bytes
            counts[CATEGORIES[category]] += delta_count
            if index + 1 == len(events) or events[index + 1][0] != time_s:  # read after each instant
                totals.append(sum(levels.values()))
                held.append((counts["weights"], counts["activations"]))
        # Sums in another order differ by rounding, which is relative to the bytes moved, not to a
        # level that cancels to about 0 (a stash taken and freed at one instant).
        rounding = 1e-9 * sum(abs(event[4]) for event in events)
        assert stage.peak_memory_bytes == pytest.approx(max(totals, default=0.0), rel=1e-9, abs=rounding)
        assert sum(stage.peak_breakdown_bytes.values()) == pytest.approx(stage.peak_memory_bytes, rel=1e-9,
                                                                         abs=rounding)
        assert stage.weight_versions_max == max((w for w, _ in held), default=0)
        assert stage.max_inflight_microbatches == max((a for _, a in held), default=0)
        mine = sorted((s for s in compute if s.stage == stage.stage), key=lambda s: s.position)
        forward = {s.microbatch: s.weight_version for s in mine if "F" in s.op}
        updates = [s for s in mine if "U" in s.op]
        discrepancies = [s.weight_version - forward[s.microbatch] for s in mine if "B" in s.op or "I" in s.op]
        delays = [next(u.weight_version for u in updates if u.position >= s.position) - forward[s.microbatch]
                  for s in mine if ("B" in s.op or "W" in s.op) and any(u.position >= s.position for u in updates)]
        assert stage.discrepancy_max == max(discrepancies, default=0)
        assert stage.forward_delay_steps == max(delays, default=0)
        assert stage.forward_delay_mean == (sum(delays) / len(delays) if delays else 0.0)
    events = sorted(zip(*(trace.memory[c].tolist() for c in trace.memory), strict=True), key=lambda e: e[0])
    for device, device_peak in enumerate(metrics.device_peak_memory_bytes):
        level, peak = 0.0, 0.0  # the device's stages summed, read after each instant
        mine_only = [e for e in events if e[1] == device]
        for index, event in enumerate(mine_only):
            level += event[4]
            if index + 1 == len(mine_only) or mine_only[index + 1][0] != event[0]:
                peak = max(peak, level)
        assert device_peak == pytest.approx(peak, rel=1e-9, abs=1e-9 * sum(abs(event[4]) for event in mine_only))


def same_in_both_forms(trace: Trace) -> Metrics:
    """The metrics, after checking that the compiled kernels and their plain form agree bit for bit."""
    compiled, plain = compute_metrics(trace, compiled=True), compute_metrics(trace, compiled=False)
    assert bits(compiled.to_dict()) == bits(plain.to_dict())
    assert bits([a.tolist() for a in stage_staleness(trace, compiled=True)]) == bits(
        [a.tolist() for a in stage_staleness(trace, compiled=False)])
    return compiled


@settings(max_examples=60)
@given(cases(), st.sampled_from([0.0, 0.3]), st.integers(0, 3))
def test_generated_runs_meet_the_definitions(case: Case, jitter: float, seed: int) -> None:
    plan = make_plan(case.profile, **case.kwargs)
    trace = simulate_plan(case.profile, case.topology, plan, engine="des", jitter=jitter, seed=seed).trace
    metrics = same_in_both_forms(trace)
    check_definitions(trace, metrics, case.profile.microbatch_size)
    # Rows in another stored order: the same metrics, up to the order of the sums.
    check_definitions(trace, same_in_both_forms(shuffled(trace, seed)), case.profile.microbatch_size)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "pipedream", "2bw", "pipemare", "interleaved-1f1b", "zbv"])
def test_larger_runs_meet_the_definitions(schedule: str) -> None:
    # Sizes that do not divide (1000.5 bytes) and a slow link, so that sums round and waits are exposed.
    profile = pipesim.uniform_profile(num_layers=24, forward_s=1.1e-3, backward_s=2.3e-3, activation_bytes=1000.5,
                                      param_bytes=4e6 / 3, microbatch_size=3)
    per_rank = 2 if schedule in ("interleaved-1f1b", "zbv") else 1
    topology = pipesim.Topology.uniform(num_devices=8 // per_rank, bandwidth="1MB/s", latency="5us")
    trace = pipesim.simulate(profile, topology, schedule=schedule, num_stages=8, num_microbatches=8,
                             num_minibatches=3, stages_per_rank=per_rank, recompute=schedule == "2bw",
                             engine="analytic").trace
    metrics = same_in_both_forms(trace)
    assert any(stage.exposed_communication_s > 0 for stage in metrics.stages)
    check_definitions(trace, metrics, 3)
    check_definitions(trace, same_in_both_forms(shuffled(trace, 7)), 3)


@pytest.mark.parametrize("has_nan", [False, True])
@pytest.mark.parametrize("compiled", [True, False])
def test_minibatch_ends_are_the_largest_end_per_minibatch(has_nan: bool, compiled: bool) -> None:
    rng = np.random.default_rng(4)
    stream = rng.integers(0, 3, 500)
    minibatch = rng.integers(0, 7, 500)
    end = rng.random(500) * 10
    if has_nan:
        end[[17, 300]] = np.nan
    compute = stream == 0
    expected = np.zeros(8)
    np.maximum.at(expected, minibatch[compute], end[compute])
    assert bits(kernels.minibatch_ends(stream, minibatch, end, 8, compiled=compiled).tolist()) == bits(
        expected.tolist())
    minibatch[np.flatnonzero(compute)[3]] = 8
    with pytest.raises(ConfigError, match="spans.minibatch.*8.*must be in 0..7"):
        kernels.minibatch_ends(stream, minibatch, end, 8, compiled=compiled)


def test_a_trace_with_a_stage_out_of_range_is_refused_by_name() -> None:
    profile = pipesim.uniform_profile(num_layers=4, forward_s=1e-3, backward_s=2e-3, activation_bytes=10.0)
    trace = pipesim.simulate(profile, schedule="1f1b", num_stages=2, num_microbatches=2).trace
    stage = trace.spans["stage"].copy()
    stage[0] = 5
    broken = Trace(info=trace.info, spans={**trace.spans, "stage": stage}, memory=trace.memory)
    with pytest.raises(ConfigError, match=r"spans.stage.*5.*must be in 0..1"):
        compute_metrics(broken, compiled=False)
    assert minibatch_ends(trace, compiled=False).tolist() == [trace.makespan_s]


def test_a_wait_table_too_large_renumbers_the_microbatches(monkeypatch: pytest.MonkeyPatch) -> None:
    profile = pipesim.uniform_profile(num_layers=4, forward_s=1e-3, backward_s=2e-3, activation_bytes=1e3)
    topology = pipesim.Topology.uniform(num_devices=4, bandwidth="1MB/s", latency="5us")
    trace = pipesim.simulate(profile, topology, schedule="1f1b", num_stages=4, num_microbatches=4).trace
    expected = kernels.exposed_communication(trace, 4, 4, 0.0, trace.makespan_s, compiled=False)
    assert any(expected)
    # Sparse microbatch indices (only their equality matters here) need a table of 6 x 5 x 3001 cells.
    sparse = Trace(info=trace.info, spans={**trace.spans, "microbatch": trace.spans["microbatch"] * 1000},
                   memory=trace.memory)
    monkeypatch.setattr(kernels, "MAX_TABLE", 1000)  # read at call time by the plain-Python form
    assert kernels.exposed_communication(sparse, 4, 4, 0.0, trace.makespan_s, compiled=False) == expected
    monkeypatch.setattr(kernels, "MAX_TABLE", 100)
    with pytest.raises(ConfigError, match="table cells"):
        kernels.exposed_communication(sparse, 4, 4, 0.0, trace.makespan_s, compiled=False)


@pytest.mark.skipif(not pipesim.jit.AVAILABLE, reason="numba is not installed")
def test_compiled_metrics_run_numbas_kernels() -> None:
    """``compiled=True`` reaches numba's dispatchers (so that the comparisons above compare two forms):
    each metrics kernel has a compiled signature after one call."""
    profile = pipesim.uniform_profile(num_layers=4, forward_s=1e-3, backward_s=2e-3, activation_bytes=1e3)
    topology = pipesim.Topology.uniform(num_devices=2, bandwidth="1MB/s", latency="5us")
    trace = pipesim.simulate(profile, topology, schedule="1f1b", num_stages=2, num_microbatches=4).trace
    compute_metrics(trace, compiled=True)
    stage_staleness(trace, compiled=True)
    for kernel in (kernels._exposed, kernels._levels, kernels._staleness, kernels._minibatch_ends):
        assert kernel.dispatcher().signatures, kernel.__name__  # type: ignore[attr-defined]
