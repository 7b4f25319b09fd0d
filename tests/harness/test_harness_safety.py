"""The harness on shared files and a shared machine (issue 37, items 1-3).

A profile someone sent never runs code; the ranks listen on loopback only (checked on the live
sockets of a real run, read from the kernel through psutil); a run folder keeps what others put in
it. Every run here is a real one: forked ranks, gloo, torch's store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
psutil = pytest.importorskip("psutil")

from pipesim.harness.config import ModelSpec, RunConfig  # noqa: E402
from pipesim.harness.loopback import is_loopback  # noqa: E402
from pipesim.harness.profiler import Timing, profile_model  # noqa: E402
from pipesim.spec.files import load_profile, save_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MARKER = "PIPESIM_TEST_MARKER"
# A user's model file that leaves a trace of having run: the same layers as the mlp of depth 2 and width 16.
USER_MODEL = """\
from pathlib import Path
from torch import nn

Path(__file__).with_name("it-ran").write_text("the profile's model file was imported\\n")


def build():
    return nn.Sequential(nn.Linear(16, 16), nn.Sequential(nn.ReLU(), nn.Linear(16, 16)))
"""


@pytest.fixture(scope="module")
def mlp_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("profile") / "mlp.json"
    save_model(profile_model(ModelSpec("mlp", depth=2, width=16), 2, timing=Timing(warmup=1, repeats=2, processes=1),
                             calibrate=False), path)
    return path


@pytest.fixture
def shared_profile(mlp_profile: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A harness profile whose source names a user model file (as one sent by someone else would)."""
    model = tmp_path / "model.py"
    model.write_text(USER_MODEL)
    source = {"name": f"{model}:build", "depth": 8, "width": 512, "seq_len": 32, "heads": 4, "input_shape": [16],
              "seed": 0}
    path = tmp_path / "shared.json"
    save_model(load_profile(mlp_profile).model_copy(update={"source": "pipesim.harness model=" + json.dumps(source)}),
               path)
    return path, model


