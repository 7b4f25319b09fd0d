"""``pipesim plan`` and ``pipesim simulate --plan`` through the real entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VGG = str(ROOT / "traces" / "vgg16.json")
CLUSTER = ("--devices", "16", "--devices-per-server", "4", "--bandwidth", "10GB/s", "--inter-server-bandwidth",
           "10Gbit/s")


def pipesim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipesim", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


def test_plan_json_has_the_issue_shape_and_the_simulation_picks_the_fastest_candidate() -> None:
    done = pipesim("plan", "--profile", VGG, *CLUSTER, "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["planner"] == "pipedream" and data["cost_model"]["name"] == "simulated"
    assert data["microbatch_size"] == 128 and data["recompute"] is False
    assert set(data["predicted"]) >= {"time_per_sample_s", "throughput_samples_per_s", "peak_memory_bytes"}
    assert data["predicted"]["throughput_samples_per_s"] == pytest.approx(128 / data["predicted"]["time_per_microbatch_s"])
    for key in ("schedule", "iteration_time_s", "throughput_samples_per_s", "peak_memory_bytes", "stages", "partition",
                "time_per_sample_s"):
        assert key in data["simulated"]
    assert data["simulated"]["schedule"] == "pipedream"
    candidates = data["candidates"]
    assert {"data parallelism", "straight pipeline", "analytic optimum"} <= {row["label"] for row in candidates}
    for row in candidates:
        assert set(row) >= {"replication", "partition", "predicted", "simulated"}
        assert sum(row["replication"]) == 16 and len(row["partition"]) == len(row["replication"])
    chosen = [row for row in candidates if row["chosen"]]
    assert len(chosen) == 1 and chosen[0]["replication"] == data["plan"]["replicas"]
    fastest = min(row["simulated"]["time_per_sample_s"] for row in candidates)
    assert data["simulated"]["time_per_sample_s"] == fastest == chosen[0]["simulated"]["time_per_sample_s"]
    assert data["data_parallel"]["speedup_simulated"] >= 1


def test_pipedream_cost_model_returns_the_released_optimizers_choice() -> None:
    """Flat 16 GPUs at 1 GB/s on PipeDream's VGG-16 profile: the released optimizer finds 13-2-1 at
    0.0565297673846 s per minibatch of 128 (tests/data/pipedream_optimizer.json)."""
    done = pipesim("plan", "--profile", VGG, "--devices", "16", "--bandwidth", "1GB/s", "--cost-model", "pipedream",
                   "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["cost_model"]["name"] == "pipedream" and data["plan"]["replicas"] == [13, 2, 1]
    assert data["predicted"]["time_per_microbatch_s"] == pytest.approx(0.056529767384615376, rel=1e-9)
    assert data["candidates"][0]["label"] == "PipeDream's optimizer" and data["candidates"][0]["chosen"]


def test_saved_plan_simulates_the_same_and_files_are_byte_identical(tmp_path: Path) -> None:
    args = ("plan", "--profile", VGG, "--devices", "4", "--bandwidth", "10GB/s", "--planner", "2bw",
            "--batch-size", "64", "--memory", "8GB")
    first = pipesim(*args, "--out", str(tmp_path / "a"))
    second = pipesim(*args, "--out", str(tmp_path / "b"), "--json")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert "simulate it again: pipesim simulate --plan" in first.stdout
    for name in ("topology.json", "profile.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    # plan.json records the command that wrote it; everything else in it is identical.
    saved = [json.loads((tmp_path / folder / "plan.json").read_text()) for folder in ("a", "b")]
    commands = [plan["run"].pop("command") for plan in saved]
    assert saved[0] == saved[1] and commands[1] == f"{commands[0].replace('/a', '/b')} --json"
    planned = json.loads(second.stdout)
    assert planned["microbatch_size"] < 128 and planned["predicted"]["peak_memory_bytes"] <= 8e9
    again = pipesim("simulate", "--plan", str(tmp_path / "a" / "plan.json"), "--profile",
                    str(tmp_path / "a" / "profile.json"), "--topology", str(tmp_path / "a" / "topology.json"), "--json")
    assert again.returncode == 0, again.stderr
    simulated = json.loads(again.stdout)
    for key in ("iteration_time_s", "throughput_samples_per_s", "peak_memory_bytes", "partition", "num_microbatches"):
        assert simulated[key] == planned["simulated"][key], key


def test_a_plan_cutting_a_dag_off_the_files_order_saves_its_reordered_profile(tmp_path: Path) -> None:
    """ResNet-50 on 2 servers of 8 in PipeDream's mode: its first stage ends with a block's shortcut
    conv (node88) before that block's main branch (node86, node87), so the saved profile has the
    layers in that order, and simulating the saved files gives the plan's own numbers."""
    done = pipesim("plan", "--profile", str(ROOT / "traces" / "resnet50.json"), "--devices", "16",
                   "--devices-per-server", "8", "--bandwidth", "50GB/s", "--inter-server-bandwidth", "25Gbit/s",
                   "--cost-model", "pipedream", "--json", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    planned = json.loads(done.stdout)
    saved = json.loads((tmp_path / "profile.json").read_text())
    names = [layer["name"].split()[0] for layer in saved["layers"]]
    assert names[85:88] == ["node88", "node86", "node87"] and planned["plan"]["replicas"] == [10, 2, 2, 2]
    again = pipesim("simulate", "--plan", str(tmp_path / "plan.json"), "--profile", str(tmp_path / "profile.json"),
                    "--topology", str(tmp_path / "topology.json"), "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["iteration_time_s"] == planned["simulated"]["iteration_time_s"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--memory", "1GB"), "memory='1.00 GB': no PipeDream plan fits in 1.00 GB per device; the smallest "
                              "per-device memory any plan needs is"),
        (("--memory", "100MB", "--planner", "2bw"), "no 2BW plan fits in 100.00 MB per device"),
        (("--inter-server-bandwidth", "10Gbit/s"), "give --devices-per-server and --inter-server-bandwidth together"),
        (("--bandwidth", "fast"), "bandwidth='fast': must be a number with a unit"),
    ],
)
def test_bad_plan_input_is_one_line_and_exit_2(args: tuple[str, ...], expected: str) -> None:
    base = {"--profile": VGG, "--devices": "4", "--bandwidth": "10GB/s"}
    extra = list(args)
    for flag in list(base):
        if flag in extra:
            base[flag] = extra[extra.index(flag) + 1]
            del extra[extra.index(flag):extra.index(flag) + 2]
    done = pipesim("plan", *[item for pair in base.items() for item in pair], *extra)
    assert done.returncode == 2, done.stdout
    assert done.stderr.count("\n") == 1 and expected in done.stderr, done.stderr


