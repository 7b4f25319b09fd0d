"""The figures ``validate`` reports (error, median error, replay error, noise floor, spread), against
hand arithmetic on made-up runs: the project's claim about itself, checked without torch."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import pipesim
from pipesim.harness.comparison import (
    Comparison,
    RunComparison,
    VersionCheck,
    compare_versions,
    op_means,
    relative_error,
)
from pipesim.metrics import Metrics
from validation_oracle import check_report_arithmetic

TWO_STAGES = pipesim.simulate(pipesim.uniform_profile(num_layers=2, forward_s=1e-3, backward_s=2e-3,
                                                      activation_bytes=10.0, param_bytes=100.0),
                              schedule="1f1b", num_stages=2, num_microbatches=2).metrics


def metrics(iteration_time_s: float, utilization: tuple[float, float] = (0.5, 0.5),
            peaks: tuple[float, float] = (100.0, 100.0)) -> Metrics:
    """The two-stage run's metrics with the figures a comparison reads set by hand."""
    stages = tuple(dataclasses.replace(stage, utilization=u, peak_memory_bytes=peak)
                   for stage, u, peak in zip(TWO_STAGES.stages, utilization, peaks, strict=True))
    return dataclasses.replace(TWO_STAGES, iteration_time_s=iteration_time_s, stages=stages)


def comparison(predicted: list[float], measured: list[float], replayed: list[float], *,
               predicted_stages: dict[str, Any] | None = None, measured_stages: dict[str, Any] | None = None
               ) -> Comparison:
    """Runs of the given iteration times (and per-stage figures, the same for every run)."""
    runs = tuple(RunComparison(predicted=metrics(p, **(predicted_stages or {})),
                               measured=metrics(m, **(measured_stages or {})), replayed=metrics(r),
                               versions=VersionCheck(num_ops=12, mismatches=()))
                 for p, m, r in zip(predicted, measured, replayed, strict=True))
    return Comparison(runs=runs, partition=((0, 1), (1, 2)))


def test_relative_error_is_predicted_minus_measured_over_measured() -> None:
    assert relative_error(1.1, 1.0) == pytest.approx(0.1, rel=1e-12)  # predicted 10% slow
    assert relative_error(0.8, 1.0) == pytest.approx(-0.2, rel=1e-12)  # predicted 20% fast
    assert relative_error(3.0, 2.0) == pytest.approx(0.5, rel=1e-12)  # over the measurement, not the prediction
    assert relative_error(0.0, 0.0) == 0.0
    assert relative_error(1.0, 0.0) == float("inf")  # a run that took no time: no finite error


def test_three_runs_give_the_hand_computed_error_replay_error_and_noise_floor() -> None:
    # Measured 1.00, 1.20, 0.90 s; predicted 1.10 s each; replayed 1.05, 1.20, 0.99 s.
    # Errors (p - m) / m: +0.10, -0.10/1.20 = -1/12, +0.20/0.90 = +2/9: the median is +0.10
    # (the mean would be +0.0796, the errors over the prediction +0.0909).
    # Replay errors: +0.05, 0, +0.09/0.90 = +0.10: the median is +0.05.
    # Noise floor: the measured median is 1.00; the farthest run is 1.20, 0.20 / 1.00 = 0.20.
    # The predicted median 1.10 lies between 0.90 and 1.20: inside the spread.
    result = comparison([1.10, 1.10, 1.10], [1.00, 1.20, 0.90], [1.05, 1.20, 0.99])
    assert [run.iteration_time_error for run in result.runs] == pytest.approx([0.10, -1 / 12, 2 / 9], rel=1e-12)
    assert result.iteration_time_error == pytest.approx(0.10, rel=1e-12)
    assert result.median_error == pytest.approx(0.10, rel=1e-12)
    assert result.replay_error == pytest.approx(0.05, rel=1e-12)
    assert result.noise_floor == pytest.approx(0.20, rel=1e-12)
    assert result.inside_spread is True
    report = result.to_dict()
    assert (report["iteration_time_error"], report["median_error"], report["noise_floor"]) == pytest.approx(
        (0.10, 0.10, 0.20), rel=1e-12)
    check_report_arithmetic(report)


def test_four_runs_take_the_mean_of_the_two_middle_values() -> None:
    # Measured 1.00, 2.00, 1.50, 1.25 s against 0.80 s predicted each.
    # Errors: -0.20, -0.60, -0.70/1.50 = -7/15, -0.45/1.25 = -0.36; the two middle ones are
    # -7/15 and -0.36, so the median error is (-7/15 - 0.36) / 2 = -0.41333...
    # Noise floor: the median of the runs is (1.25 + 1.50) / 2 = 1.375; 2.00 is 0.625 from it:
    # 0.625 / 1.375 = 5/11. The prediction, 0.80 s, is faster than every run: outside the spread.
    result = comparison([0.80] * 4, [1.00, 2.00, 1.50, 1.25], [1.00, 2.00, 1.50, 1.25])
    assert result.median_error == pytest.approx((-7 / 15 - 0.36) / 2, rel=1e-12)
    assert result.noise_floor == pytest.approx(5 / 11, rel=1e-12)
    assert result.replay_error == 0.0
    assert result.inside_spread is False
    check_report_arithmetic(result.to_dict())