def pipesim(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipesim", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, env=env)


RUN = ("--schedule", "gpipe", "--stages", "2", "--microbatches", "2")


@pytest.mark.parametrize("command", ["run", "validate"])
def test_a_profile_naming_a_user_model_runs_no_code_and_shows_what_to_type(
    shared_profile: tuple[Path, Path], tmp_path: Path, command: str
) -> None:
    profile, model = shared_profile
    out = ("--out", str(tmp_path / "t.json")) if command == "run" else ()
    done = pipesim(command, "--profile", str(profile), *RUN, *out)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr == (f"pipesim: error: {profile}: source.model='{model}:build': is a user model, whose code "
                           f"pipesim runs only when you name it yourself: add --model {model}:build (or the path where "
                           "that file is here) if you trust it\n")
    assert not (model.parent / "it-ran").exists()
    assert not (tmp_path / "t.json").exists()


def test_a_user_model_named_on_the_command_line_runs(shared_profile: tuple[Path, Path], tmp_path: Path) -> None:
    profile, model = shared_profile
    done = pipesim("run", "--profile", str(profile), "--model", f"{model}:build", *RUN, "--out",
                   str(tmp_path / "t.json"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert (model.parent / "it-ran").exists() and (tmp_path / "t.json").exists()


def test_a_built_in_model_needs_no_name_and_refuses_another(mlp_profile: Path, tmp_path: Path) -> None:
    wrong = pipesim("run", "--profile", str(mlp_profile), "--model", "transformer", *RUN, "--out",
                    str(tmp_path / "t.json"))
    assert (wrong.returncode, wrong.stderr) == (
        2, f"pipesim: error: {mlp_profile}: model='transformer': the profile was measured on 'mlp'\n")
    done = pipesim("run", "--profile", str(mlp_profile), *RUN, "--out", str(tmp_path / "t.json"))
    assert done.returncode == 0, done.stderr[-2000:]


def marked_listeners(marker: str) -> dict[int, set[tuple[str, int]]]:
    """Per process whose environment carries the marker, the TCP addresses it listens on."""
    needle = f"{MARKER}={marker}".encode()
    found: dict[int, set[tuple[str, int]]] = {}
    for process in psutil.process_iter(["pid"]):
        try:
            if needle not in Path(f"/proc/{process.pid}/environ").read_bytes():
                continue
            for connection in process.net_connections(kind="inet"):
                if connection.status == psutil.CONN_LISTEN:
                    found.setdefault(process.pid, set()).add((connection.laddr.ip, connection.laddr.port))
        except (OSError, psutil.Error):
            continue
    return found


def other_interface() -> str | None:
    """A network interface of this host other than loopback, if it has one up."""
    for flags in sorted(Path("/sys/class/net").glob("*/flags")):
        if not int(flags.read_text(), 16) & 0x8 and (flags.parent / "operstate").read_text().strip() == "up":
            return flags.parent.name
    return None


@pytest.mark.parametrize("inherited", [None, "another interface"])
def test_a_run_listens_on_loopback_only_while_its_ranks_wait(mlp_profile: Path, tmp_path: Path,
                                                            inherited: str | None) -> None:
    """The store (rank 0) and every rank's gloo listener, read while the run goes on, bind loopback,
    even when the environment names another interface for gloo (GLOO_SOCKET_IFNAME, set for other jobs)."""
    env = dict(os.environ)
    if inherited:
        interface = other_interface()
        if interface is None:
            pytest.skip("this host has no network interface but loopback")
        env["GLOO_SOCKET_IFNAME"] = interface
    marker = uuid.uuid4().hex
    env[MARKER] = marker
    process = subprocess.Popen([sys.executable, "-m", "pipesim", "run", "--profile", str(mlp_profile), "--schedule",
                                "1f1b", "--stages", "2", "--microbatches", "4", "--minibatches", "3000", "--out",
                                str(tmp_path / "t.json")], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        deadline, listening = time.monotonic() + 120, {}
        while time.monotonic() < deadline and process.poll() is None:
            listening = marked_listeners(marker)
            if len(listening) >= 2 and sum(map(len, listening.values())) >= 3:  # the store and two gloo listeners
                break
            time.sleep(0.1)
        assert process.poll() is None, process.communicate()
    finally:
        process.kill()
        process.communicate()
    addresses = {address for found in listening.values() for address, _ in found}
    assert sum(map(len, listening.values())) >= 3, listening
    assert all(is_loopback(address) for address in addresses), listening


def test_linkbench_listens_on_loopback_only(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    process = subprocess.Popen([sys.executable, "-m", "pipesim", "linkbench", "--ranks", "2", "--max-bytes", "64MB",
                                "--repeats", "2000", "--out", str(tmp_path / "topology.json")], cwd=ROOT,
                               env=dict(os.environ, **{MARKER: marker}), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        deadline, listening = time.monotonic() + 120, {}
        while time.monotonic() < deadline and process.poll() is None:
            listening = marked_listeners(marker)
            if sum(map(len, listening.values())) >= 3:
                break
            time.sleep(0.05)
    finally:
        process.kill()
        process.communicate()
    assert sum(map(len, listening.values())) >= 3, listening
    assert all(is_loopback(address) for found in listening.values() for address, _ in found), listening


def test_a_worker_given_another_hosts_address_asks_for_an_interface(tmp_path: Path) -> None:
    """Under torchrun across hosts the user names the interface gloo listens on; without it the rank stops."""
    config = RunConfig(model=ModelSpec("mlp", depth=2, width=8), schedule="gpipe", num_stages=2, num_microbatches=2,
                       num_minibatches=1, microbatch_size=2, partition=((0, 1), (1, 3)), comm_timeout_s=5)
    (tmp_path / "config.json").write_text(config.to_json())
    env = {key: value for key, value in os.environ.items() if key != "GLOO_SOCKET_IFNAME"}
    env.update(RANK="1", WORLD_SIZE="2", MASTER_ADDR="192.0.2.1", MASTER_PORT="29500", PIPESIM_RUN_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-m", "pipesim.harness.rank.worker", str(tmp_path / "config.json")],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert done.returncode == 1
    error = json.loads((tmp_path / "error1.json").read_text())
    assert error["message"] == ("ConfigError: MASTER_ADDR='192.0.2.1': is not this host's loopback: a run across hosts "
                                "must name the network interface its ranks listen on (unauthenticated, open to that "
                                "network) with GLOO_SOCKET_IFNAME")


def test_a_run_folder_holding_others_files_is_refused_and_left_alone(mlp_profile: Path, tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    theirs = {"notes.txt": b"mine\n", "rank0.npy": b"not pipesim's\n", "error1.json": b"{}\n", "config.json": b"{}"}
    for name, data in theirs.items():
        (folder / name).write_bytes(data)
    done = pipesim("run", "--profile", str(mlp_profile), *RUN, "--run-dir", str(folder), "--out",
                   str(tmp_path / "t.json"))
    assert (done.returncode, done.stderr) == (2, f"pipesim: error: run_dir='{folder}': holds files pipesim did not "
                                                 "write (such as config.json): give a new or empty folder\n")
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == theirs


def test_a_run_folder_of_pipesims_is_reused_replacing_only_its_files(mlp_profile: Path, tmp_path: Path) -> None:
    folder = tmp_path / "run"
    first = pipesim("run", "--profile", str(mlp_profile), *RUN, "--run-dir", str(folder), "--out",
                    str(tmp_path / "t.json"))
    assert first.returncode == 0, first.stderr[-2000:]
    assert {"config.json", "rank0.log", "rank1.log", "rank0.npy", "rank1.npy"} <= {p.name for p in folder.iterdir()}
    (folder / "notes.txt").write_text("mine\n")
    again = pipesim("run", "--profile", str(mlp_profile), *RUN, "--run-dir", str(folder), "--out",
                    str(tmp_path / "t.json"))
    assert again.returncode == 0, again.stderr[-2000:]
    assert (folder / "notes.txt").read_text() == "mine\n" and (folder / "rank1.npy").exists()
    (folder / "error0.json").write_text("{}")  # someone else's file, under a name the next run would write
    third = pipesim("run", "--profile", str(mlp_profile), *RUN, "--run-dir", str(folder), "--out",
                    str(tmp_path / "t.json"))
    assert (third.returncode, third.stderr) == (2, f"pipesim: error: run_dir='{folder}': holds error0.json, which no "
                                                   "earlier run of pipesim wrote there: give a new or empty folder\n")
    assert (folder / "error0.json").read_text() == "{}" and (folder / "notes.txt").read_text() == "mine\n"
