"""The analysis/ studies through their real entry points, on their --quick settings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_study(script: str, out: Path) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "analysis" / script), "--quick", "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def read_table(out: Path, name: str) -> pd.DataFrame:
    assert (out / "tables" / f"{name}.md").read_text().startswith("| ")
    return pd.read_csv(out / "tables" / f"{name}.csv")


def assert_png(out: Path, name: str) -> None:
    assert (out / "figures" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_study1_has_a_row_per_schedule_and_stage(tmp_path: Path) -> None:
    run_study("study1_schedules.py", tmp_path)
    frame = read_table(tmp_path, "study1_schedules")
    assert list(frame.columns[:3]) == ["schedule", "stage", "throughput_samples_per_s"]
    for column in ("bubble_fraction", "peak_memory_gb", "weight_versions_max", "forward_delay_max",
                   "discrepancy_max"):
        assert column in frame.columns
    assert len(frame) == 5 * 2
    versions = frame.groupby("schedule")["weight_versions_max"].max()
    assert versions["gpipe"] == versions["1f1b"] == versions["pipemare"] == 1
    assert versions["2bw"] == versions["pipedream"] == 2
    assert_png(tmp_path, "study1_schedules")


def test_study2_data_parallel_matches_its_formula_and_the_planners_choice_is_fastest(tmp_path: Path) -> None:
    run_study("study2_pipedream.py", tmp_path)
    frame = read_table(tmp_path, "study2_pipedream")
    for column in ("config", "replicas", "speedup_over_dp", "paper_config", "paper_speedup", "simulated_over_paper",
                   "is_planner_choice", "predicted_samples_per_s"):
        assert column in frame.columns
    configs = set(frame["config"])
    assert {"16 (data parallel)", "15-1, paper's cut"} <= configs
    dp = frame[frame["config"] == "16 (data parallel)"].iloc[0]
    assert dp["speedup_over_dp"] == 1.0
    assert dp["throughput_samples_per_s"] == pytest.approx(dp["dp_formula_samples_per_s"], rel=1e-5)
    paper = frame[frame["is_paper_config"]].iloc[0]
    assert paper["simulated_over_paper"] == pytest.approx(paper["speedup_over_dp"] / 5.28, rel=1e-5)
    chosen = frame[frame["is_planner_choice"]]
    assert len(chosen) == 1 and chosen["throughput_samples_per_s"].iloc[0] == frame["throughput_samples_per_s"].max()
    choices = read_table(tmp_path, "study2_choices")
    assert list(choices.columns[:4]) == ["model", "cluster", "planner_choice", "planner_speedup_over_dp"]
    assert choices["planner_speedup_over_dp"].iloc[0] >= 1.0
    assert len(read_table(tmp_path, "study2_bandwidth")) == 2
    assert_png(tmp_path, "study2_pipedream")


def test_study3_compares_2bw_at_each_depth(tmp_path: Path) -> None:
    run_study("study3_2bw.py", tmp_path)
    frame = read_table(tmp_path, "study3_2bw")
    assert len(frame) == 1 * 2 * 5
    assert set(frame["schedule"]) == {"gpipe", "1f1b", "2bw", "pipedream", "no-pipelining"}
    two_bw = frame[frame["schedule"] == "2bw"]
    assert (two_bw["throughput_2bw_over_this"] == 1.0).all() and (two_bw["weight_versions_max"] == 2).all()
    assert_png(tmp_path, "study3_2bw")


def test_study4_compares_pipemare_with_gpipe_and_pipedream(tmp_path: Path) -> None:
    run_study("study4_pipemare.py", tmp_path)
    frame = read_table(tmp_path, "study4_pipemare")
    assert len(frame) == 2 * 3
    assert list(frame["schedule"].unique()) == ["gpipe", "pipedream", "pipemare"]
    mare = frame[frame["schedule"] == "pipemare"]
    assert (mare["stage0_versions"] == 1).all()
    assert (frame[frame["schedule"] == "pipedream"]["stage0_versions"] == frame[frame["schedule"] == "pipedream"]["p"]
            ).all()
    assert_png(tmp_path, "study4_pipemare")


def test_study5_points_sit_on_the_closed_form_and_rerun_byte_identical(tmp_path: Path) -> None:
    run_study("study5_bubble.py", tmp_path)
    frame = read_table(tmp_path, "study5_bubble")
    assert list(frame.columns[:5]) == ["p", "m", "series", "simulated_bubble", "closed_form_bubble"]
    assert len(frame) == 2 * 3
    free = frame[frame["series"].isin(["gpipe", "1f1b"])]
    assert (free["simulated_minus_closed"].abs() < 1e-9).all()
    first = {path.name: path.read_bytes() for path in tmp_path.rglob("*.*")}
    run_study("study5_bubble.py", tmp_path)
    assert {path.name: path.read_bytes() for path in tmp_path.rglob("*.*")} == first


def test_published_study2_the_planners_choice_is_the_fastest_on_every_model_and_cluster() -> None:
    """The committed tables (`make analysis` regenerates them): issue 22's acceptance, as published."""
    frame = pd.read_csv(ROOT / "analysis" / "tables" / "study2_pipedream.csv")
    for (model, cluster), rows in frame.groupby(["model", "cluster"]):
        chosen = rows[rows["is_planner_choice"]]
        assert len(chosen) == 1, (model, cluster)
        assert chosen["throughput_samples_per_s"].iloc[0] == rows["throughput_samples_per_s"].max(), (model, cluster)
        assert chosen["speedup_over_dp"].iloc[0] >= 1.0
    assert len(frame.groupby(["model", "cluster"])) == 6


def test_study6_predicts_megatron_rows_without_calibration(tmp_path: Path) -> None:
    """The quick run's two rows (1.7B and 3.6B, pp = 1) from the op cost model alone, within 8% of
    the paper's 137 and 138 TFLOP/s per GPU (issue 31's worst-row target)."""
    run_study("study6_megatron.py", tmp_path)
    frame = read_table(tmp_path, "study6_megatron")
    assert list(frame["paper_tflops_per_gpu"]) == [137, 138]
    assert ((frame["predicted_over_paper"] - 1).abs() < 0.08).all()
    memory = read_table(tmp_path, "study6_korthikanti")
    row = memory.iloc[0]
    assert row["layer_full_gb"] < row["layer_selective_sp_gb"] < row["layer_none_gb"]
    assert row["simulated_peak_selective_sp_gb"] < row["simulated_peak_none_gb"]
    assert_png(tmp_path, "study6_megatron")
