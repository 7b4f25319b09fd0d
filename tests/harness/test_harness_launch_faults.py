"""Launch faults of the harness: a rendezvous port already in use, a backend that is not available.

Each case ends within a bounded time with one line naming the port, backend or rank, and the
process table is checked afterwards: every process the command started (found by a marker in
its environment, which forked ranks inherit) is gone.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
psutil = pytest.importorskip("psutil")

from pipesim.engine.trace import Trace  # noqa: E402
from pipesim.harness import RunFailedError  # noqa: E402
from pipesim.harness.config import RunConfig  # noqa: E402
from pipesim.harness.launch import launch  # noqa: E402
from pipesim.harness.rank.models import ModelSpec  # noqa: E402
from pipesim.harness.profiler import Timing, profile_model  # noqa: E402
from pipesim.harness.zygote import shared_zygote  # noqa: E402
from pipesim.spec.files import save_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MARKER = "PIPESIM_TEST_MARKER"


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("profile") / "profile.json"
    profile = profile_model(ModelSpec("mlp", depth=2, width=16), 2, timing=Timing(warmup=1, repeats=2, processes=1),
                            calibrate=False)
    save_model(profile, path)
    return path


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port some other program holds: bound and listening on 127.0.0.1 (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def marked(marker: str) -> list[int]:
    """Pids of live processes whose environment carries ``MARKER=marker``."""
    needle = f"{MARKER}={marker}".encode()
    found = []
    for process in psutil.process_iter(["pid"]):
        try:
            if process.status() != psutil.STATUS_ZOMBIE and needle in Path(f"/proc/{process.pid}/environ").read_bytes():
                found.append(process.pid)
        except (OSError, psutil.Error):
            continue
    return found


def run_cli(*args: str, timeout_s: float = 120) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``pipesim ARGS`` with a fresh marker; after it ends, no process it started may be alive."""
    marker = uuid.uuid4().hex
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pipesim", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout_s, env=dict(os.environ, **{MARKER: marker}))
    elapsed = time.monotonic() - started
    deadline = time.monotonic() + 5  # ranks get SIGKILL when their parent dies; give the kernel a moment
    while marked(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marked(marker) == [], "processes of the command outlived it"
    return done, elapsed


def run_args(profile_path: Path, tmp_path: Path, *extra: str) -> list[str]:
    return ["run", "--profile", str(profile_path), "--schedule", "gpipe", "--stages", "2", "--microbatches", "2",
            "--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "trace.json"), *extra]


def test_a_rendezvous_port_in_use_is_refused_before_any_rank_starts(
    profile_path: Path, busy_port: int, tmp_path: Path
) -> None:
    done, elapsed = run_cli(*run_args(profile_path, tmp_path, "--master-port", str(busy_port)))
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert f"master_port={busy_port}: cannot be bound on 127.0.0.1 (Address already in use)" in done.stderr
    assert elapsed < 60
    assert not (tmp_path / "run" / "rank0.log").exists() and not (tmp_path / "trace.json").exists()


def test_a_rendezvous_port_taken_under_the_launcher_fails_rank_0_naming_the_port(
    busy_port: int, tmp_path: Path
) -> None:
    """launch() itself does not probe the port (the CLI does), so this is the path of a port taken
    between choosing it and listening on it: rank 0's store cannot listen, the run ends at once."""
    config = RunConfig(model=ModelSpec("mlp", depth=2, width=16), schedule="gpipe", num_stages=2,
                       num_microbatches=2, num_minibatches=1, microbatch_size=2, partition=((0, 1), (1, 3)),
                       trace_out=str(tmp_path / "trace.json"))
    started = time.monotonic()
    with pytest.raises(RunFailedError) as caught:
        launch(config, run_dir=tmp_path / "run", master_port=busy_port, startup_timeout_s=60)
    assert time.monotonic() - started < 60
    assert caught.value.rank == 0
    assert f"the rendezvous port {busy_port} on 127.0.0.1 is already in use" in str(caught.value)
    assert len(str(caught.value).splitlines()) == 1
    trace = Trace.from_json((tmp_path / "trace.json").read_text())
    assert trace.info.partial and trace.info.failure is not None and trace.info.failure.rank == 0
    server = psutil.Process(shared_zygote().process.pid)
    assert server.children(recursive=True) == [], "a rank outlived the run"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize(("extra", "expected"), [
    (("--backend", "nccl", "--device", "cuda"), "backend='nccl': needs CUDA, and torch"),
    (("--backend", "nccl"), "backend='nccl': nccl needs --device cuda"),
    (("--backend", "mpi"), "'mpi' is not one of 'gloo', 'nccl'"),
])
def test_a_backend_that_is_not_available_is_one_line_and_exit_2_before_any_rank_starts(
    profile_path: Path, tmp_path: Path, extra: tuple[str, ...], expected: str
) -> None:
    done, elapsed = run_cli(*run_args(profile_path, tmp_path, *extra))
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert expected in done.stderr
    assert elapsed < 60
    assert not (tmp_path / "run" / "rank0.log").exists() and not (tmp_path / "trace.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_linkbench_refuses_nccl_without_cuda_before_any_rank_starts(tmp_path: Path) -> None:
    done, _ = run_cli("linkbench", "--backend", "nccl", "--out", str(tmp_path / "topology.json"))
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "backend='nccl': needs CUDA" in done.stderr and not (tmp_path / "topology.json").exists()


@pytest.mark.parametrize("ranks", ["1", "1000000000000"])
def test_linkbench_refuses_a_rank_count_out_of_bounds_before_any_rank_starts(tmp_path: Path, ranks: str) -> None:
    done, elapsed = run_cli("linkbench", "--ranks", ranks, "--out", str(tmp_path / "topology.json"))
    assert (done.returncode, done.stderr) == (2, f"pipesim: error: ranks={ranks}: must be from 2 to 1,024\n")
    assert elapsed < 60 and not (tmp_path / "topology.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize("args", [
    ("validate", "--model", "mlp", "--schedule", "1f1b", "--stages", "2", "--microbatches", "4", "--device", "cuda"),
    ("profile", "--model", "mlp", "--microbatch-size", "4", "--device", "cuda", "--out", "{out}"),
])
def test_commands_without_a_backend_option_name_the_device_when_cuda_is_missing(tmp_path: Path,
                                                                                args: tuple[str, ...]) -> None:
    out = tmp_path / "out.json"
    done, elapsed = run_cli(*(arg.format(out=out) for arg in args))
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "device='cuda': needs CUDA, and torch" in done.stderr and done.stderr.rstrip().endswith("use --device cpu")
    assert elapsed < 60 and not out.exists()


def test_a_ctrl_c_at_the_terminal_is_one_line_exit_130_and_leaves_no_process(profile_path: Path, tmp_path: Path) -> None:
    """A terminal sends SIGINT to the whole process group: the launcher, the rank fork server and the
    ranks. The launcher's one line, and no KeyboardInterrupt traceback from the server."""
    marker = uuid.uuid4().hex
    args = run_args(profile_path, tmp_path, "--minibatches", "100000")
    child = subprocess.Popen([sys.executable, "-m", "pipesim", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=ROOT, env=dict(os.environ, **{MARKER: marker}), start_new_session=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "run" / "rank1.log").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # the ranks are running their minibatches
    os.killpg(child.pid, signal.SIGINT)
    _, stderr = child.communicate(timeout=60)
    assert child.returncode == 130, stderr
    assert stderr.strip() == "pipesim: aborted", stderr
    deadline = time.monotonic() + 5
    while marked(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marked(marker) == [], "processes of the command outlived it"
