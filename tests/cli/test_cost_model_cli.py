"""Issue 31's command-line contracts through the real entry point: device, cluster, simulate --model, model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipesim.spec.device import load_device
from pipesim.spec.transformer import forward_flops_per_token, preset

ROOT = Path(__file__).resolve().parents[2]


def pipesim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipesim", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=180)


def test_device_json_has_the_contract_keys() -> None:
    done = pipesim("device", "h100", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["name"] == "h100" and data["memory_bytes"] == 81559 * 2**20
    assert data["peak_flops"]["bf16"] == 989.4e12 and data["memory_bandwidth_bytes_per_s"] == 3.35e12
    shown = pipesim("device", "a100-80gb")
    assert shown.returncode == 0 and "sources:" in shown.stdout and "MAMF" in shown.stdout


def test_device_calibrate_fits_saved_measurements_into_a_file_device_reads(tmp_path: Path) -> None:
    out = tmp_path / "h200-refit.json"
    raw = ROOT / "benchmarks" / "data" / "h200-measurements-2026-11-28.json"
    done = pipesim("device", "calibrate", "--measurements", str(raw), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}" in done.stdout
    shown = pipesim("device", str(out), "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["matmul"] == load_device("h200").model_dump(mode="json")["matmul"]


def test_device_calibrate_writes_the_in_node_tier_fitted_to_saved_collectives(tmp_path: Path) -> None:
    # Saved H200 measurements plus collectives across 4 GPUs, timed as rings of a = 2 us a hop and B = 405 GB/s
    # (all-reduce 2 (n-1) a + 2 (n-1)/n S / B, reduce-scatter and all-gather half that): the cluster file is the
    # H200's usual dgx-h200 with NVLink's 450 GB/s at 0.9 in collectives and 2 us a hop.
    raw = json.loads((ROOT / "benchmarks" / "data" / "h200-measurements-2026-11-28.json").read_text())
    sizes = [2**power for power in range(10, 30, 2)]
    raw["collectives"] = {"schema": "pipesim.collective-measurements/1", "backend": "nccl", "world_size": 4,
                          "machine": {"date": "2026-11-28", "host": "test", "gpu": "NVIDIA H200"},
                          **{name: [{"bytes": size, "seconds": hops * 3 * 2e-6 + hops * 3 / 4 * size / 405e9}
                                    for size in sizes]
                             for name, hops in (("all_reduce", 2), ("reduce_scatter", 1), ("all_gather", 1))}}
    measured = tmp_path / "raw.json"
    measured.write_text(json.dumps(raw))
    cluster = tmp_path / "node.json"
    done = pipesim("device", "calibrate", "--measurements", str(measured), "--out", str(tmp_path / "d.json"),
                   "--cluster-out", str(cluster))
    assert done.returncode == 0, done.stderr
    assert f"wrote {cluster}" in done.stdout
    shown = json.loads(pipesim("cluster", str(cluster), "--json").stdout)
    nvlink = shown["tiers"][0]
    assert shown["name"] == "dgx-h200" and nvlink["bandwidth_bytes_per_s"] == 450e9
    assert nvlink["bus_efficiency"] == pytest.approx(0.9) and nvlink["latency_s"] == pytest.approx(2e-6)
    # Measurements without collectives cannot give a cluster: one line, exit 2, and no file.
    del raw["collectives"]
    measured.write_text(json.dumps(raw))
    refused = pipesim("device", "calibrate", "--measurements", str(measured), "--out", str(tmp_path / "e.json"),
                      "--cluster-out", str(tmp_path / "none.json"))
    assert refused.returncode == 2 and refused.stderr.startswith("pipesim: error: cluster_out=")
    assert len(refused.stderr.splitlines()) == 1 and not (tmp_path / "none.json").exists()


def test_simulate_model_reports_model_tflops_per_gpu_by_hand_arithmetic() -> None:
    args = ("simulate", "--model", "llama3-8b", "--device", "h100", "--tp", "2", "--dp", "2", "--stages", "2",
            "--global-batch", "16", "--microbatch-size", "1", "--seq-len", "1024", "--schedule", "1f1b", "--json")
    done = pipesim(*args)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    for key in ("iteration_time_s", "tokens_per_s", "mfu", "fits", "num_gpus", "model_tflops_per_gpu"):
        assert key in data
    gpus = 2 * 2 * 2
    assert data["num_gpus"] == gpus
    tokens_per_s = 16 * 1024 / data["iteration_time_s"]  # one global batch of 16 sequences of 1,024 tokens per step
    assert data["tokens_per_s"] == pytest.approx(tokens_per_s)
    flops_per_token = forward_flops_per_token(preset("llama3-8b"), 1024)
    # model FLOPs per step (3 x forward, no recomputation) / step time / GPUs / 1e12
    assert data["model_tflops_per_gpu"] == pytest.approx(3 * flops_per_token * 16 * 1024 / data["iteration_time_s"]
                                                         / gpus / 1e12)
    assert data["mfu"] == pytest.approx(data["model_tflops_per_gpu"] * 1e12 / 989.4e12)
    assert data["cluster"] == "dgx-h100" and data["device"] == "h100"


def test_the_cluster_flags_and_file_reach_the_data_parallel_reduction(tmp_path: Path) -> None:
    base = ("simulate", "--model", "llama2-7b", "--device", "a100-80gb", "--tp", "8", "--dp", "4", "--stages", "1",
            "--global-batch", "4", "--seq-len", "1024", "--schedule", "1f1b", "--json")
    default = json.loads(pipesim(*base).stdout)["iteration_time_s"]
    named = json.loads(pipesim(*base, "--cluster", "dgx-a100").stdout)["iteration_time_s"]
    slow = pipesim(*base, "--inter-node-bandwidth", "25Gbit/s", "--inter-node-latency", "20us")
    assert slow.returncode == 0, slow.stderr
    assert named == default < json.loads(slow.stdout)["iteration_time_s"]
    cluster = json.loads((ROOT / "pipesim" / "data" / "clusters" / "dgx-a100.json").read_text())
    cluster["tiers"][1]["bandwidth_bytes_per_s"] = 25e9 / 8
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(cluster))
    from_file = pipesim(*base, "--cluster", str(path))
    assert from_file.returncode == 0, from_file.stderr
    assert json.loads(from_file.stdout)["iteration_time_s"] > default


def test_a_pipeline_across_two_nodes_sends_between_them_on_the_network_and_inside_them_on_nvlink() -> None:
    """16 stages of one GPU on nodes of 8: the hop between the nodes is on the inter-node link, the
    others on the intra-node one; with all 8 stages in one node the inter-node link does not matter."""
    def step(stages: int, inter: str, intra: str = "450GB/s") -> tuple[float, dict[str, object]]:
        done = pipesim("simulate", "--model", "llama3-8b", "--device", "h100", "--stages", str(stages),
                       "--global-batch", "32", "--gpus-per-node", "8", "--intra-node-bandwidth", intra,
                       "--inter-node-bandwidth", inter, "--inter-node-latency", "5us", "--json")
        assert done.returncode == 0, done.stderr
        data = json.loads(done.stdout)
        return data["iteration_time_s"], data["run"]

    slow, run = step(16, "1Gbit/s")
    fast, _ = step(16, "400Gbit/s")
    # Each hop carries b s h = 8,192 x 4,096 x 2 bytes = 67 MB: about half a second at 1 Gbit/s.
    assert slow > fast + 0.5
    assert run["bandwidth_bytes_per_s"] == pytest.approx(1e9 / 8 * 0.92)  # the outer tier: dgx-h100's IB efficiency
    assert "14 hops on an inner tier" in str(run["topology"])
    assert step(8, "1Gbit/s")[0] == step(8, "400Gbit/s")[0]
    assert step(16, "400Gbit/s", intra="50GB/s")[0] > fast
    # --speeds (all 1 here) and --shared-nics keep each hop on its tier (they fell back to one link for
    # every hop, the fastest: the hop between the nodes on NVLink).
    ones = ",".join(["1"] * 16)
    for extra in (("--speeds", ones), ("--shared-nics",)):
        done = pipesim("simulate", "--model", "llama3-8b", "--device", "h100", "--stages", "16", "--global-batch", "32",
                       "--gpus-per-node", "8", "--intra-node-bandwidth", "450GB/s", "--inter-node-bandwidth",
                       "1Gbit/s", "--inter-node-latency", "5us", *extra, "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["iteration_time_s"] == pytest.approx(slow, rel=0.02)


def test_ranks_and_stages_per_rank_run_a_model_interleaved() -> None:
    done = pipesim("simulate", "--model", "gpt3-175b", "--device", "a100-80gb", "--tp", "8", "--ranks", "4",
                   "--stages-per-rank", "2", "--dp", "2", "--global-batch", "16", "--schedule", "interleaved-1f1b",
                   "--recompute-stages", "full", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["num_gpus"] == 8 * 4 * 2


def test_the_contract_command_without_schedule_runs_megatrons_schedule() -> None:
    """The issue's contract names no --schedule: a --model run takes 1F1B, interleaved with V > 1."""
    base = ("simulate", "--model", "llama3-8b", "--device", "h100", "--tp", "2", "--dp", "2", "--global-batch", "16",
            "--microbatch-size", "1", "--seq-len", "1024", "--json")
    layouts = ((("--stages", "2"), "1f1b"), (("--ranks", "2", "--stages-per-rank", "2"), "interleaved-1f1b"))
    for layout, schedule in layouts:
        default = pipesim(*base, *layout)
        assert default.returncode == 0, default.stderr
        named = pipesim(*base, *layout, "--schedule", schedule)
        data = json.loads(default.stdout)
        assert data["schedule"] == schedule
        assert data["iteration_time_s"] == json.loads(named.stdout)["iteration_time_s"]
    profile = pipesim("simulate", "--uniform", "layers=8,forward_ms=1,backward_ms=2", "--stages", "2",
                      "--microbatches", "4")
    assert profile.returncode == 2 and "Missing option '--schedule'" in profile.stderr


