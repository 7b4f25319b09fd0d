"""The emulated device (--compute emulated): ops wait out their predicted durations, everything else is real."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from validation_oracle import check_report_arithmetic

ROOT = Path(__file__).resolve().parents[2]
# Each layer's F and B: long against what a loaded shared host adds to one op (a late wake-up, an
# isend of a few milliseconds), so that half of it is a slack no busy host eats into.
OP_S = 0.02

torch_needed = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode != 0,
    reason="needs torch (pip install torch==2.13.0, then pip install -e .[harness])")


def pipesim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipesim", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A harness profile of mlp depth 3 width 16 (microbatch 4) with slow made-up op times, and free links."""
    from pipesim.harness.config import SOURCE_PREFIX, ModelSpec
    from pipesim.spec.files import save_model
    from pipesim.spec.profile import Profile
    from pipesim.spec.topology import Topology
    from pipesim.spec.validation import build

    folder = tmp_path_factory.mktemp("emulated")
    activation, params = 4 * 16 * 4, (16 * 16 + 16) * 4
    layers = [{"name": name, "forward_s": OP_S, "backward_s": OP_S, "update_s": OP_S / 4,
               "activation_bytes": activation if name != "loss" else 4,
               "stash_bytes": activation if name != "loss" else 2 * activation,
               "param_bytes": params if name != "loss" else 0} for name in ("linear0", "block1", "block2", "loss")]
    spec = ModelSpec("mlp", depth=3, width=16)
    profile = build(Profile, {"name": "mlp", "layers": layers, "microbatch_size": 4, "dtype": "float32",
                              "device": "made up", "source": SOURCE_PREFIX + json.dumps(spec.to_dict(), sort_keys=True)})
    save_model(profile, folder / "profile.json")
    save_model(Topology.uniform(num_devices=2, bandwidth=1e12, latency=0.0), folder / "topology.json")
    return folder / "profile.json", folder / "topology.json"


