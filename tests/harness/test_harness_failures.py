"""A rank that raises, hangs or dies ends the whole run, names the rank and the op, and keeps the partial trace."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pipesim.engine.trace import Trace  # noqa: E402
from pipesim.harness import RunFailedError  # noqa: E402
from pipesim.harness.config import RunConfig  # noqa: E402
from pipesim.harness.launch import launch  # noqa: E402
from pipesim.harness.rank.models import ModelSpec  # noqa: E402
from pipesim.harness.profiler import Timing, profile_model  # noqa: E402
from pipesim.harness.recorder import PHASE, PID, POSITION, header_of  # noqa: E402
from pipesim.spec.files import save_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FAULTY = ROOT / "tests" / "support" / "harness_faulty_model.py"


def faulty_config(tmp_path: Path, mode: str) -> RunConfig:
    spec = ModelSpec(f"{FAULTY}:{mode}", input_shape=(8,))
    return RunConfig(model=spec, schedule="gpipe", num_stages=2, num_microbatches=4, num_minibatches=1,
                     microbatch_size=2, partition=((0, 1), (1, 3)), trace_out=str(tmp_path / "trace.json"))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    state = stat.read_text().split(")")[-1].split()[0] if stat.exists() else "X"
    return state not in ("Z", "X")


def test_a_rank_that_raises_ends_the_run_naming_rank_and_op(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(RunFailedError) as caught:
        launch(faulty_config(tmp_path, "raising"), run_dir=run_dir, op_timeout_s=60)
    error = caught.value
    assert (error.rank, error.op) == (1, "1F2")
    assert "injected failure" in str(error) and "rank 1 at 1F2" in str(error)
    trace = Trace.from_json((tmp_path / "trace.json").read_text())
    assert trace.info.partial and trace.info.failure is not None and trace.info.failure.op == "1F2"
    ops = {span.op for span in trace.iter_spans() if span.stream == "compute"}
    assert {"0F0", "0F1", "1F0", "1F1"} <= ops and "1F2" not in ops
    for rank in range(2):
        pid = int(header_of(run_dir / f"rank{rank}.npy")[PID])
        assert not alive(pid), f"rank {rank} (pid {pid}) outlived the run"


def test_a_rank_that_hangs_ends_the_run_within_the_op_timeout(tmp_path: Path) -> None:
    started = time.perf_counter()
    with pytest.raises(RunFailedError) as caught:
        launch(faulty_config(tmp_path, "hanging"), op_timeout_s=3)
    assert time.perf_counter() - started < 60
    assert (caught.value.rank, caught.value.op) == (1, "1F2")
    assert "no progress" in caught.value.reason and "computing" in caught.value.reason
    assert Trace.from_json((tmp_path / "trace.json").read_text()).info.partial


def test_killing_a_rank_mid_run_ends_the_command_within_30_s(tmp_path: Path) -> None:
    profile = profile_model(ModelSpec("mlp", depth=2, width=16), 2, timing=Timing(warmup=1, repeats=2, processes=1),
                            calibrate=False)
    save_model(profile, tmp_path / "profile.json")
    run_dir, out = tmp_path / "run", tmp_path / "trace.json"
    command = [sys.executable, "-m", "pipesim", "run", "--profile", str(tmp_path / "profile.json"), "--schedule",
               "1f1b", "--stages", "2", "--microbatches", "4", "--minibatches", "3000", "--run-dir", str(run_dir),
               "--out", str(out)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.perf_counter() + 120
        headers = [None, None]
        while time.perf_counter() < deadline:
            headers = [header_of(run_dir / f"rank{rank}.npy") for rank in range(2)]
            if all(h is not None and h[POSITION] >= 20 for h in headers):
                break
            assert process.poll() is None, process.communicate()
            time.sleep(0.1)
        assert all(h is not None and h[POSITION] >= 20 for h in headers), "the run did not get going"
        victim, survivor = int(headers[1][PID]), int(headers[0][PID])
        os.kill(victim, signal.SIGKILL)
        killed_at = time.perf_counter()
        _, stderr = process.communicate(timeout=30)
        assert time.perf_counter() - killed_at < 30
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 1
    assert "rank 1 at 1" in stderr and "killed by SIGKILL" in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1
    trace = Trace.from_json(out.read_text())
    assert trace.info.partial and trace.num_spans > 20
    time.sleep(0.5)
    assert not alive(survivor), "rank 0 outlived the run"
    assert int(header_of(run_dir / "rank0.npy")[PHASE]) != 3  # it never finished
