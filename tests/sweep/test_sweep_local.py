"""Where a sweep runs: in this process while an embedded cluster would cost more than it saves."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipesim.sweep import read_table, run_sweep
from pipesim.sweep.local import CLUSTER_START_S, HERE, cluster_pays

SPEC = """\
profile: {uniform: {layers: 8, forward_ms: 1.0, backward_ms: 2.0, activation_bytes: 1000000, param_bytes: 4000000}}
bandwidth: [10GB/s, 100GB/s]
stages: [2, 4]
microbatches: [4, 8, 16]
schedule: [gpipe, 1f1b, 2bw]
"""
NUM_POINTS = 2 * 2 * 3 * 3


def test_a_cluster_pays_once_its_saving_exceeds_its_start() -> None:
    # (seconds, cost) of points measured, then (points, cost) left and workers.
    # By cost: 0.01 s per unit, 900 units left: 9 s, which 2 workers halve.
    assert cluster_pays([(1.0, 100)] * 3, 1, 900, 2)
    # By points: 1 s a point, 9 points left, although the cost left is small.
    assert cluster_pays([(1.0, 100)] * 3, 9, 1, 2)
    # A saving just under and just over the start-up cost.
    assert not cluster_pays([(CLUSTER_START_S / 4.5 * 0.99, 100)], 1, 900, 2)
    assert cluster_pays([(CLUSTER_START_S / 4.5 * 1.01, 100)], 1, 900, 2)
    # A median: one slow point (a kernel loaded) among fast ones does not decide.
    assert not cluster_pays([(0.001, 10)] * 8 + [(5.0, 10)], 100, 1000, 2)
    # One worker saves nothing; nothing left costs nothing; nothing measured projects nothing.
    assert not cluster_pays([(100.0, 1)], 10**6, 10**9, 1)
    assert not cluster_pays([(100.0, 1)], 0, 0, 8)
    assert not cluster_pays([], 10**6, 10**9, 8)


def test_a_small_sweep_runs_here_and_says_so(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    seen: list[tuple[int, int, str]] = []
    shares: list[float | None] = []

    def progress(done: int, total: int, where: str, work: float | None = None) -> None:
        seen.append((done, total, where))
        shares.append(work)

    summary = run_sweep(spec, tmp_path / "results.parquet", workers=2, progress=progress)
    assert (summary.num_run, summary.num_here, summary.startup_s) == (NUM_POINTS, NUM_POINTS, 0.0)
    assert summary.where == "in this process" and summary.points_per_s == pytest.approx(NUM_POINTS / summary.wall_s)
    assert seen[0] == (0, NUM_POINTS, "") and seen[-1] == (NUM_POINTS, NUM_POINTS, HERE)
    assert [done for done, _, _ in seen] == sorted(done for done, _, _ in seen)
    # The share of the work done (by point_cost) rises from 0 to 1 with the points done.
    assert shares[0] == 0.0 and shares[-1] == pytest.approx(1.0) and shares == sorted(shares)
    frame = read_table(tmp_path / "results.parquet")
    assert frame["point"].tolist() == list(range(NUM_POINTS))
    assert frame["error"].isna().all() and (frame["iteration_time_s"] > 0).all()


def test_an_explicit_batch_size_writes_a_chunk_per_batch_here(tmp_path: Path) -> None:
    """Chunks are merged by time only where the batch size was left to the sweep."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    seen: list[int] = []
    summary = run_sweep(spec, tmp_path / "results.csv", workers=1, batch_size=5,
                        progress=lambda done, total, where, work=None: seen.append(done))
    assert summary.num_here == NUM_POINTS and summary.num_batches == -(-NUM_POINTS // 5)  # chunks written
    assert seen == [0, *range(5, NUM_POINTS, 5), NUM_POINTS]


def test_ctrl_c_inside_compiled_code_still_keeps_the_finished_points(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C that lands while numba loads a kernel surfaces as a SystemError caused by the
    KeyboardInterrupt: the sweep treats it as the interrupt it is (finished chunks kept)."""
    from pipesim.sweep.points import PointRunner

    real_run = PointRunner.run
    calls = [0]

    def run_then_interrupt(self: PointRunner, point: dict[str, object]) -> dict[str, object]:
        calls[0] += 1
        if calls[0] == 8:
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt as error:
                raise SystemError("CPUDispatcher returned a result with an exception set") from error
        return real_run(self, point)

    monkeypatch.setattr(PointRunner, "run", run_then_interrupt)
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    out = tmp_path / "results.csv"
    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, out, workers=1, batch_size=5)
    kept = sorted(path.name for path in Path(f"{out}.parts").glob("chunk-*"))
    assert len(kept) == 2, kept  # points 1-5, then 6-7 flushed on the interrupt
    assert not out.exists()
