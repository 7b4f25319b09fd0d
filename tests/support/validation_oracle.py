"""The arithmetic of a ``validate --json`` report, recomputed from its own per-run figures.

A test oracle written apart from pipesim.harness.comparison: it reads only the per-run numbers a
report lists (predicted, measured and replayed iteration times, utilization, peak memory) and
works out the headline errors from their definitions, so that a sign, denominator or median
slip in the code that reports them shows up as a difference.
"""

from __future__ import annotations

import math
from typing import Any

import pytest


def middle(values: list[float]) -> float:
    """The median: the middle value, or the mean of the two middle values of an even count."""
    ordered = sorted(values)
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2


def error_of(predicted: float, measured: float) -> float:
    """How far the prediction is off, as a fraction of the measurement (positive: predicted slower)."""
    return (predicted - measured) / measured


def check_report_arithmetic(report: dict[str, Any]) -> None:
    """Every headline error of one schedule's report equals its definition, to float rounding."""
    predicted = report["predicted"]["iteration_time_s_runs"]
    measured = report["measured"]["iteration_time_s_runs"]
    replayed = report["replayed_iteration_time_s_runs"]
    assert len(predicted) == len(measured) == len(replayed) > 0
    errors = [error_of(p, m) for p, m in zip(predicted, measured, strict=True)]
    assert report["iteration_time_errors_runs"] == pytest.approx(errors, rel=1e-12, abs=1e-15)
    assert report["iteration_time_error"] == pytest.approx(middle(errors), rel=1e-12, abs=1e-15)
    assert report["median_error"] == pytest.approx(middle(errors), rel=1e-12, abs=1e-15)
    replays = [error_of(r, m) for r, m in zip(replayed, measured, strict=True)]
    assert report["replay_error_runs"] == pytest.approx(replays, rel=1e-12, abs=1e-15)
    assert report["replay_error"] == pytest.approx(middle(replays), rel=1e-12, abs=1e-15)
    centre = middle(measured)
    assert report["noise_floor"] == pytest.approx(max(abs(t - centre) for t in measured) / centre, rel=1e-12)
    assert report["inside_spread"] is (min(measured) <= middle(predicted) <= max(measured))
    assert report["predicted"]["iteration_time_s"] == pytest.approx(middle(predicted), rel=1e-12)
    assert report["measured"]["iteration_time_s"] == pytest.approx(centre, rel=1e-12)
    utilization = [p - m for p, m in zip(report["predicted"]["utilization"], report["measured"]["utilization"],
                                         strict=True)]
    assert report["utilization_error"] == pytest.approx(utilization, rel=1e-12, abs=1e-15)
    peaks = [error_of(p, m) if m else (0.0 if p == 0 else math.inf) for p, m in zip(
        report["predicted"]["peak_memory_bytes"], report["measured"]["peak_memory_bytes"], strict=True)]
    assert report["peak_memory_error"] == pytest.approx(peaks, rel=1e-12, abs=1e-15)
    layer = report.get("layer_profile")
    if layer is not None:
        layer_errors = [error_of(p, m) for p, m in zip(layer["iteration_time_s_runs"], measured, strict=True)]
        assert layer["iteration_time_errors_runs"] == pytest.approx(layer_errors, rel=1e-12, abs=1e-15)
        assert layer["iteration_time_error"] == pytest.approx(middle(layer_errors), rel=1e-12, abs=1e-15)
