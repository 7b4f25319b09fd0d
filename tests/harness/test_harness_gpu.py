"""The GPU path: layer profiles timed by CUDA events on one GPU; NCCL between one GPU per rank
(skipped without CUDA, the pipeline runs without two GPUs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 1,
                                reason="needs a CUDA GPU (NCCL and CUDA events); torch sees none here")

ROOT = Path(__file__).resolve().parents[2]
GPUS = torch.cuda.device_count()
two_gpus = pytest.mark.skipif(GPUS < 2, reason=f"a pipeline on NCCL takes one GPU per rank (2); torch sees {GPUS}")


def pipesim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipesim", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)


@two_gpus
def test_flush_schedule_on_nccl_equals_non_pipelined_training(tmp_path: Path) -> None:
    from pipesim.engine.trace import Trace
    from pipesim.harness.config import ModelSpec, RunConfig, TrainingOptions
    from pipesim.harness.launch import launch
    from pipesim.harness.rank.models import build_model
    from harness_reference import flush_reference

    spec = ModelSpec("mlp", depth=4, width=8, seed=7)
    config = RunConfig(model=spec, schedule="1f1b", num_stages=2, num_microbatches=4, num_minibatches=2,
                       microbatch_size=3, partition=((0, 2), (2, 5)), training=TrainingOptions(learning_rate=0.05),
                       backend="nccl", device="cuda", weights_out=str(tmp_path / "weights"),
                       trace_out=str(tmp_path / "trace.json"))
    launch(config, op_timeout_s=120)
    got = [w for s in range(2) for w in torch.load(tmp_path / "weights" / f"stage{s}.pt")]
    want = flush_reference(build_model(spec, 3), m=4, k=2, batch=3, lr=0.05)
    worst = max(float((a - b).abs().max()) for a, b in zip(got, want, strict=True))
    assert worst <= 1e-5
    trace = Trace.from_json((tmp_path / "trace.json").read_text())
    assert trace.info.device == "cuda" and len(trace.info.cuda_max_memory_allocated_bytes or ()) == 2
    assert all(span.end_s >= span.start_s for span in trace.iter_spans())


@two_gpus
@pytest.mark.parametrize("compute", ["real", "emulated"])
def test_validate_on_cuda_reports_every_figure(compute: str) -> None:
    done = pipesim("validate", "--model", "mlp", "--schedule", "1f1b,zb-h1", "--stages", "2", "--microbatches", "4",
                   "--repeats", "2", "--device", "cuda", "--compute", compute, "--op-times", "layers", "--json")
    assert done.returncode == 0, done.stderr
    for report in json.loads(done.stdout):
        assert report["versions_match"] is True and report["compute"] == compute
        assert report["measured"]["iteration_time_s"] > 0 and "noise_floor" in report


def test_a_cuda_profile_times_every_layer_and_has_the_cpu_profiles_sizes(tmp_path: Path) -> None:
    args = ("profile", "--model", "transformer", "--depth", "2", "--width", "64", "--seq-len", "16",
            "--microbatch-size", "4", "--repeats", "5", "--processes", "1", "--no-calibrate")
    gpu = pipesim(*args, "--device", "cuda", "--out", str(tmp_path / "gpu.json"))
    assert gpu.returncode == 0, gpu.stderr
    cpu = pipesim(*args, "--device", "cpu", "--out", str(tmp_path / "cpu.json"))
    assert cpu.returncode == 0, cpu.stderr
    on_gpu, on_cpu = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("gpu", "cpu"))
    assert on_gpu["device"].startswith("cuda")
    for layer in on_gpu["layers"][:-1]:  # the loss's ops may be no slower than the fixed cost taken off
        assert 0 < layer["forward_s"] < 1 and 0 < layer["backward_s"] < 1, layer
    sizes = ("activation_bytes", "stash_bytes", "param_bytes")
    assert [[layer[key] for key in sizes] for layer in on_gpu["layers"]] == \
        [[layer[key] for key in sizes] for layer in on_cpu["layers"]]


@pytest.mark.skipif(GPUS >= 2, reason="checks the refusal on a machine with one GPU")
@pytest.mark.parametrize(("args", "expected"), [
    (("validate", "--model", "mlp", "--schedule", "1f1b", "--stages", "2", "--microbatches", "4",
      "--device", "cuda", "--json"), "ranks=2: each CUDA process takes a GPU of its own, and torch sees 1 GPU here"),
    (("profile", "--model", "mlp", "--microbatch-size", "4", "--device", "cuda", "--no-calibrate", "--out", "{out}"),
     "processes=2: each CUDA process takes a GPU of its own, and torch sees 1 GPU here: use --processes 1"),
    (("profile", "--model", "mlp", "--microbatch-size", "4", "--device", "cuda", "--processes", "1",
      "--out", "{out}"), "calibrate=2: each CUDA process takes a GPU of its own"),
    (("linkbench", "--backend", "nccl", "--out", "{out}"), "ranks=2: each CUDA process takes a GPU of its own"),
])
def test_more_cuda_processes_than_gpus_is_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...],
                                                              expected: str) -> None:
    out = tmp_path / "out.json"
    done = pipesim(*(arg.format(out=out) for arg in args))
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert expected in done.stderr and not out.exists()
