"""The progress line off a terminal: its time left follows the share of the work done when the
caller gives it (a sweep's points differ in size), else the rate of items."""

from __future__ import annotations

import time

import pytest

from pipesim.cli.outputs import ProgressBar
from pipesim.sweep.batches import POINT_OVERHEAD_OPS, point_cost
from pipesim.sweep.local import WorkDone


def lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


def test_time_left_follows_the_share_of_the_work_done(capsys: pytest.CaptureFixture[str]) -> None:
    bar = ProgressBar(True, label="sweep", unit="points", started=time.perf_counter() - 10.0)
    bar(0, 100, "here", 0.0)
    bar(50, 100, "here", 0.2)  # half the points, a fifth of the work, after about 10 s: 40 s left
    bar.stop()
    (line,) = lines(capsys)
    assert line.startswith("sweep here 50/100 points ") and line.endswith("· 0:00:40 left")


def test_without_a_share_time_left_follows_the_rate_of_items(capsys: pytest.CaptureFixture[str]) -> None:
    bar = ProgressBar(True, label="search", unit="candidates", started=time.perf_counter() - 10.0)
    bar(0, 100)
    bar(50, 100)  # 5 candidates/s, 50 left: 10 s
    bar.stop()
    (line,) = lines(capsys)
    assert line.startswith("search 50/100 candidates 5.0 candidates/s") and line.endswith("· 0:00:10 left")


def test_work_done_weighs_each_point_by_its_ops_and_a_fixed_overhead() -> None:
    small = {"point": 0, "schedule": "1f1b", "num_stages": 2, "num_microbatches": 2, "num_minibatches": 1}
    large = {"point": 1, "schedule": "1f1b", "num_stages": 64, "num_microbatches": 512, "num_minibatches": 4}
    # F and B per stage and microbatch, an update per stage and minibatch, and the point's own overhead.
    assert point_cost(small) == 2 * (2 * 2 + 1) + POINT_OVERHEAD_OPS
    assert point_cost(large) == 64 * (2 * 512 * 4 + 4) + POINT_OVERHEAD_OPS
    work = WorkDone([small, large])
    assert work.share() == 0.0
    share = work.add([{"point": 0}])
    assert share == pytest.approx(point_cost(small) / (point_cost(small) + point_cost(large))) and share < 0.1
    assert work.add([{"point": 1}]) == pytest.approx(1.0)
    assert WorkDone([]).share() == 1.0
