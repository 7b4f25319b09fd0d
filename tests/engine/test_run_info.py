"""RunInfo: the trace JSON's meta, typed; it reads back and writes out byte for byte, measured runs'
facts included, and a bad meta is refused by name (the CLI: one line, exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipesim import ConfigError, Trace, simulate, uniform_profile
from pipesim.engine.run_info import RunFailure, RunInfo

ROOT = Path(__file__).resolve().parents[2]


def small_trace(**options: object) -> Trace:
    profile = uniform_profile(num_layers=4, forward_s=1e-3, backward_s=2e-3, activation_bytes=10.0, param_bytes=3.0)
    return simulate(profile, schedule="2bw", num_stages=2, num_microbatches=2, num_minibatches=3, **options).trace


def test_engines_fill_the_run_info() -> None:
    des = small_trace(jitter=0.1, seed=3).info
    assert (des.engine, des.jitter, des.seed) == ("des", 0.1, 3)
    assert (des.schedule, des.num_stages, des.num_microbatches, des.num_minibatches) == ("2bw", 2, 2, 3)
    assert des.stage_to_rank == (0, 1) and des.param_bytes == (6.0, 6.0) and des.device_memory_bytes == (None, None)
    analytic = small_trace(engine="analytic").info
    assert (analytic.engine, analytic.jitter, analytic.seed) == ("analytic", 0.0, None)
    assert "seed" not in analytic.to_dict() and des.to_dict()["seed"] == 3


def test_a_measured_runs_meta_round_trips_byte_for_byte() -> None:
    data = json.loads(small_trace().to_json())
    data["meta"].update({
        "engine": "torch", "backend": "gloo", "device": "cpu", "partition": [[0, 2], [2, 4]],
        "cpu_share": [0.97, None], "compute_cpu_s": [[0.001, -1.0, 0.002], None],
        "cuda_max_memory_allocated_bytes": [1024, 2048], "partial": True,
        "failure": {"rank": 1, "op": "1F2", "reason": "RuntimeError: injected"},
        "optimizer_state_multiplier": 0.0, "a_key_of_a_later_version": {"kept": [1, 2.5]},
    })
    del data["meta"]["jitter"], data["meta"]["seed"]
    text = json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n"
    trace = Trace.from_json(text)
    assert trace.to_json() == text
    info = trace.info
    assert info.failure == RunFailure(rank=1, op="1F2", reason="RuntimeError: injected")
    assert info.partition == ((0, 2), (2, 4)) and info.compute_cpu_s == ((0.001, -1.0, 0.002), None)
    assert info.other == {"a_key_of_a_later_version": {"kept": [1, 2.5]}}


@pytest.mark.parametrize(("change", "expected"), [
    ({"num_stages": None}, "meta.num_stages=None: is required"),
    ({"num_stages": "2"}, "meta.num_stages='2': must be an integer"),
    ({"stage_to_rank": [0, 1.5]}, "meta.stage_to_rank=[0, 1.5]: must be a list of integers"),
    ({"failure": {"rank": 0}}, "meta.failure={'rank': 0}: must be an object of rank"),
])
def test_a_bad_meta_is_refused_by_name(change: dict[str, object], expected: str) -> None:
    data = json.loads(small_trace().to_json())
    for key, value in change.items():
        if value is None:
            del data["meta"][key]
        else:
            data["meta"][key] = value
    with pytest.raises(ConfigError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        Trace.from_json(json.dumps(data), source="t.json")


def test_the_cli_refuses_a_bad_meta_in_one_line(tmp_path: Path) -> None:
    data = json.loads(small_trace().to_json())
    data["meta"]["num_ranks"] = "two"
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(data))
    done = subprocess.run([sys.executable, "-m", "pipesim", "report", str(path), "--out", str(tmp_path / "r.html")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "meta.num_ranks='two': must be an integer" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "r.html").exists()


def test_a_program_has_no_engine_until_one_runs_it() -> None:
    info = RunInfo(schedule="1f1b", weights="flush", num_stages=1, num_microbatches=1, num_minibatches=1,
                   num_ranks=1, stage_to_rank=(0,), rank_devices=(0,), microbatch_size=1, param_bytes=(0.0,),
                   stash_bytes=(0.0,), optimizer_state_multiplier=1, device_memory_bytes=(None,))
    assert "engine" not in info.to_dict() and info.to_dict()["optimizer_state_multiplier"] == 1
    assert info.ran("des", jitter=0.0, seed=1).to_dict()["engine"] == "des"
