"""The expected iteration time over a calibration run's op-time spread, and the spread it is measured from."""

from __future__ import annotations

import pytest

from pipesim.engine.lowering import Program
from pipesim.errors import ConfigError
from pipesim.harness.calibration import measured_op_spread, measured_op_times
from pipesim.harness.overheads import OpCosts
from pipesim.harness.variability import expected_iteration_time, op_spread_s
from pipesim.simulation import Result, prepare, simulate
from pipesim.spec.profile import Layer, Profile
from pipesim.spec.topology import Topology

PARTITION = ((0, 2), (2, 4))


def balanced() -> Profile:
    layers = [Layer(name=f"l{i}", forward_s=0.001, backward_s=0.002, activation_bytes=0.0, param_bytes=0.0,
                    update_s=0.0005) for i in range(4)]
    return Profile(name="balanced", layers=tuple(layers))


def program_of(schedule: str) -> tuple[Result, Program]:
    result = simulate(balanced(), schedule=schedule, num_stages=2, num_microbatches=4, num_minibatches=6,
                      partition=PARTITION)
    return result, prepare(balanced(), Topology.uniform(num_devices=2), result.plan)


def test_without_spread_the_expectation_is_the_mean_op_times_iteration_time_exactly() -> None:
    result, program = program_of("2bw")
    zero = (OpCosts(0.0, 0.0, 0.0), OpCosts(0.0, 0.0, 0.0))
    expected, error = expected_iteration_time(program, zero, draws=3)
    assert expected == result.metrics.iteration_time_s and error == 0.0


@pytest.mark.parametrize("schedule", ["2bw", "1f1b", "gpipe"])
def test_varying_op_times_make_the_pipeline_wait_longer_than_its_mean_op_times_say(schedule: str) -> None:
    result, program = program_of(schedule)
    spread = (OpCosts(0.0006, 0.0012, 0.0), OpCosts(0.0006, 0.0012, 0.0))  # cv 0.3, as on a busy 2-core machine
    expected, error = expected_iteration_time(program, spread, draws=64, seed=1)
    assert expected > result.metrics.iteration_time_s + 3 * error
    assert expected_iteration_time(program, spread, draws=64, seed=1) == (expected, error)  # seeded: the same


def test_each_op_gets_its_stage_and_kind_spread() -> None:
    _, program = program_of("1f1b")
    spread = (OpCosts(1.0, 2.0, 3.0), OpCosts(4.0, 5.0, 6.0))
    values = op_spread_s(program, spread)
    for stage, kind, value in zip(program.ops.stage, program.ops.kind, values, strict=True):
        assert value == spread[int(stage)].of("FBIWU"[int(kind)])


def test_a_split_backward_shares_its_stage_b_spread_by_duration() -> None:
    split = balanced().model_copy(update={"layers": tuple(
        layer.model_copy(update={"backward_input_s": 0.0005, "backward_weight_s": 0.0015})
        for layer in balanced().layers)})
    result = simulate(split, schedule="zb-h1", num_stages=2, num_microbatches=4, num_minibatches=6,
                      partition=PARTITION)
    program = prepare(split, Topology.uniform(num_devices=2), result.plan)
    spread = (OpCosts(1.0, 0.2, 3.0), OpCosts(4.0, 0.4, 6.0))
    values = op_spread_s(program, spread)
    for stage, kind, value in zip(program.ops.stage, program.ops.kind, values, strict=True):
        letter, costs = "FBIWU"[int(kind)], spread[int(stage)]
        share = {"I": 0.25, "W": 0.75}  # of the stage's B spread, as I and W share I + W
        wanted = share[letter] * costs.backward_s if letter in share else costs.of(letter)
        assert value == pytest.approx(wanted, rel=1e-12)


def test_bad_draws_or_spreads_are_refused() -> None:
    _, program = program_of("1f1b")
    with pytest.raises(ConfigError, match="spread_draws"):
        expected_iteration_time(program, (OpCosts(0, 0, 0),) * 2, draws=0)
    with pytest.raises(ConfigError, match="op_spread"):
        expected_iteration_time(program, (OpCosts(0, 0, 0),), draws=1)
    with pytest.raises(ConfigError, match="op_spread"):
        expected_iteration_time(program, (OpCosts(-1.0, 0, 0),) * 2, draws=1)


def test_the_spread_of_a_trace_with_fixed_op_times_is_zero_and_with_jitter_it_is_measured() -> None:
    fixed = simulate(balanced(), schedule="1f1b", num_stages=2, num_microbatches=4, num_minibatches=5,
                     partition=PARTITION).trace
    assert all(stage.of(kind) < 1e-15 for stage in measured_op_spread(fixed, 2) for kind in "FBU")  # rounding only
    assert measured_op_times(fixed, 2, "mean")[0].of("F") == pytest.approx(0.002)
    varied = simulate(balanced(), schedule="1f1b", num_stages=2, num_microbatches=4, num_minibatches=5,
                      partition=PARTITION, jitter=0.2, seed=3).trace
    spread = measured_op_spread(varied, 2)
    assert all(0.05 < stage.of("F") / 0.002 < 0.35 and 0.05 < stage.of("B") / 0.004 < 0.35 for stage in spread)
