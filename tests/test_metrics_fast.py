"""compute_metrics, on both of its paths (numpy, and the kernels compiled or plain), equals main's
per-stage implementation (tests/metrics_reference.py) bit for bit."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipesim
import pipesim.metrics
from pipesim.engine.trace import Trace
from pipesim.metrics import _exposed_communication, compute_metrics, kernels, staleness
from pipesim.simulation import make_plan, prepare, simulate_plan
from tests.engine_strategies import Case, cases
from tests.metrics_reference import _exposed_communication as reference_exposed
from tests.metrics_reference import compute_metrics as reference_metrics
from tests.metrics_reference import staleness as reference_staleness


@pytest.fixture(params=["numpy", "kernels", "plain-kernels"], autouse=True)
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test runs on the numpy path, on the kernels (compiled when numba is installed), and on
    the kernels as plain Python (what PIPESIM_NO_JIT=1 runs)."""
    monkeypatch.setattr(pipesim.metrics, "USE_KERNELS", request.param != "numpy")
    if request.param == "plain-kernels":
        for name in ("_exposed", "_levels", "_staleness", "_minibatch_ends"):
            kernel = getattr(kernels, name)
            monkeypatch.setattr(kernels, name, getattr(kernel, "py_func", kernel))
    return str(request.param)


def bits(value: Any) -> Any:
    """``value`` with every float as its hex form, so that equality is bit for bit (-0.0 != 0.0)."""
    if isinstance(value, float):
        return value.hex()
    if isinstance(value, dict):
        return {key: bits(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [bits(item) for item in value]
    return value


def assert_same(trace: Trace) -> None:
    new, old = compute_metrics(trace), reference_metrics(trace)
    assert bits(new.to_dict()) == bits(old.to_dict())
    for stage in range(new.num_stages):
        assert bits(staleness(trace, stage)) == bits(reference_staleness(trace, stage))
    low, high = new.window_start_s, new.window_end_s
    for device in range(new.num_ranks):
        assert bits(_exposed_communication(trace, device, low, high)) == bits(
            reference_exposed(trace, device, low, high))


def shuffled(trace: Trace, seed: int) -> Trace:
    """The same spans and memory events in another stored order (the paths for unsorted rows)."""
    rng = np.random.default_rng(seed)
    spans, memory = rng.permutation(trace.num_spans), rng.permutation(trace.memory["time_s"].size)
    return Trace(meta=trace.meta, spans={c: v[spans] for c, v in trace.spans.items()},
                 memory={c: v[memory] for c, v in trace.memory.items()})


@settings(max_examples=80)
@given(cases(), st.sampled_from([0.0, 0.3]), st.integers(0, 3))
def test_generated_runs_give_the_reference_metrics(case: Case, jitter: float, seed: int) -> None:
    plan = make_plan(case.profile, **case.kwargs)
    trace = simulate_plan(case.profile, case.topology, plan, engine="des", jitter=jitter, seed=seed).trace
    assert_same(trace)
    assert_same(shuffled(trace, seed))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "pipedream", "2bw", "pipemare", "interleaved-1f1b", "zbv"])
def test_larger_runs_of_the_sweep_give_the_reference_metrics(schedule: str) -> None:
    # Sizes that do not divide (1000.5 bytes) and a slow link, so that sums round and waits are exposed.
    profile = pipesim.uniform_profile(num_layers=48, forward_s=1.1e-3, backward_s=2.3e-3, activation_bytes=1000.5,
                                      param_bytes=4e6 / 3)
    per_rank = 2 if schedule in ("interleaved-1f1b", "zbv") else 1
    topology = pipesim.Topology.uniform(num_devices=16 // per_rank, bandwidth="1MB/s", latency="5us")
    plan = make_plan(profile, schedule=schedule, num_stages=16, num_microbatches=32, num_minibatches=4,
                     stages_per_rank=per_rank, recompute=schedule == "2bw")
    program = prepare(profile, topology, plan)
    from pipesim.engine.analytic import run_analytic

    trace = run_analytic(program)
    assert any(stage.exposed_communication_s > 0 for stage in compute_metrics(trace).stages)
    # An engine's trace is in the order the kernels need: none of them falls back to numpy.
    assert kernels.exposed_communication(trace, 16 // per_rank, 16, 0.0, trace.makespan_s) is not None
    assert kernels.level_peaks(trace, trace.memory["stage"], 16) is not None
    assert kernels.staleness_all(trace, trace.spans["stage"], 16) is not None
    assert_same(trace)
    assert_same(shuffled(trace, 7))


def test_a_profile_without_sizes_gives_the_reference_metrics() -> None:
    profile = pipesim.uniform_profile(num_layers=8, forward_s=1e-3, backward_s=2e-3)
    for schedule in ("pipedream", "2bw", "gpipe"):
        assert_same(pipesim.simulate(profile, schedule=schedule, num_stages=4, num_microbatches=8,
                                     num_minibatches=3).trace)


@pytest.mark.parametrize("has_nan", [False, True])
def test_minibatch_ends_kernel_is_maximum_at(has_nan: bool) -> None:
    rng = np.random.default_rng(4)
    stream = rng.integers(0, 3, 500)
    minibatch = rng.integers(0, 7, 500)
    end = rng.random(500) * 10
    if has_nan:
        end[[17, 300]] = np.nan
    compute = stream == 0
    expected = np.zeros(8)
    np.maximum.at(expected, minibatch[compute], end[compute])
    found = kernels.minibatch_ends(stream, minibatch, end, 8)
    assert found is not None and bits(found.tolist()) == bits(expected.tolist())
    minibatch[np.flatnonzero(compute)[3]] = 8
    assert kernels.minibatch_ends(stream, minibatch, end, 8) is None
