"""The CLI for several stages per rank, split backward, --samples and --schedule-csv, through its real entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UNIFORM = "layers=8,forward_ms=1,backward_ms=2,backward_input_ms=1,backward_weight_ms=1,activation_bytes=1000000"


def pipesim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipesim", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def test_schedule_with_ranks_and_stages_per_rank(tmp_path: Path) -> None:
    done = pipesim("schedule", "--schedule", "zbv", "--ranks", "2", "--stages-per-rank", "2", "--microbatches", "2",
                   "--format", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "schedule": "zbv", "num_stages": 4, "num_ranks": 2, "stage_to_rank": [0, 1, 1, 0], "num_microbatches": 2,
        "num_minibatches": 1,
        "ranks": [["0F0", "0F1", "3F0", "3I0", "3W0", "3F1", "3I1", "3W1", "3U0", "0I0", "0W0", "0I1", "0W1", "0U0"],
                  ["1F0", "2F0", "1F1", "2F1", "2I0", "2W0", "1I0", "1W0", "2I1", "2W1", "2U0", "1I1", "1W1", "1U0"]],
    }
    refused = pipesim("schedule", "--schedule", "zbv", "--stages", "4", "--microbatches", "2")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "stages_per_rank=1: zbv needs exactly 2 stages per rank" in refused.stderr
    # Each command's own way to ask for it (run and validate have no --stages-per-rank).
    assert "(simulate --ranks R --stages-per-rank 2; run and validate --stages 2R --ranks R)" in refused.stderr


def test_simulate_a_csv_schedule_like_the_named_one(tmp_path: Path) -> None:
    csv = pipesim("schedule", "--schedule", "interleaved-zb", "--ranks", "4", "--stages-per-rank", "2",
                  "--microbatches", "8", "--format", "csv")
    assert csv.returncode == 0, csv.stderr
    path = tmp_path / "izb.csv"
    path.write_text(csv.stdout)
    common = ("--uniform", UNIFORM, "--bandwidth", "10GB/s", "--latency", "5us", "--json")
    from_file = pipesim("simulate", "--schedule-csv", str(path), *common)
    named = pipesim("simulate", "--schedule", "interleaved-zb", "--ranks", "4", "--stages-per-rank", "2",
                    "--microbatches", "8", *common)
    assert from_file.returncode == 0 and named.returncode == 0, from_file.stderr + named.stderr
    a, b = json.loads(from_file.stdout), json.loads(named.stdout)
    assert a["schedule"] == "custom" and a["num_ranks"] == 4 and a["num_stages"] == 8
    assert a["makespan_s"] == b["makespan_s"]
    assert a["device_utilization"] == b["device_utilization"]


def test_samples_are_reproducible_and_summarized() -> None:
    args = ("simulate", "--uniform", UNIFORM, "--stages", "4", "--microbatches", "8", "--schedule", "zb-h1",
            "--samples", "8", "--cv", "0.1", "--seed", "3", "--json")
    first, second = pipesim(*args), pipesim(*args)
    assert first.returncode == 0, first.stderr
    samples = json.loads(first.stdout)["samples"]
    assert samples == json.loads(second.stdout)["samples"]
    assert samples["p5_s"] <= samples["median_s"] <= samples["p95_s"]
    assert len(samples["iteration_times_s"]) == 8 and len(samples["straggler_sensitivity"]) == 4
    table = pipesim(*args[:-1])
    assert "8 samples (normal, cv 0.1, seed 3): iteration time median" in table.stdout


def test_simulate_options_refuse_bad_combinations() -> None:
    cases = [
        (("--schedule", "1f1b", "--schedule-csv", "x.csv", "--stages", "4"), "give exactly one of --schedule"),
        (("--schedule", "zbv", "--ranks", "4", "--stages-per-rank", "2", "--stages", "6"),
         "stages=6: must equal ranks x stages-per-rank (4 x 2)"),
        (("--schedule", "1f1b", "--stages", "4", "--recompute-stages", "full,none"),
         "must give one mode or one per stage (4)"),
    ]
    for extra, expected in cases:
        done = pipesim("simulate", "--uniform", UNIFORM, "--microbatches", "8", *extra)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert expected in done.stderr


def test_a_plan_file_with_several_stages_per_rank_runs_as_the_options_do(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"schema": "pipesim.plan/1", "schedule": "zbv", "num_stages": 8, "num_microbatches": 8,
                                "stages_per_rank": 2, "recompute_stages": ["selective"] * 8}))
    common = ("--uniform", UNIFORM, "--bandwidth", "1GB/s", "--latency", "5us", "--json")
    from_plan = pipesim("simulate", "--plan", str(plan), *common)
    from_options = pipesim("simulate", "--schedule", "zbv", "--ranks", "4", "--stages-per-rank", "2",
                           "--microbatches", "8", "--recompute-stages", "selective", *common)
    assert from_plan.returncode == 0 and from_options.returncode == 0, from_plan.stderr + from_options.stderr
    a, b = json.loads(from_plan.stdout), json.loads(from_options.stdout)
    assert a["num_ranks"] == 4 and a["engine"] == "analytic"
    assert (a["makespan_s"], a["device_peak_memory_bytes"]) == (b["makespan_s"], b["device_peak_memory_bytes"])
    shared = pipesim("simulate", "--plan", str(plan), "--shared-nics", *common)
    assert shared.returncode == 0, shared.stderr
    assert json.loads(shared.stdout)["engine"] == "des"
    refused = pipesim("simulate", "--plan", str(plan), "--ranks", "4", *common)
    assert refused.returncode == 2 and "ranks=4: comes from the plan file" in refused.stderr