@pytest.mark.parametrize(("args", "field"), [
    (("--device", "h900"), "device='h900'"),
    (("--cluster", "nowhere.json"), "cluster"),
    (("--device", "a100-80gb", "--precision", "fp8"), "precision='fp8'"),
    (("--inter-node-bandwidth", "fast"), "inter_node_bandwidth"),
    (("--attention", "sparse"), "--attention"),
])
def test_bad_hardware_input_is_one_line_and_exit_2(args: tuple[str, ...], field: str) -> None:
    done = pipesim("simulate", "--model", "llama3-8b", "--stages", "1", "--microbatches", "1", "--schedule", "1f1b",
                   *args)
    assert done.returncode == 2, done.stderr
    assert field in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_tp_overlap_shortens_a_sequence_parallel_step_and_is_recorded_and_refused_without_it() -> None:
    args = ("simulate", "--model", "llama3-8b", "--device", "h100", "--tp", "2", "--sequence-parallel", "--stages",
            "2", "--schedule", "1f1b", "--global-batch", "16", "--json")
    plain, overlapped = pipesim(*args), pipesim(*args, "--tp-overlap")
    assert plain.returncode == 0 and overlapped.returncode == 0, plain.stderr + overlapped.stderr
    before, after = json.loads(plain.stdout), json.loads(overlapped.stdout)
    assert after["iteration_time_s"] < before["iteration_time_s"]
    assert after["run"]["model_run"]["tp_overlap"] is True and before["run"]["model_run"]["tp_overlap"] is False
    for refused in (pipesim(*[arg for arg in args if arg != "--sequence-parallel"], "--tp-overlap"),
                    pipesim("simulate", "--uniform", "layers=4,forward_ms=1,backward_ms=2", "--stages", "2",
                            "--schedule", "1f1b", "--microbatches", "4", "--tp-overlap")):
        assert refused.returncode == 2 and "tp_overlap=True" in refused.stderr and "Traceback" not in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1


