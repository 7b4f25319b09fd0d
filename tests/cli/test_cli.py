"""The CLI through its real entry point: tables, JSON, report folders, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli_runner import ROOT, VGG, pipesim


def test_simulate_vgg16_prints_a_table() -> None:
    done = pipesim("simulate", "--profile", VGG, "--stages", "4", "--microbatches", "8", "--schedule", "1f1b")
    assert done.returncode == 0, done.stderr
    assert "iteration time" in done.stdout and "bubble" in done.stdout
    assert done.stdout.count("\n") >= 6


def test_simulate_json_has_the_documented_fields() -> None:
    done = pipesim("simulate", "--uniform", "layers=8,forward_ms=1,backward_ms=2,activation_bytes=1000,param_bytes=4000",
                   "--stages", "4", "--microbatches", "8", "--schedule", "2bw", "--bandwidth", "10GB/s",
                   "--latency", "5us", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    for key in ("schedule", "num_stages", "num_microbatches", "num_minibatches", "iteration_time_s", "makespan_s",
                "throughput_samples_per_s", "bubble_fraction", "stages", "engine", "engine_wall_s", "num_ops"):
        assert key in data
    assert data["num_minibatches"] == 4
    assert len(data["stages"]) == 4
    for key in ("stage", "utilization", "bubble_fraction", "peak_memory_bytes", "weight_versions_max",
                "max_inflight_microbatches", "forward_delay_steps"):
        assert key in data["stages"][0]
    assert all(stage["weight_versions_max"] == 2 for stage in data["stages"])


def test_simulate_reads_pipedream_graph_txt(tmp_path: Path) -> None:
    graph = tmp_path / "graph.txt"
    graph.write_text(
        "node1 -- Input -- forward_compute_time=0.000, backward_compute_time=0.000, activation_size=8.0, parameter_size=0.000\n"
        "node2 -- Linear -- forward_compute_time=1.000, backward_compute_time=2.000, activation_size=8.0, parameter_size=16.0\n"
        "node3 -- Linear -- forward_compute_time=1.000, backward_compute_time=2.000, activation_size=8.0, parameter_size=16.0\n"
        "\tnode1 -- node2\n\tnode2 -- node3\n"
    )
    done = pipesim("simulate", "--profile", str(graph), "--stages", "2", "--microbatches", "2", "--schedule", "gpipe",
                   "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["iteration_time_s"] == pytest.approx(3 * 3e-3)


def test_report_folder_and_byte_identical_reruns(tmp_path: Path) -> None:
    args = ("simulate", "--profile", VGG, "--stages", "4", "--microbatches", "8", "--schedule", "1f1b",
            "--bandwidth", "25Gbit/s", "--latency", "5us")
    # The same command twice (the command line is part of every output's "run" record).
    first = pipesim(*args, "--out", str(tmp_path / "out"))
    (tmp_path / "out").rename(tmp_path / "a")
    second = pipesim(*args, "--out", str(tmp_path / "out"))
    (tmp_path / "out").rename(tmp_path / "b")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == ["metrics.json", "timeline.png", "trace.json", "trace.perfetto.json"]
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert "engine_wall_s" not in json.loads((tmp_path / "a" / "metrics.json").read_text())


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--profile", "/no/such/file.json"], "profile='/no/such/file.json': file does not exist"),
        (["--stages", "50"], "num_stages=50: must be <= the number of layers (41)"),
        (["--microbatches", "0"], "num_microbatches=0"),
        (["--schedule", "zigzag"], "schedule='zigzag': unknown schedule"),
        (["--schedule", "2bw", "--microbatches", "2"], "must be >= num_stages for 2bw, got 2 < 4"),
        (["--bandwidth", "25"], "bandwidth='25': must be a number with a unit, one of B/s"),
        (["--latency", "5 parsecs"], "latency='5 parsecs'"),
        (["--stages", "four"], "Invalid value for '--stages'"),
        (["--partition", "0:10,10:20,20:30,30:40"], "partition"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], expected: str) -> None:
    base = {"--profile": VGG, "--stages": "4", "--microbatches": "8", "--schedule": "1f1b"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    flat = [item for pair in base.items() for item in pair]
    done = pipesim("simulate", *flat)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert expected in done.stderr
    assert "Traceback" not in done.stderr


def test_malformed_and_negative_profiles(tmp_path: Path) -> None:
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"layers": [')
    done = pipesim("simulate", "--profile", str(bad_json), "--stages", "1", "--microbatches", "1", "--schedule", "gpipe")
    assert done.returncode == 2 and "line 1 column" in done.stderr and done.stderr.count("\n") == 1
    negative = tmp_path / "negative.json"
    negative.write_text(json.dumps({"schema": "pipesim.profile/1", "layers": [
        {"name": "a", "forward_s": -1.0, "backward_s": 1.0, "activation_bytes": 0, "param_bytes": 0}]}))
    done = pipesim("simulate", "--profile", str(negative), "--stages", "1", "--microbatches", "1", "--schedule", "gpipe")
    assert done.returncode == 2
    assert "layers[0].forward_s=-1.0" in done.stderr and done.stderr.count("\n") == 1


def test_schedule_command_forms() -> None:
    done = pipesim("schedule", "--schedule", "1f1b", "--stages", "2", "--microbatches", "3", "--format", "json")
    assert json.loads(done.stdout) == {
        "schedule": "1f1b", "num_stages": 2, "num_microbatches": 3, "num_minibatches": 1,
        "ranks": [["0F0", "0F1", "0B0", "0F2", "0B1", "0B2", "0U0"], ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2", "1U0"]],
    }
    csv = pipesim("schedule", "--schedule", "1f1b", "--stages", "2", "--microbatches", "3", "--format", "csv")
    assert csv.stdout == "0F0,0F1,0B0,0F2,0B1,0B2\n1F0,1B0,1F1,1B1,1F2,1B2\n"
    text = pipesim("schedule", "--schedule", "gpipe", "--stages", "2", "--microbatches", "2")
    assert text.stdout.splitlines()[0] == "rank 0: 0F0 0F1 0B0 0B1 0U0"


def test_help_and_console_script() -> None:
    done = pipesim("--help")
    assert done.returncode == 0 and "simulate" in done.stdout and "schedule" in done.stdout
    script = Path(sys.executable).parent / "pipesim"
    if script.exists():
        assert subprocess.run([str(script), "simulate", "--help"], capture_output=True, text=True).returncode == 0


def test_a_run_too_large_is_refused_up_front_with_the_estimate() -> None:
    done = pipesim("simulate", "--uniform", "layers=64,forward_ms=1,backward_ms=2", "--stages", "64",
                   "--microbatches", "4096", "--schedule", "pipedream", "--minibatches", "16")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "num_ops=12582912" in done.stderr and "GiB (analytic engine)" in done.stderr and "--max-ops" in done.stderr
    small = pipesim("simulate", "--uniform", "layers=4,forward_ms=1,backward_ms=2", "--stages", "4",
                    "--microbatches", "8", "--schedule", "1f1b", "--max-ops", "60", "--json")
    assert small.returncode == 2 and "num_ops=68" in small.stderr
    assert pipesim("simulate", "--uniform", "layers=4,forward_ms=1,backward_ms=2", "--stages", "4",
                   "--microbatches", "8", "--schedule", "1f1b", "--max-ops", "68", "--json").returncode == 0