def test_simulate_plan_refuses_what_the_plan_already_says(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"schema": "pipesim.plan/1", "schedule": "1f1b", "num_stages": 2,
                                "num_microbatches": 4}))
    done = pipesim("simulate", "--plan", str(plan), "--profile", VGG, "--stages", "2")
    assert done.returncode == 2 and "stages=2: comes from the plan file" in done.stderr
    done = pipesim("simulate", "--profile", VGG, "--microbatches", "4", "--schedule", "1f1b")
    assert done.returncode == 2 and "Missing option '--stages'" in done.stderr
    done = pipesim("simulate", "--plan", str(plan), "--profile", VGG, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["num_stages"] == 2


def _vgg_first_layer(tmp_path: Path, *, drop_inputs: bool) -> str:
    data = json.loads(Path(VGG).read_text(encoding="utf-8"))
    layer = dict(data["layers"][0])
    if drop_inputs:
        layer.pop("inputs", None)
    path = tmp_path / f"one-{drop_inputs}.json"
    path.write_text(json.dumps({**data, "layers": [layer]}), encoding="utf-8")
    return str(path)


def test_plan_refuses_what_it_cannot_plan_in_one_line(tmp_path: Path) -> None:
    """A NaN optimizer state, a profile whose layers all take no time (a DAG's lone input layer or a
    chain's), and a graph.txt without edges under PipeDream's optimizer: one line, exit 2."""
    graph = tmp_path / "graph.txt"
    times = "forward_compute_time={}, backward_compute_time={}, activation_size=1000.000, parameter_size={}"
    graph.write_text(f"node1 -- Input -- {times.format('0.000', '0.000', '0.000')}\n"
                     f"node2 -- Conv2d(3, 64) -- {times.format('1.000', '2.000', '100.000')}\n"
                     f"node3 -- ReLU(inplace) -- {times.format('1.000', '1.000', '0.000')}\n", encoding="utf-8")
    zero = "pipesim: error: layers[*].forward_s+backward_s=0.0: must be > 0 on some layer: a plan balances the " \
           "layers' compute\n"
    cases = [
        (("--profile", VGG, "--optimizer-state", "nan"),
         "pipesim: error: optimizer_state_multiplier=nan: must be a finite number >= 0\n"),
        (("--profile", _vgg_first_layer(tmp_path, drop_inputs=False)), zero),
        (("--profile", _vgg_first_layer(tmp_path, drop_inputs=True)), zero),
        (("--profile", str(graph), "--cost-model", "pipedream"),
         "pipesim: error: layers[2].inputs=(): the layers' inputs must join every layer into one graph "
         "(PipeDream's optimizer cuts a connected DAG); layer 2 (node3 ReLU(inplace)) is apart\n"),
    ]
    for args, expected in cases:
        done = pipesim("plan", *args, "--devices", "4", "--bandwidth", "10GB/s")
        assert (done.returncode, done.stderr) == (2, expected)


def test_simulate_plan_refuses_a_placement_off_the_devices_however_the_topology_is_given(tmp_path: Path) -> None:
    """--bandwidth builds a device per rank, as a topology file of 4 devices has them: device 99 is
    off both; two ranks on one device are refused as the plan is read."""
    plan, topology = tmp_path / "plan.json", tmp_path / "topology.json"
    base = {"schema": "pipesim.plan/1", "schedule": "1f1b", "num_stages": 4, "num_microbatches": 8}
    topology.write_text(json.dumps({"schema": "pipesim.topology/1", "devices": [{"name": f"d{i}"} for i in range(4)],
                                    "bandwidth_bytes_per_s": 1e9}))
    off = "pipesim: error: placement=99: stage 3 is placed on a device the topology lacks (4 devices)\n"
    plan.write_text(json.dumps({**base, "placement": [0, 1, 2, 99]}))
    for where in (("--bandwidth", "1GB/s"), ("--topology", str(topology))):
        done = pipesim("simulate", "--profile", VGG, "--plan", str(plan), *where, "--json")
        assert (done.returncode, done.stderr) == (2, off)
    plan.write_text(json.dumps({**base, "placement": [0, 0, 1, 2]}))
    done = pipesim("simulate", "--profile", VGG, "--plan", str(plan), "--bandwidth", "1GB/s", "--json")
    assert (done.returncode, done.stderr) == (2, f"pipesim: error: {plan}: placement[1]=0: device 0 already runs "
                                                 "stage 0: a device runs one rank (1 stage)\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--devices", "1000000000000"), "devices=1000000000000: must be from 1 to 1,024"),
        (("--devices", "0"), "devices=0: must be from 1 to 1,024"),
        (("--devices", "4", "--batch-size", "8"),
         "batch_size=8: applies to --planner 2bw only (PipeDream updates after every microbatch: it has no minibatch)"),
    ],
)
def test_plan_refuses_bad_options_in_one_line(args: tuple[str, ...], message: str, tmp_path: Path) -> None:
    """A device count past the bound (10**12 ran out of memory) and --batch-size, which PipeDream
    would ignore, are refused before any work; --out stays unwritten."""
    done = pipesim("plan", "--profile", VGG, "--bandwidth", "10GB/s", *args, "--out", str(tmp_path / "out"))
    assert (done.returncode, done.stderr, done.stdout) == (2, f"pipesim: error: {message}\n", "")
    assert list(tmp_path.iterdir()) == []