def test_model_takes_a_name_through_model_and_lists_a_layers_ops() -> None:
    done = pipesim("model", "--model", "llama3-8b", "--device", "h200", "--ops")
    assert done.returncode == 0, done.stderr
    for name in ("qkv", "attention", "fc1", "swiglu", "fc2", "norm"):
        assert name in done.stdout
    data = json.loads(pipesim("model", "--model", "llama3-8b", "--json").stdout)
    assert {op["name"] for op in data["layer_ops"]} >= {"qkv", "attention", "projection", "fc1", "fc2"}


def test_a_model_runs_outputs_name_the_model_device_and_cluster_with_their_hashes(tmp_path: Path) -> None:
    """Issue 36 item 1: the run record of a --model run names its inputs, not "uniform:None"."""
    import hashlib

    from pipesim.spec.model_files import model_to_json

    done = pipesim("simulate", "--model", "llama3-8b", "--device", "h100", "--stages", "2", "--global-batch", "8",
                   "--seq-len", "1024", "--schedule", "1f1b", "--json")
    run = json.loads(done.stdout)["run"]
    preset_json = model_to_json(preset("llama3-8b"))
    assert run["profile"] == {"name": "llama3-8b (preset)",
                              "sha256": hashlib.sha256(preset_json.encode()).hexdigest()}
    shipped = (ROOT / "pipesim" / "data" / "devices" / "h100.json").read_bytes()
    assert run["model_run"]["device"] == {"name": "h100 (shipped)", "sha256": hashlib.sha256(shipped).hexdigest()}
    assert run["model_run"]["cluster"]["name"] == "dgx-h100 (shipped)"
    for key, value in (("seq_len", 1024), ("microbatch_size", 1), ("global_batch", 8), ("tp", 1), ("pp", 2),
                       ("dp", 1), ("recompute", "none"), ("sequence_parallel", False), ("precision", "bf16"),
                       ("optimizer_step_bytes_per_parameter", 34.0), ("optimizer_state_bytes_per_parameter", 12.0)):
        assert run["model_run"][key] == value, key
    model_file = tmp_path / "model.json"
    model_file.write_text(preset_json)
    again = json.loads(pipesim("simulate", "--model", str(model_file), "--stages", "2", "--global-batch", "8",
                               "--seq-len", "1024", "--schedule", "1f1b", "--json").stdout)["run"]
    assert again["profile"] == {"name": "model.json", "sha256": hashlib.sha256(preset_json.encode()).hexdigest()}
    searched = json.loads(pipesim("search", "--model", str(model_file), "--device", "a100-80gb", "--gpus", "2",
                                  "--global-batch", "4", "--seq-len", "1024", "--json", "--out",
                                  str(tmp_path / "s")).stdout)
    assert searched["run"]["model"]["name"] == "model.json"
    assert searched["run"]["device"]["name"] == "a100-80gb (shipped)" and searched["run"]["global_batch"] == 4
    assert json.loads((tmp_path / "s" / "run.json").read_text()) == searched["run"]


