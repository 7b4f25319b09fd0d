"""The GPU path: NCCL between one GPU per rank, op spans timed by CUDA events (skipped without CUDA)."""

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


def pipesim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipesim", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)


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


@pytest.mark.parametrize("compute", ["real", "emulated"])
def test_validate_on_cuda_reports_every_figure(compute: str) -> None:
    done = pipesim("validate", "--model", "mlp", "--schedule", "1f1b,zb-h1", "--stages", "2", "--microbatches", "4",
                   "--repeats", "2", "--device", "cuda", "--compute", compute, "--op-times", "layers", "--json")
    assert done.returncode == 0, done.stderr
    for report in json.loads(done.stdout):
        assert report["versions_match"] is True and report["compute"] == compute
        assert report["measured"]["iteration_time_s"] > 0 and "noise_floor" in report
