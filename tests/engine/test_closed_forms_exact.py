"""DESIGN.md section 2's closed forms as exact identities over generated p, m, K and stage times.

tests/engine/test_closed_forms.py checks them on a fixed grid with fixed times, to a tolerance; here
the times are drawn (dyadic, so every sum is exact) and iteration times are compared with ``==``.
"""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st
from strategies import ScheduleParams, schedule_params, seconds

from pipesim.engine.des import run_des
from pipesim.engine.lowering import Program
from pipesim.engine.trace import Trace
from pipesim.metrics import Metrics, compute_metrics
from pipesim.schedule.invariants import find_pipemare_violations
from pipesim.simulation import make_plan, prepare
from pipesim.spec.profile import uniform_profile
from pipesim.spec.topology import Topology
from trace_invariants import versions_from_trace


def run(params: ScheduleParams, tf: float, tb: float) -> tuple[Metrics, Program, Trace]:
    p = params.num_stages
    profile = uniform_profile(num_layers=p, forward_s=tf, backward_s=tb, activation_bytes=1024.0, param_bytes=4096.0)
    plan = make_plan(profile, schedule=params.name, num_stages=p, num_microbatches=params.num_microbatches,
                     num_minibatches=params.num_minibatches, pipemare_update=params.options.get("update", "minibatch"))
    program = prepare(profile, Topology.uniform(num_devices=p), plan)
    trace = run_des(program)
    return compute_metrics(trace), program, trace


@given(schedule_params(names=("gpipe", "1f1b")), seconds(), seconds())
def test_flush_schedules_iteration_time_bubble_and_inflight(params: ScheduleParams, tf: float, tb: float) -> None:
    metrics, _, _ = run(params, tf, tb)
    p, m, k = params.num_stages, params.num_microbatches, params.num_minibatches
    assert metrics.iteration_time_s == (m + p - 1) * (tf + tb)
    assert metrics.makespan_s == k * (m + p - 1) * (tf + tb)
    assert math.isclose(metrics.bubble_fraction, (p - 1) / (m + p - 1), rel_tol=1e-12, abs_tol=1e-15)
    for stage in metrics.stages:
        assert stage.max_inflight_microbatches == (m if params.name == "gpipe" else min(m, p - stage.stage))
        assert (stage.weight_versions_max, stage.forward_delay_steps, stage.discrepancy_max) == (1, 0, 0)


@st.composite
def steady_params(draw: st.DrawFn, name: str) -> ScheduleParams:
    """p stages and m >= p microbatches over 4 minibatches: the measured window is steady."""
    p = draw(st.integers(1, 6))
    return ScheduleParams(name, p, draw(st.integers(p, 8)), 4)


@given(steady_params("pipedream") | steady_params("2bw"), seconds(), seconds())
def test_asynchronous_schedules_have_no_bubble_in_steady_state(params: ScheduleParams, tf: float, tb: float) -> None:
    metrics, _, _ = run(params, tf, tb)
    p = params.num_stages
    assert metrics.iteration_time_s == params.num_microbatches * (tf + tb)
    assert metrics.bubble_fraction <= 1e-12
    for stage in metrics.stages:
        if params.name == "pipedream":
            assert (stage.weight_versions_max, stage.forward_delay_steps) == (p - stage.stage, p - 1 - stage.stage)
        else:
            assert stage.weight_versions_max <= 2 and stage.forward_delay_steps == 1
        assert stage.discrepancy_max == 0


@given(schedule_params(names=("pipemare",)), seconds(), seconds())
def test_pipemare_discrepancy_of_every_microbatch_is_the_closed_form(params: ScheduleParams, tf: float,
                                                                     tb: float) -> None:
    metrics, program, trace = run(params, tf, tb)
    update_every = params.num_microbatches if params.options["update"] == "minibatch" else 1
    assert find_pipemare_violations(program.schedule, versions_from_trace(trace), update_every) == []
    for stage in metrics.stages:
        assert stage.weight_versions_max == 1
        assert stage.forward_delay_steps == stage.discrepancy_max