@torch_needed
def test_emulated_ops_take_at_least_their_predicted_durations_back_to_back(files: tuple[Path, Path], tmp_path: Path) -> None:
    from pipesim.engine.trace import Trace
    from pipesim.harness.config import RunConfig, spec_of
    from pipesim.harness.prediction import predict
    from pipesim.spec.files import load_profile

    profile_path, _ = files
    out = tmp_path / "trace.json"
    done = pipesim("run", "--profile", str(profile_path), "--schedule", "2bw", "--stages", "2", "--microbatches", "2",
                   "--minibatches", "3", "--partition", "0:2,2:4", "--compute", "emulated", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "emulated compute" in done.stdout
    profile = load_profile(profile_path)
    spec = spec_of(profile)
    assert spec is not None
    config = RunConfig(model=spec, schedule="2bw", num_stages=2, num_microbatches=2, num_minibatches=3,
                       microbatch_size=4, partition=((0, 2), (2, 4)))
    predicted = {(s.device, s.position): (s.op, s.end_s - s.start_s, s.weight_version)
                 for s in predict(profile, None, config).trace.iter_spans() if s.stream == "compute"}
    spans = sorted((s for s in Trace.from_json(out.read_text()).iter_spans() if s.stream == "compute"),
                   key=lambda s: (s.device, s.position))
    assert {(s.device, s.position) for s in spans} == predicted.keys()
    first_start: dict[int, float] = {}
    device_time: dict[int, float] = {}
    for span in spans:
        expected_op, expected_s, expected_version = predicted[(span.device, span.position)]
        assert (span.op, span.weight_version) == (expected_op, expected_version)
        # The device runs its ops back to back: op k ends no earlier than the rank's first start plus
        # the durations of ops 0..k, less at most the isend it expects after it (the median of the
        # rank's recent isend calls: well under 1 ms on an idle host, a few ms on one whose cores are
        # busy with other programs), so half an op (10 ms) of slack. A device that skipped a wait
        # would end a whole op (20 ms) early.
        first_start.setdefault(span.device, span.start_s)
        device_time[span.device] = device_time.get(span.device, 0.0) + expected_s
        assert span.end_s > first_start[span.device] + device_time[span.device] - OP_S / 2, span.op


@torch_needed
def test_validate_emulated_reports_replay_noise_floor_and_exact_memory(files: tuple[Path, Path]) -> None:
    profile_path, topology_path = files
    done = pipesim("validate", "--profile", str(profile_path), "--topology", str(topology_path), "--schedule",
                   "1f1b,pipedream", "--stages", "2", "--microbatches", "2", "--minibatches", "3", "--repeats", "2",
                   "--compute", "emulated", "--host-cost-runs", "1", "--json")
    assert done.returncode == 0, done.stderr
    from pipesim.harness.config import ModelSpec, RunConfig
    from pipesim.harness.overheads import with_host_cost
    from pipesim.harness.prediction import predict
    from pipesim.spec.files import load_profile, load_topology

    profile, topology = load_profile(str(profile_path)), load_topology(str(topology_path))
    reports = json.loads(done.stdout)
    assert [r["schedule"] for r in reports] == ["1f1b", "pipedream"]
    for report in reports:
        assert report["compute"] == "emulated" and report["op_times"] == "layer profile"
        # the error, replay error and noise floor, recomputed from the runs the report lists
        assert len(report["measured"]["iteration_time_s_runs"]) == len(report["replay_error_runs"]) == 2
        check_report_arithmetic(report)
        # stashes are the profile's sizes and the weights are real: tracked memory is exact
        assert report["versions_match"] is True and report["peak_memory_error"] == [0.0, 0.0]
        # the prediction is the one with the measured host cost added
        config = RunConfig(model=ModelSpec("mlp", depth=3, width=16), schedule=report["schedule"], num_stages=2,
                           num_microbatches=2, num_minibatches=3, microbatch_size=4,
                           partition=tuple(tuple(r) for r in report["partition"]))
        slower = with_host_cost(profile, report["host_cost_s"], config.partition, (0, 1))
        assert report["predicted"]["iteration_time_s"] == pytest.approx(
            predict(slower, topology, config).metrics.iteration_time_s, rel=1e-12)


@torch_needed
def test_validate_refuses_a_user_model_without_a_microbatch_size(tmp_path: Path) -> None:
    models = tmp_path / "mymodels.py"  # a file that exists (a missing one is refused first, naming it)
    models.write_text("def build():\n    raise AssertionError('not called: refused before')\n")
    done = pipesim("validate", "--model", f"{models}:build", "--input-shape", "3,32,32", "--schedule", "1f1b",
                   "--stages", "2", "--microbatches", "2")
    assert done.returncode == 2 and "microbatch_size" in done.stderr and done.stderr.count("\n") == 1


@torch_needed
def test_validate_refuses_calibrated_op_times_on_the_emulated_device() -> None:
    done = pipesim("validate", "--schedule", "1f1b", "--stages", "2", "--microbatches", "2", "--compute", "emulated",
                   "--op-times", "calibrated")
    assert done.returncode == 2 and "op_times='calibrated'" in done.stderr and done.stderr.count("\n") == 1


@torch_needed
def test_validate_refuses_a_negative_number_of_host_cost_runs() -> None:
    done = pipesim("validate", "--schedule", "1f1b", "--stages", "2", "--microbatches", "2", "--compute", "emulated",
                   "--host-cost-runs", "-1")
    assert done.returncode == 2 and "host_cost_runs=-1" in done.stderr and done.stderr.count("\n") == 1


def may_take_realtime() -> bool:
    import os

    try:
        before = os.sched_getscheduler(0), os.sched_getparam(0)
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
    except OSError:
        return False
    os.sched_setscheduler(0, *before)
    return True


@torch_needed
def test_an_emulated_run_at_a_realtime_priority_runs_or_is_refused_in_one_line(files: tuple[Path, Path],
                                                                                tmp_path: Path) -> None:
    profile_path, _ = files
    done = pipesim("run", "--profile", str(profile_path), "--schedule", "1f1b", "--stages", "2", "--microbatches", "2",
                   "--minibatches", "3", "--compute", "emulated", "--realtime-priority", "5",
                   "--out", str(tmp_path / "trace.json"))
    if may_take_realtime():
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == 2 and "realtime_priority=5" in done.stderr and done.stderr.count("\n") == 1


@torch_needed
@pytest.mark.parametrize(("compute", "priority"), [("real", "5"), ("emulated", "100"), ("emulated", "-1")])
def test_a_realtime_priority_is_refused_with_real_compute_or_out_of_range(files: tuple[Path, Path], tmp_path: Path,
                                                                          compute: str, priority: str) -> None:
    profile_path, _ = files
    done = pipesim("run", "--profile", str(profile_path), "--schedule", "1f1b", "--stages", "2", "--microbatches", "2",
                   "--compute", compute, "--realtime-priority", priority, "--out", str(tmp_path / "trace.json"))
    assert done.returncode == 2 and f"realtime_priority={priority}" in done.stderr and done.stderr.count("\n") == 1


def test_the_realtime_priority_travels_with_the_run_config_and_is_checked() -> None:
    from pipesim.errors import ConfigError
    from pipesim.harness.config import Emulation, ModelSpec, RunConfig

    emulation = Emulation(durations_s=((0.001,),), stash_bytes=(8.0,), realtime_priority=7)
    config = RunConfig(model=ModelSpec("mlp", depth=1, width=4), schedule="gpipe", num_stages=1, num_microbatches=1,
                       num_minibatches=1, microbatch_size=1, partition=((0, 2),), emulation=emulation)
    assert RunConfig.from_json(config.to_json()).emulation == emulation
    with pytest.raises(ConfigError, match="realtime_priority"):
        Emulation(durations_s=((0.001,),), stash_bytes=(8.0,), realtime_priority=100)


@torch_needed
def test_a_rank_at_a_realtime_priority_runs_it_and_so_do_the_threads_it_starts() -> None:
    if not may_take_realtime():
        pytest.skip("SCHED_RR needs root or CAP_SYS_NICE")
    probe = ("import os, threading\n"
             "from pipesim.harness.rank.process import configure_process\n"
             "configure_process(1, realtime_priority=3)\n"
             "seen = []\n"
             "thread = threading.Thread(target=lambda: seen.append(os.sched_getscheduler(threading.get_native_id())))\n"
             "thread.start(); thread.join()\n"
             "print(os.sched_getscheduler(0) == os.SCHED_RR, seen == [os.SCHED_RR], os.sched_getparam(0).sched_priority)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.stdout.split() == ["True", "True", "3"], done.stderr
