"""bench_validate's options: which cases ``--cases`` picks, bad options refused in one line (exit 2), and a
priority the machine refuses reported and left at the default instead of ending the benchmark."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipesim.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("torch")
sys.path.insert(0, str(ROOT))
bench_validate = pytest.importorskip("benchmarks.bench_validate")


@pytest.mark.parametrize(("words", "labels"), [
    ("", ["MLP 8x512, microbatch 64, 2 ranks", "transformer 4x128 (64 tokens), microbatch 8, 2 ranks",
          "MLP 8x512, microbatch 64, 4 ranks", "transformer 8x128 (64 tokens), microbatch 8, 4 ranks"]),
    ("4-rank", ["MLP 8x512, microbatch 64, 4 ranks", "transformer 8x128 (64 tokens), microbatch 8, 4 ranks"]),
    ("transformer, 1", ["MLP 8x512, microbatch 64, 2 ranks", "transformer 4x128 (64 tokens), microbatch 8, 2 ranks",
                        "transformer 8x128 (64 tokens), microbatch 8, 4 ranks"]),
    ("2-RANK,mlp", ["MLP 8x512, microbatch 64, 2 ranks", "transformer 4x128 (64 tokens), microbatch 8, 2 ranks",
                    "MLP 8x512, microbatch 64, 4 ranks"]),
])
def test_cases_are_picked_by_ranks_model_or_number(words: str, labels: list[str]) -> None:
    assert [case.label for case in bench_validate.select_cases(words)] == labels


@pytest.mark.parametrize(("args", "message"), [
    (["--cases", "3-rank"], "cases='3-rank': must be one of 2-rank, 4-rank, mlp, transformer, 1, 2, 3, 4"),
    (["--runs", "0"], "runs=0: must be >= 1"),
    (["--time-limit", "-5"], "time_limit=-5.0: must be >= 0 seconds"),
    (["--nice", "-21"], "nice=-21: must be in -20..19"),
    (["--realtime-priority", "100"], "realtime_priority=100: must be in 0..99"),
    (["--calibrate", "sometimes"], "calibrate='sometimes': must be round or run"),
])
def test_bad_options_are_refused_in_one_line_before_anything_runs(args: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_validate.py"), *args, "--no-write"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == f"bench_validate: {message}"


def test_a_refused_nice_value_or_real_time_policy_is_reported_and_left_at_the_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse_realtime(priority: int) -> None:
        raise ConfigError("realtime_priority", priority, "could not be set (Operation not permitted)")

    def refuse_nice(nice: int) -> None:
        raise ConfigError("nice", nice, "could not be set (Permission denied)")

    monkeypatch.setattr(bench_validate, "check_realtime", refuse_realtime)
    monkeypatch.setattr(bench_validate, "raise_priority", refuse_nice)
    monkeypatch.setattr(bench_validate.os, "setsid", lambda: None)
    nice, realtime, notes = bench_validate.take_priority(-20, 10)
    assert (nice, realtime) == (0, 0)
    assert notes == ["SCHED_RR refused, emulated ranks at the default policy: realtime_priority=10: could not be set "
                     "(Operation not permitted)",
                     "nice -20 refused, at the default priority: nice=-20: could not be set (Permission denied)"]
    assert bench_validate.take_priority(0, 0) == (0, 0, [])


def test_calibrate_run_calibrates_before_every_real_run_and_round_once_a_partition(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """PerRound's cache: one calibration per partition and counts in a round (``--calibrate round``),
    a fresh one for every call with ``every_run`` (``--calibrate run``). The calibration itself is
    the harness's (tested in test_harness_calibration.py); here a stand-in counts the calls."""
    from types import SimpleNamespace

    made: list[object] = []

    def count(*args: object, **kwargs: object) -> object:
        made.append(SimpleNamespace(traces=()))
        return made[-1]

    monkeypatch.setattr(bench_validate, "calibrate", count)
    config = SimpleNamespace(partition=((0, 2), (2, 4)), num_microbatches=8, num_minibatches=4)
    other = SimpleNamespace(partition=((0, 1), (1, 4)), num_microbatches=8, num_minibatches=4)
    spec, run = bench_validate.ModelSpec("mlp", depth=4, width=8), bench_validate.CalibrationRun()
    per_round = bench_validate.PerRound(spec, run)
    first = per_round(None, config)  # type: ignore[arg-type]
    assert per_round(None, config) is first and per_round(None, other) is not first  # type: ignore[arg-type]
    assert (len(made), per_round.count) == (2, 2)
    per_round.new_round()
    assert per_round(None, config) is not first and len(made) == 3  # type: ignore[arg-type]
    every = bench_validate.PerRound(spec, run, every_run=True)
    calls = [every(None, config) for _ in range(3)]  # type: ignore[arg-type]
    assert len({id(call) for call in calls}) == 3 and len(made) == 6