def test_the_python_capacity_study_gives_what_simulate_gives() -> None:
    """Issue 36 item 9: the capacity study from Python (model, device, degrees, budget) is the CLI's."""
    import pipesim

    result = pipesim.simulate_training("llama3-8b", device="h100", tp=2, pp=2, dp=2, global_batch=16, seq_len=1024,
                                       memory_bytes=40e9)
    data = json.loads(pipesim_cli := pipesim_json("--model", "llama3-8b", "--device", "h100", "--tp", "2", "--dp", "2",
                                                   "--stages", "2", "--global-batch", "16", "--seq-len", "1024",
                                                   "--memory", "40GB", "--schedule", "1f1b"))
    assert pipesim_cli
    assert result.tokens_per_s == pytest.approx(data["tokens_per_s"], rel=1e-12)
    assert result.model_tflops_per_gpu == pytest.approx(data["model_tflops_per_gpu"], rel=1e-12)
    assert result.fits is data["fits"] and result.num_gpus == data["num_gpus"] == 8
    assert repr(result).startswith("<TrainingResult 8 GPUs") and "\n" not in repr(result)


def pipesim_json(*args: str) -> str:
    done = pipesim("simulate", *args, "--json")
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize(("memory", "budget_bytes", "shown"), [
    (None, 81559 * 2**20, "fits in 81,559 MiB (h100's memory) per device"),  # what the H100's driver reports
    ("80GB", 80e9, "fits in 80GB per device"),
    ("80GiB", 80 * 2**30, "fits in 80GiB per device"),
])
def test_the_budget_is_the_devices_real_memory_and_verdicts_keep_the_unit_given(
        memory: str | None, budget_bytes: float, shown: str) -> None:
    """Issue 36 item 4."""
    args = ("simulate", "--model", "llama3-8b", "--device", "h100", "--stages", "2", "--global-batch", "8",
            "--seq-len", "1024", "--schedule", "1f1b", *(("--memory", memory) if memory else ()))
    data = json.loads(pipesim(*args, "--json").stdout)
    assert data["memory_budget_bytes"] == budget_bytes
    printed = pipesim(*args).stdout
    assert shown in printed
    headroom = min(data["device_memory_headroom_bytes"])
    unit = {"80GB": ("GB", 1e9), "80GiB": ("GiB", 2**30)}.get(memory or "", ("MiB", 2**20))
    value = headroom / unit[1]
    assert (f"least headroom {value:,.0f} {unit[0]}" if value >= 1000 else f"least headroom {value:,.2f} {unit[0]}") \
        in printed


def test_a_model_run_without_its_batch_names_global_batch() -> None:
    done = pipesim("simulate", "--model", "llama3-8b", "--stages", "4")
    assert done.returncode == 2
    assert "Missing option '--microbatches' (or --global-batch G, which sets it with --model)" in done.stderr


def test_the_report_of_a_pipeline_across_nodes_says_its_link_is_the_one_between_them(tmp_path: Path) -> None:
    done = pipesim("simulate", "--model", "llama3-8b", "--device", "h100", "--stages", "16", "--global-batch", "32",
                   "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    page = pipesim("report", str(tmp_path / "run"), "--out", str(tmp_path / "r.html"))
    assert page.returncode == 0, page.stderr
    text = (tmp_path / "r.html").read_text()
    assert "46 GB/s, 5 us between nodes" in text and "14 hops on an inner tier" in text
