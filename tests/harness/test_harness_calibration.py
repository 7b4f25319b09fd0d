"""The calibration run: a profile scaled to a real pipeline run's op times, and validate's two predictions."""

from __future__ import annotations

import pytest

from pipesim.errors import ConfigError
from pipesim.harness.calibration import CalibrationRun, scaled, stage_op_times
from pipesim.harness.overheads import OpCosts
from pipesim.spec.profile import Layer, Profile

PARTITION = ((0, 2), (2, 4))


def four_layers(**overheads: float) -> Profile:
    layers = [Layer(name=f"l{i}", forward_s=0.001 * (i + 1), backward_s=0.002 * (i + 1), activation_bytes=100.0 * i,
                    param_bytes=10.0 * i, update_s=0.0 if i == 3 else 0.0005, forward_std_s=0.0001)
              for i in range(4)]
    return Profile(name="four", layers=tuple(layers), **overheads)


def test_each_stage_gets_the_calibration_run_op_times_and_keeps_its_layer_shares() -> None:
    profile = four_layers(forward_overhead_s=0.0002, backward_overhead_s=0.0003, update_overhead_s=0.0001)
    targets = (OpCosts(0.004, 0.009, 0.002), OpCosts(0.011, 0.015, 0.0005))
    calibrated = scaled(profile, PARTITION, targets)
    for got, wanted in zip(stage_op_times(calibrated, PARTITION), targets, strict=True):
        for kind in "FBU":
            assert got.of(kind) == pytest.approx(wanted.of(kind), rel=1e-12)
    # Within a stage the layers keep their proportions (layer 1 is twice layer 0 in F and B).
    assert calibrated.layers[1].forward_s == pytest.approx(2 * calibrated.layers[0].forward_s, rel=1e-12)
    assert calibrated.layers[3].backward_s == pytest.approx(4 / 3 * calibrated.layers[2].backward_s, rel=1e-12)
    # Spreads scale with their times; sizes and overheads are untouched.
    ratio = calibrated.layers[0].forward_s / profile.layers[0].forward_s
    assert calibrated.layers[0].forward_std_s == pytest.approx(0.0001 * ratio, rel=1e-12)
    assert [layer.activation_bytes for layer in calibrated.layers] == [layer.activation_bytes
                                                                       for layer in profile.layers]
    assert calibrated.forward_overhead_s == profile.forward_overhead_s


def test_a_split_backward_scales_as_its_stage_b() -> None:
    profile = four_layers(backward_overhead_s=0.0003)
    split = profile.model_copy(update={"layers": tuple(
        layer.model_copy(update={"backward_input_s": 0.4 * layer.backward_s, "backward_weight_s": 0.7 * layer.backward_s})
        for layer in profile.layers)})
    calibrated = scaled(split, PARTITION, (OpCosts(0.004, 0.009, 0.002), OpCosts(0.011, 0.015, 0.0005)))
    for before, after in zip(split.layers, calibrated.layers, strict=True):
        ratio = after.backward_s / before.backward_s
        assert ratio != pytest.approx(1.0)
        assert after.backward_input_s == pytest.approx(before.backward_input_s * ratio, rel=1e-12)
        assert after.backward_weight_s == pytest.approx(before.backward_weight_s * ratio, rel=1e-12)


def test_a_kind_the_profile_gives_no_time_is_shared_equally_and_a_target_below_the_overhead_is_zero() -> None:
    profile = four_layers(update_overhead_s=0.001)
    no_update = profile.model_copy(update={"layers": tuple(layer.model_copy(update={"update_s": 0.0})
                                                           for layer in profile.layers)})
    calibrated = scaled(no_update, PARTITION, (OpCosts(0.003, 0.006, 0.003), OpCosts(0.007, 0.014, 0.0005)))
    assert calibrated.layers[0].update_s == pytest.approx(0.001) and calibrated.layers[1].update_s == pytest.approx(0.001)
    assert calibrated.layers[2].update_s == 0.0 and calibrated.layers[3].update_s == 0.0


def test_a_calibration_takes_the_calibrated_runs_counts_unless_given_its_own() -> None:
    assert CalibrationRun().counts(8, 4) == (8, 4)
    assert CalibrationRun().counts(8, 2) == (8, 3)  # at least one steady-state minibatch
    assert CalibrationRun(num_microbatches=4, num_minibatches=20).counts(8, 4) == (4, 20)
    assert CalibrationRun(num_minibatches=6).counts(2, 4) == (2, 6)
    with pytest.raises(ConfigError, match="calibration_microbatches=None: give the calibration's own or"):
        CalibrationRun().counts()
    assert "m=as the run K=as the run" in CalibrationRun().describe()
    assert "m=8 K=4" in CalibrationRun().describe(counts=(8, 4)) and "minibatches 1..2" in CalibrationRun().describe(
        counts=(8, 4))


