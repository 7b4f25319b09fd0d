"""Stochastic runs: seeded, reproducible, and with zero spread exactly the deterministic run."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from pipesim import Topology, make_plan, uniform_profile
from pipesim.engine.des import run_des
from pipesim.engine.noise import draw_durations
from pipesim.errors import ConfigError
from pipesim.metrics import compute_metrics
from pipesim.simulation import prepare, sample_program, simulate, simulate_samples


def program(name: str = "1f1b", *, std: float | None = 1e-4, **plan: object):  # type: ignore[no-untyped-def]
    profile = uniform_profile(num_layers=4, forward_s=1e-3, backward_s=2e-3, activation_bytes=1e6,
                              forward_std_s=std, backward_std_s=None if std is None else 2 * std)
    plan_ = make_plan(profile, schedule=name, num_stages=4, num_microbatches=8, **plan)
    return prepare(profile, Topology.uniform(num_devices=4, bandwidth="10GB/s", latency="5us"), plan_)


def test_same_seed_same_samples_and_samples_do_not_depend_on_their_number() -> None:
    lowered = program()
    a = sample_program(lowered, num_samples=6, seed=11)
    b = sample_program(lowered, num_samples=6, seed=11)
    c = sample_program(lowered, num_samples=3, seed=11)
    d = sample_program(lowered, num_samples=6, seed=12)
    assert a == b
    assert a.iteration_times_s[:3] == c.iteration_times_s
    assert a.iteration_times_s != d.iteration_times_s
    assert a.p5_s <= a.median_s <= a.p95_s
    assert a.median_s == float(np.median(a.iteration_times_s))


@pytest.mark.parametrize("name", ["1f1b", "gpipe", "zbv"])
def test_each_sample_is_the_des_run_of_its_drawn_durations(name: str) -> None:
    lowered = program(name, **({"stages_per_rank": 2} if name == "zbv" else {}))  # type: ignore[arg-type]
    summary = sample_program(lowered, num_samples=3, seed=7)
    for child, time in zip(np.random.SeedSequence(7).spawn(3), summary.iteration_times_s, strict=True):
        durations = draw_durations(lowered, np.random.default_rng(child))
        assert compute_metrics(run_des(lowered, durations=durations)).iteration_time_s == time


@pytest.mark.parametrize("distribution", ["normal", "lognormal", "gamma"])
def test_zero_spread_is_the_deterministic_run_exactly(distribution: str) -> None:
    for lowered, cv in ((program(std=None), None), (program(), 0.0)):
        deterministic = run_des(lowered)
        durations = draw_durations(lowered, np.random.default_rng(5), distribution=distribution, cv=cv)  # type: ignore[arg-type]
        sampled = run_des(lowered, durations=durations)
        assert sampled.equals(deterministic)
        summary = sample_program(lowered, num_samples=4, seed=5, distribution=distribution, cv=cv)  # type: ignore[arg-type]
        assert set(summary.iteration_times_s) == {summary.deterministic_iteration_time_s}
        assert summary.median_s == summary.p5_s == summary.p95_s == summary.deterministic_iteration_time_s


@pytest.mark.parametrize("distribution", ["normal", "lognormal", "gamma"])
def test_draws_have_the_asked_mean_and_spread(distribution: str) -> None:
    lowered = program()
    rng = np.random.default_rng(0)
    first = lowered.ranks[0][0]
    draws = np.array([draw_durations(lowered, rng, distribution=distribution, cv=0.1)[0][0]  # type: ignore[arg-type]
                      for _ in range(4000)])
    assert abs(draws.mean() / first.duration_s - 1) < 0.01
    assert abs(draws.std() / (0.1 * first.duration_s) - 1) < 0.05


def test_measured_spread_drives_the_draws_and_split_ops_share_the_backward_spread() -> None:
    from pipesim.engine.noise import op_spread_s

    lowered = program()
    spread = op_spread_s(lowered, None)
    kinds = [op.op.kind.value for op in lowered.ranks[0]]
    assert spread[0][kinds.index("F")] == pytest.approx(1e-4)
    assert spread[0][kinds.index("B")] == pytest.approx(2e-4)
    assert spread[0][kinds.index("U")] == 0.0


def test_straggler_sensitivity_is_one_for_a_single_stage_and_spread_widens_the_tail() -> None:
    alone = sample_program(_one_stage(), num_samples=2, cv=0.0)
    assert alone.straggler_sensitivity == pytest.approx((1.0,))
    summary = sample_program(program(), num_samples=40, seed=1, cv=0.2)
    assert summary.p95_s > summary.p5_s
    assert len(summary.straggler_sensitivity) == 4
    assert all(0.0 < value <= 1.0 + 1e-9 for value in summary.straggler_sensitivity)


def _one_stage():  # type: ignore[no-untyped-def]
    profile = uniform_profile(num_layers=1, forward_s=1e-3, backward_s=2e-3)
    return prepare(profile, Topology.uniform(num_devices=1), make_plan(profile, schedule="gpipe", num_stages=1,
                                                                       num_microbatches=4))


def test_bad_sampling_arguments_are_config_errors() -> None:
    lowered = program()
    with pytest.raises(ConfigError, match="samples=0: must be an integer from 1 to 100,000"):
        sample_program(lowered, num_samples=0)
    with pytest.raises(ConfigError, match="distribution='weibull'"):
        sample_program(lowered, num_samples=1, distribution="weibull")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="cv=-0.1"):
        sample_program(lowered, num_samples=1, cv=-0.1)


@pytest.mark.parametrize("value", [math.inf, math.nan, 1e308, 100.5, -0.1])
def test_spread_past_the_bound_is_refused_by_the_library(value: float) -> None:
    rule = "must be finite, from 0 to 100 (a coefficient of variation)"
    with pytest.raises(ConfigError, match=re.escape(f"cv={value!r}: {rule}")):
        sample_program(program(), num_samples=1, cv=value)
    with pytest.raises(ConfigError, match=re.escape(f"jitter={value!r}: {rule}")):
        run_des(program(), jitter=value)


def test_a_negative_seed_is_refused_by_the_library() -> None:
    with pytest.raises(ConfigError, match="^seed=-1: must be an integer >= 0$"):
        sample_program(program(), num_samples=2, seed=-1)
    with pytest.raises(ConfigError, match="^seed=-1: must be an integer >= 0$"):
        run_des(program(), jitter=0.1, seed=-1)
    profile = uniform_profile(num_layers=4, forward_s=1e-3, backward_s=2e-3)
    with pytest.raises(ConfigError, match="^seed=-1: must be an integer >= 0$"):
        simulate(profile, schedule="1f1b", num_stages=2, num_microbatches=4, engine="analytic", jitter=0.1, seed=-1)
    with pytest.raises(ConfigError, match="^seed=1.5: must be an integer >= 0$"):
        sample_program(program(), num_samples=2, seed=1.5)  # type: ignore[arg-type]
    assert sample_program(program(), num_samples=2, seed=np.int64(3)) == sample_program(program(), num_samples=2, seed=3)


def test_simulate_samples_runs_a_plan() -> None:
    profile = uniform_profile(num_layers=4, forward_s=1e-3, backward_s=2e-3, backward_input_s=1e-3,
                              backward_weight_s=1e-3)
    plan = make_plan(profile, schedule="zbv", num_stages=4, num_microbatches=4, stages_per_rank=2)
    summary = simulate_samples(profile, Topology.uniform(num_devices=2), plan, num_samples=3, seed=2, cv=0.05)
    assert summary.num_samples == 3 and len(summary.straggler_sensitivity) == 2