def test_utilization_and_memory_errors_per_stage() -> None:
    # Stage 0: predicted 0.60 busy against 0.50 measured (+0.10); stage 1: 0.40 against 0.45 (-0.05).
    # Peaks: 150 B predicted against 100 B (+50%), and 80 B against 100 B (-20%).
    result = comparison([1.0], [1.0], [1.0],
                        predicted_stages={"utilization": (0.60, 0.40), "peaks": (150.0, 80.0)},
                        measured_stages={"utilization": (0.50, 0.45), "peaks": (100.0, 100.0)})
    report = result.to_dict()
    assert report["utilization_error"] == pytest.approx([0.10, -0.05], rel=1e-12)
    assert report["peak_memory_error"] == pytest.approx([0.50, -0.20], rel=1e-12)
    assert report["noise_floor"] == 0.0 and report["iteration_time_error"] == 0.0
    check_report_arithmetic(report)


def test_the_measured_peak_is_the_largest_over_runs_and_utilization_the_median() -> None:
    # Three runs measure stage 0 at 100, 130 and 110 B, and busy 0.5, 0.7 and 0.4: memory must fit
    # the worst run (130 B), utilization is the typical run's (0.5). Predicted 120 B: -7.7%.
    runs = tuple(RunComparison(predicted=metrics(1.0, peaks=(120.0, 50.0)),
                               measured=metrics(1.0, utilization=(u, 0.5), peaks=(peak, 50.0)), replayed=metrics(1.0),
                               versions=VersionCheck(num_ops=12, mismatches=()))
                 for u, peak in ((0.5, 100.0), (0.7, 130.0), (0.4, 110.0)))
    report = Comparison(runs=runs, partition=((0, 1), (1, 2))).to_dict()
    assert report["measured"]["peak_memory_bytes"] == [130.0, 50.0]
    assert report["measured"]["utilization"] == [0.5, 0.5]
    assert report["peak_memory_error"] == pytest.approx([(120.0 - 130.0) / 130.0, 0.0], rel=1e-12)


def test_versions_compare_every_op_either_side_ran() -> None:
    def trace(microbatches: int) -> pipesim.Trace:
        return pipesim.simulate(pipesim.uniform_profile(num_layers=2, forward_s=1e-3, backward_s=2e-3),
                                schedule="pipedream", num_stages=2, num_microbatches=microbatches,
                                num_minibatches=2).trace

    same = compare_versions(trace(2), trace(2))
    assert same.matches and same.num_ops == 4 * 3 * 2  # F, B and U of 4 microbatches on 2 stages
    # A run of two microbatches more: its 12 ops beyond the prediction (F, B, U of microbatches 4 and
    # 5 on 2 stages) are mismatches. Stage 0 runs F0 F1 B0 U0 F2 B1 U1 F3 B2 U2 F4: F4 on version 3.
    longer = compare_versions(trace(2), trace(3))
    assert not longer.matches and len(longer.mismatches) == 12
    assert "0F4: predicted None, measured 3" in longer.mismatches
    assert all(op[2] in "45" for op in longer.mismatches)


def test_op_means_average_the_steady_state_minibatches_only() -> None:
    # Four minibatches with jittered op times: the means per stage and kind ("0F", "1B", ...) are over
    # minibatches 1 and 2, the warm-up (0) and the drain (3) left out.
    profile = pipesim.uniform_profile(num_layers=2, forward_s=1e-3, backward_s=2e-3)
    trace = pipesim.simulate(profile, schedule="1f1b", num_stages=2, num_microbatches=2, num_minibatches=4,
                             jitter=0.3, seed=5).trace
    samples: dict[str, list[float]] = {}
    for span in trace.iter_spans():
        if span.stream == "compute" and span.minibatch in (1, 2):
            samples.setdefault(f"{span.stage}{span.op[1]}", []).append(span.end_s - span.start_s)
    means = op_means(trace)
    assert sorted(means) == ["0B", "0F", "0U", "1B", "1F", "1U"]
    assert means == pytest.approx({key: sum(values) / len(values) for key, values in samples.items()}, rel=1e-12)
    everything = [span.end_s - span.start_s for span in trace.iter_spans() if span.op[1] == "F" and span.stage == 0]
    assert means["0F"] != pytest.approx(sum(everything) / len(everything), rel=1e-9)  # the jitter tells them apart