def test_a_calibration_run_needs_a_steady_state() -> None:
    with pytest.raises(ConfigError, match="calibration_minibatches"):
        CalibrationRun(num_minibatches=2)
    with pytest.raises(ConfigError, match="calibration_microbatches"):
        CalibrationRun(num_microbatches=0)


def test_a_real_calibration_run_sets_each_stage_op_times_from_its_spans() -> None:
    pytest.importorskip("torch")
    from pipesim.harness.calibration import calibrate
    from pipesim.harness.config import ModelSpec
    from pipesim.harness.profiler import Timing, measure_profile

    spec = ModelSpec("mlp", depth=3, width=16)
    profile = measure_profile(spec, 4, timing=Timing(warmup=1, repeats=3, processes=1), calibrate=False).profile
    assert profile.has_split_backward  # I and W timed apart, for the split-backward schedules
    result = calibrate(profile, spec, ((0, 2), (2, 4)), CalibrationRun(num_microbatches=4, num_minibatches=4))
    assert result.cpu_share > 0
    assert len(result.op_times) == 2 and all(t.of(k) > 0 for t in result.op_times for k in "FBU")
    for got, wanted in zip(stage_op_times(result.profile, result.partition), result.op_times, strict=True):
        for kind in "FBU":
            assert got.of(kind) == pytest.approx(wanted.of(kind), rel=1e-9)
    assert result.layer_op_times == stage_op_times(profile, ((0, 2), (2, 4)))
    assert len(result.op_spread) == 2 and all(s.of(k) >= 0 for s in result.op_spread for k in "FBU")
    assert any(s.of(k) > 0 for s in result.op_spread for k in "FB")  # real op times vary
    assert "separate gpipe and 1f1b runs of the real runtime" in result.profile.device
    # A GPipe and a 1F1B run: each op's time in its context. On the last stage, in the two steady-state
    # minibatches, GPipe runs 6 F after an F and 6 B after a B, 1F1B 6 F after a B and 8 B after an F.
    assert [trace.info.schedule for trace in result.traces] == ["gpipe", "1f1b"]
    assert {(1, "F", "F"), (1, "F", "B"), (1, "B", "B"), (1, "B", "F")} <= set(result.context_s)
    assert all(seconds > 0 for seconds in result.context_s.values())
    alone = calibrate(profile, spec, ((0, 2), (2, 4)), CalibrationRun(num_microbatches=2, num_minibatches=3,
                                                                      schedule="gpipe"))
    assert [trace.info.schedule for trace in alone.traces] == ["gpipe"]
    assert (1, "F", "B") not in alone.context_s and "separate gpipe runs" in alone.profile.device


def test_priority_outside_the_nice_range_is_refused_and_zero_changes_nothing() -> None:
    pytest.importorskip("torch")
    import os

    from pipesim.harness.priority import raise_priority

    before = os.getpriority(os.PRIO_PROCESS, 0)
    raise_priority(0)
    assert os.getpriority(os.PRIO_PROCESS, 0) == before
    with pytest.raises(ConfigError, match="nice"):
        raise_priority(25)


def test_a_calibration_for_several_stages_per_rank_runs_on_as_many_processes() -> None:
    """With fewer ranks than stages, the calibration runs GPipe's and 1F1B's looped forms on that many ranks."""
    pytest.importorskip("torch")
    from pipesim.harness.calibration import calibrate
    from pipesim.harness.config import ModelSpec
    from pipesim.harness.profiler import Timing, measure_profile

    assert CalibrationRun().schedules_for(4, 2) == ("looped-bfs", "interleaved-1f1b")
    assert CalibrationRun(schedule="1f1b").schedules_for(4, 2) == ("interleaved-1f1b",)
    assert CalibrationRun(schedule="gpipe").schedules_for(4, 4) == CalibrationRun(schedule="gpipe").schedules_for(4) \
        == ("gpipe",)
    spec = ModelSpec("mlp", depth=3, width=16)
    profile = measure_profile(spec, 4, timing=Timing(warmup=1, repeats=3, processes=1), calibrate=False).profile
    partition = ((0, 1), (1, 2), (2, 3), (3, 4))
    result = calibrate(profile, spec, partition, CalibrationRun(num_microbatches=2, num_minibatches=3), num_ranks=2)
    assert len(result.op_times) == 4 and all(t.of(k) > 0 for t in result.op_times for k in "FBU")
    for got, wanted in zip(stage_op_times(result.profile, partition), result.op_times, strict=True):
        for kind in "FBU":
            assert got.of(kind) == pytest.approx(wanted.of(kind), rel=1e-9)
    assert "looped-bfs and interleaved-1f1b runs of the real runtime on 2 ranks" in result.profile.device
