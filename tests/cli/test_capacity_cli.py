"""The capacity-study commands through their real entry point: pipesim model, simulate --model, search."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipesim.schedule.registry import SCHEDULES

ROOT = Path(__file__).resolve().parents[2]


def pipesim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipesim", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def test_model_json_has_the_contract_keys_and_writes_a_loadable_profile(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    done = pipesim("model", "--preset", "llama3-70b", "--device", "h100", "--tp", "8", "--recompute", "selective",
                   "--out", str(out), "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["parameters"] == 70_553_706_496 and data["layers"] == 80
    assert isinstance(data["forward_flops_per_token"], float)
    import pipesim as api

    profile = api.load_profile(out)
    assert profile.num_layers == 82 and profile.layers[0].name == "embedding"


@pytest.mark.parametrize(("args", "field"), [(("--preset", "gpt5"), "gpt5"), (("--preset", "llama3-8b", "--tp", "3"), "tp")])
def test_model_bad_input_is_one_line_and_exit_2(args: tuple[str, ...], field: str) -> None:
    done = pipesim("model", *args)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and field in done.stderr


def test_model_and_search_refuse_a_zero_size_and_a_bad_out_path_in_one_line(tmp_path: Path) -> None:
    """--microbatch-size 0 and --seq-len 0 break the rule -1 breaks (not the default); --out is
    checked before any work, as the other commands check it, and an existing file is kept."""
    (tmp_path / "afile").write_text("keep")
    (tmp_path / "folder.json").mkdir()
    search = ("search", "--model", "llama3-8b", "--device", "h100", "--gpus", "8", "--global-batch", "16")
    cases = [
        (("model", "--preset", "llama3-8b", "--microbatch-size", "0"), "microbatch_size=0: must be >= 1"),
        ((*search, "--seq-len", "0"), "seq_len=0: must be >= 1"),
        (("model", "--preset", "llama3-8b", "--out", str(tmp_path)), f"out='{tmp_path}': must end in .json"),
        (("model", "--preset", "llama3-8b", "--out", str(tmp_path / "profile.csv")),
         f"out='{tmp_path}/profile.csv': must end in .json"),
        (("model", "--preset", "llama3-8b", "--out", str(tmp_path / "folder.json")),
         f"out='{tmp_path}/folder.json': is a folder, expected a file name"),
        (("model", "--preset", "llama3-8b", "--out", str(tmp_path / "afile" / "x.json")),
         f"out='{tmp_path}/afile/x.json': cannot be written: {tmp_path}/afile is a file, not a folder"),
        ((*search, "--out", str(tmp_path / "afile")), f"out='{tmp_path}/afile': must be a folder, but it is a file"),
        ((*search, "--out", str(tmp_path / "afile" / "sub")),
         f"out='{tmp_path}/afile/sub': cannot be written: {tmp_path}/afile is a file, not a folder"),
    ]
    for args, message in cases:
        done = pipesim(*args)
        assert (done.returncode, done.stderr) == (2, f"pipesim: error: {message}\n")
    assert (tmp_path / "afile").read_text() == "keep"


SEARCH = ("search", "--model", "llama3-8b", "--device", "h100", "--global-batch", "16")
SIMULATE_MODEL = ("--model", "llama3-8b", "--stages", "2", "--microbatches", "2", "--schedule", "1f1b")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((*SEARCH, "--gpus", "1000000000000"), "gpus=1000000000000: must be <= 1,000,000"),
        ((*SEARCH, "--gpus", "8", "--workers", "2", "--scheduler", "tcp://127.0.0.1:1"),
         "workers=2: give either --workers (embedded cluster) or --scheduler, not both"),
        (("model", "--preset", "llama3-8b", "--efficiency", "0.3", "--calibrate", "measured.json"),
         "efficiency=0.3: give either --efficiency or --calibrate (which sets it), not both"),
        (("simulate", *SIMULATE_MODEL, "--efficiency", "0.3", "--calibrate", "measured.json"),
         "efficiency=0.3: give either --efficiency or --calibrate (which sets it), not both"),
        (("model", "--preset", "llama3-8b", "--sequence-parallel"),
         "sequence_parallel=True: needs --tp T > 1 (it splits the activations over the tensor-parallel ranks)"),
        (("simulate", *SIMULATE_MODEL, "--zero", "1"),
         "zero=1: needs --dp D > 1 (ZeRO-1 shards the optimizer state over the data-parallel pipelines)"),
        (("simulate", *SIMULATE_MODEL, "--dp-overlap"),
         "dp_overlap=True: needs --dp D > 1 (it overlaps the data-parallel reduction with the last backward)"),
    ],
)
def test_capacity_commands_refuse_bad_options_in_one_line(args: tuple[str, ...], message: str) -> None:
    """Refused before any work: a huge count is not enumerated, an option that would be ignored is named."""
    done = pipesim(*args)
    assert (done.returncode, done.stderr, done.stdout) == (2, f"pipesim: error: {message}\n", "")


def simulate_json(*args: str) -> dict[str, object]:
    done = pipesim("simulate", *args, "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    data.pop("engine_wall_s", None)
    data.pop("startup_s", None)
    data.pop("run", None)  # the inputs record, command line included
    for run in data.get("runs", []):
        run.pop("engine_wall_s")
        run.pop("startup_s")
        run.pop("run")
    return data  # type: ignore[no-any-return]


UNIFORM = ("--uniform", "layers=4,forward_ms=4,backward_ms=8,activation_bytes=9e8,param_bytes=1e9")


def test_dp_1_tp_1_reproduce_todays_output_exactly() -> None:
    plain = simulate_json(*UNIFORM, "--stages", "2", "--microbatches", "4", "--schedule", "1f1b", "--bandwidth", "10GB/s")
    flagged = simulate_json(*UNIFORM, "--stages", "2", "--microbatches", "4", "--schedule", "1f1b", "--bandwidth",
                            "10GB/s", "--dp", "1", "--tp", "1")
    assert flagged == plain


def node_cluster(path: Path, gpus_per_node: int) -> str:
    """A cluster file: nodes of ``gpus_per_node`` on 900 GB/s, 50 GB/s NICs, every collective at the link's
    full rate, no latency: the arithmetic below is alpha-free."""
    path.write_text(json.dumps({"schema": "pipesim.cluster/1", "name": "test", "tiers": [
        {"name": "nvlink", "gpus": gpus_per_node, "bandwidth_bytes_per_s": 900e9, "latency_s": 0},
        {"name": "nic", "gpus": None, "bandwidth_bytes_per_s": 50e9, "latency_s": 0}]}))
    return str(path)


def test_tp_and_dp_reproduce_a_hand_computed_iteration_time(tmp_path: Path) -> None:
    # Two layers, one a stage, 1F1B, p = 2, m = 2, free pipeline links; nodes of 2 GPUs, TP = 2 inside one.
    # TP = 2: F = 4/2 ms + 2 all-reduces of 9e8 bytes over NVLink, each 2 (2-1)/2 x 9e8 / 900e9 s = 1 ms -> 4 ms;
    #         B = 8/2 ms + 2 ms = 6 ms; weights per rank 1e9 / 2 = 5e8 bytes.
    # DP = 2: the two replicas are a node apart; each update all-reduces 5e8 bytes over the 50 GB/s NIC:
    #         2 (2-1)/2 x 5e8 / 50e9 s = 10 ms.
    # 1F1B makespan (m + p - 1)(F + B) = 3 x 10 ms, then stage 0's update: 30 + 10 = 40 ms.
    data = simulate_json("--uniform", "layers=2,forward_ms=4,backward_ms=8,activation_bytes=9e8,param_bytes=1e9",
                         "--stages", "2", "--microbatches", "2", "--schedule", "1f1b", "--tp", "2", "--dp", "2",
                         "--cluster", node_cluster(tmp_path / "c.json", 2))
    assert data["iteration_time_s"] == pytest.approx(0.040, rel=1e-12)
    assert (data["tp"], data["dp"]) == (2, 2)
    assert data["global_throughput_samples_per_s"] == pytest.approx(2 * 2 / 0.040, rel=1e-12)


def test_dp_overlap_leaves_the_update_only_the_all_reduce_tail(tmp_path: Path) -> None:
    # Four layers, two a stage, 1F1B, p = 2, m = 2, free pipeline links: F = 2 ms, B = 4 ms a stage,
    # makespan (m + p - 1)(F + B) = 18 ms. DP = 2 across nodes of one GPU all-reduces 1e8 bytes a layer
    # over the 50 GB/s NIC: 2 (2-1)/2 x 1e8 / 50e9 s = 2 ms a layer.
    # Not overlapped: stage 0's update after its last B: 18 + 2 x 2 = 22 ms.
    # Overlapped: in stage 0's last B (14-18 ms) layer 1's gradient is ready at 16 and all-reduced
    # 16-18, layer 0's at 18, all-reduced 18-20: the update waits 2 ms, 20 ms in all.
    args = ("--uniform", "layers=4,forward_ms=1,backward_ms=2,activation_bytes=0,param_bytes=1e8", "--stages", "2",
            "--microbatches", "2", "--schedule", "1f1b", "--dp", "2", "--cluster", node_cluster(tmp_path / "c.json", 1))
    assert simulate_json(*args)["iteration_time_s"] == pytest.approx(0.022, rel=1e-12)
    assert simulate_json(*args, "--dp-overlap")["iteration_time_s"] == pytest.approx(0.020, rel=1e-12)


def test_pp_in_node_sends_the_tensor_parallel_all_reduces_over_the_nic(tmp_path: Path) -> None:
    # The hand-computed TP/DP case above with a pipeline's two stages inside each 2-GPU node: TP's ranks
    # are a node apart, each all-reduce of 9e8 bytes takes 2 (2-1)/2 x 9e8 / 50e9 s = 18 ms over the NIC
    # instead of 1 ms over NVLink. F = 2 + 2 x 18 = 38 ms, B = 4 + 36 = 40 ms; 1F1B: 3 x 78 ms, then the
    # 10 ms update (DP 4 GPUs apart, over the NIC): 244 ms.
    cluster = node_cluster(tmp_path / "c.json", 2)
    args = ("--uniform", "layers=2,forward_ms=4,backward_ms=8,activation_bytes=9e8,param_bytes=1e9", "--stages", "2",
            "--microbatches", "2", "--schedule", "1f1b", "--tp", "2", "--dp", "2", "--cluster", cluster)
    assert simulate_json(*args, "--placement", "pp-in-node")["iteration_time_s"] == pytest.approx(0.244, rel=1e-12)
    assert simulate_json(*args, "--placement", "tp-in-node") == simulate_json(*args)


def test_memory_budget_gives_fits_and_headroom_per_device() -> None:
    data = simulate_json(*UNIFORM, "--stages", "2", "--microbatches", "4", "--schedule", "gpipe", "--memory", "5GB")
    peaks = data["device_peak_memory_bytes"]
    assert data["device_memory_headroom_bytes"] == [5e9 - peak for peak in peaks]  # type: ignore[union-attr]
    assert data["fits"] is (max(peaks) <= 5e9)  # type: ignore[arg-type]
    tight = simulate_json(*UNIFORM, "--stages", "2", "--microbatches", "4", "--schedule", "gpipe", "--memory", "1GB")
    assert tight["fits"] is False and min(tight["device_memory_headroom_bytes"]) < 0  # type: ignore[arg-type]


def test_global_batch_sets_microbatches_and_an_indivisible_one_is_refused() -> None:
    data = simulate_json(*UNIFORM, "--stages", "2", "--global-batch", "16", "--dp", "2", "--schedule", "1f1b")
    assert data["num_microbatches"] == 8
    done = pipesim("simulate", *UNIFORM, "--stages", "2", "--global-batch", "15", "--dp", "2", "--schedule", "1f1b")
    assert done.returncode == 2 and "global_batch=15" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_model_in_simulate_reports_the_device_budget_tokens_and_mfu() -> None:
    data = simulate_json("--model", "llama3-8b", "--device", "h100", "--stages", "4", "--global-batch", "32",
                         "--dp", "2", "--seq-len", "2048", "--recompute-stages", "selective", "--schedule", "1f1b")
    # the default budget is the memory the H100's driver reports: 81,559 MiB
    assert data["memory_budget_bytes"] == 81559 * 2**20 and isinstance(data["fits"], bool)
    assert data["num_gpus"] == 8 and data["tokens_per_s"] == pytest.approx(
        data["throughput_samples_per_s"] * 2 * 2048, rel=1e-12)  # type: ignore[operator]
    assert 0 < data["mfu"] < 0.6  # type: ignore[operator]


def test_schedules_side_by_side_equal_their_single_runs_and_accept_torch_names(tmp_path: Path) -> None:
    case = (*UNIFORM, "--ranks", "2", "--microbatches", "4", "--memory", "8GB")
    both = simulate_json(*case, "--schedule", "Schedule1F1B,ZBVZeroBubble", "--out", str(tmp_path))
    assert [run["schedule"] for run in both["runs"]] == ["1f1b", "zbv"]  # type: ignore[index,union-attr]
    single = simulate_json(*case, "--schedule", "1f1b")
    assert both["runs"][0] == single  # type: ignore[index]
    assert (tmp_path / "timelines.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "comparison.json").read_text())["runs"][1]["num_stages"] == 4


@pytest.mark.slow
def test_all_schedules_side_by_side_run_or_say_why_not(tmp_path: Path) -> None:
    every = simulate_json(*UNIFORM, "--ranks", "2", "--microbatches", "4", "--memory", "8GB", "--schedule", "all",
                          "--out", str(tmp_path))
    runs, skipped = every["runs"], every["skipped"]
    assert len(runs) + len(skipped) == len(SCHEDULES) and all(item["reason"] for item in skipped)  # type: ignore[arg-type,union-attr]
    assert all(isinstance(run["fits"], bool) for run in runs)  # type: ignore[union-attr,index]
    assert (tmp_path / "timelines.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_search_best_fits_and_is_what_simulate_gives_for_it(tmp_path: Path) -> None:
    done = pipesim("search", "--model", "llama3-8b", "--device", "a100-40gb", "--gpus", "8", "--global-batch", "16",
                   "--seq-len", "2048", "--json", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    best = data["best"]
    assert set(best) == {"tp", "pp", "dp", "microbatch_size", "schedule", "stages_per_rank", "recompute",
                         "tokens_per_s", "mfu", "peak_memory_bytes", "fits", "sequence_parallel", "step_breakdown_s",
                         "cp", "ep", "zero"}
    assert best["fits"] and best["peak_memory_bytes"] <= 40 * 2**30
    assert best["tp"] * best["cp"] * best["pp"] * best["dp"] == 8
    assert set(best["step_breakdown_s"]) == {"compute", "bubble", "tp_comm", "dp_comm", "pp_comm", "optimizer"}
    candidates = data["candidates"]
    assert sum(best["step_breakdown_s"].values()) == pytest.approx(candidates[0]["iteration_time_s"], rel=1e-9)
    assert all(row["reason"] for row in candidates)
    assert max(row["tokens_per_s"] for row in candidates if row["fits"]) == best["tokens_per_s"]
    assert {row["status"] for row in candidates} <= {"simulated", "pruned", "dropped"}
    counts = [data[key] for key in ("num_candidates", "num_simulated", "num_pruned_by_memory", "num_pruned_by_bound")]
    assert counts[0] == sum(counts[1:]) + sum(row["status"] == "dropped" and row["partition"] != "" for row in candidates)
    assert counts[1] == sum(row["status"] == "simulated" for row in candidates) < counts[0] / 20
    # The best row is a simulation: simulate gives the same numbers for the same configuration.
    assert candidates[0]["status"] == "simulated" and candidates[0]["tokens_per_s"] == best["tokens_per_s"]
    again = simulate_json("--model", "llama3-8b", "--device", "a100-40gb", "--seq-len", "2048",
                          "--partition", candidates[0]["partition"],
                          "--tp", str(best["tp"]), "--ranks", str(best["pp"]),
                          "--stages-per-rank", str(best["stages_per_rank"]), "--dp", str(best["dp"]),
                          "--cp", str(best["cp"]), "--zero", str(best["zero"]),
                          *(["--sequence-parallel"] if best["sequence_parallel"] else []),
                          "--microbatch-size", str(best["microbatch_size"]), "--global-batch", "16",
                          "--recompute-stages", best["recompute"], "--schedule", best["schedule"])
    assert again["tokens_per_s"] == pytest.approx(best["tokens_per_s"], rel=1e-12)
    assert max(again["device_peak_memory_bytes"]) == best["peak_memory_bytes"]  # type: ignore[arg-type]
    assert (tmp_path / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "candidates.csv").read_text().startswith("tp,pp,dp,")


def test_model_calibrate_takes_the_efficiency_of_a_measured_profile(tmp_path: Path) -> None:
    measured = tmp_path / "measured.json"
    first = pipesim("model", "--preset", "llama2-7b", "--device", "a100-80gb", "--efficiency", "0.42", "--out",
                    str(measured), "--json")
    assert first.returncode == 0, first.stderr
    again = pipesim("model", "--preset", "llama2-7b", "--device", "a100-80gb", "--calibrate", str(measured), "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["layer_forward_s"] == pytest.approx(json.loads(first.stdout)["layer_forward_s"],
                                                                        rel=1e-9)
    # times measured at one microbatch size do not calibrate another (b = 2 read as efficiency 1)
    other = pipesim("model", "--preset", "llama2-7b", "--device", "a100-80gb", "--calibrate", str(measured),
                    "--microbatch-size", "2")
    assert (other.returncode, other.stderr) == (2, "pipesim: error: microbatch_size=2: must equal the calibration "
                                                   "profile's (1): its times were measured at that size\n")


SMALL_SEARCH = ("search", "--model", "llama3-8b", "--device", "a100-40gb", "--gpus", "8", "--global-batch", "16",
                "--seq-len", "2048", "--json")


def test_search_progress_is_a_line_at_every_tenth_off_a_terminal() -> None:
    done = pipesim(*SMALL_SEARCH, "--progress")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    total = int(re.match(r"search \d+/(\d+) ", lines[-1]).group(1))  # type: ignore[union-attr]
    counts = [int(re.match(rf"search (\d+)/{total} ", line).group(1)) for line in lines]  # type: ignore[union-attr]
    assert 2 <= len(lines) <= 11 and counts == sorted(set(counts)), done.stderr
    assert re.fullmatch(rf"search {total}/{total} candidates [\d.]+ candidates/s elapsed \d+:\d\d:\d\d · 0:00:00 left",
                        lines[-1]), lines[-1]


@pytest.mark.slow
def test_search_on_a_local_dask_cluster_gives_what_one_process_gives() -> None:
    alone = pipesim(*SMALL_SEARCH)
    on_dask = pipesim(*SMALL_SEARCH, "--workers", "2")
    assert alone.returncode == 0 and on_dask.returncode == 0, on_dask.stderr
    first, second = json.loads(alone.stdout), json.loads(on_dask.stdout)
    assert first.pop("run")["command"] != second.pop("run")["command"]  # the record names each command as typed
    assert first == second
    both = pipesim(*SMALL_SEARCH, "--workers", "2", "--scheduler", "tcp://127.0.0.1:1")
    assert both.returncode == 2 and "either --workers" in both.stderr


def test_search_with_tp_overlap_ranks_what_simulate_with_tp_overlap_gives() -> None:
    args = ("search", "--model", "llama3-8b", "--device", "a100-40gb", "--gpus", "8", "--global-batch", "16",
            "--seq-len", "2048", "--json")
    plain, overlapped = (pipesim(*args, *extra) for extra in ((), ("--tp-overlap",)))
    assert plain.returncode == 0 and overlapped.returncode == 0, plain.stderr + overlapped.stderr
    data = json.loads(overlapped.stdout)
    assert data["run"]["tp_overlap"] is True
    # The first simulated candidate with sequence parallelism over TP: simulate --tp-overlap gives its numbers,
    # and the search without the overlap gave the same configuration fewer tokens/s.
    row = next(row for row in data["candidates"] if row["status"] == "simulated" and row["sequence_parallel"]
               and row["tp"] > 1)
    again = simulate_json("--model", "llama3-8b", "--device", "a100-40gb", "--seq-len", "2048",
                          "--partition", row["partition"], "--tp", str(row["tp"]), "--ranks", str(row["pp"]),
                          "--stages-per-rank", str(row["stages_per_rank"]), "--dp", str(row["dp"]),
                          "--cp", str(row["cp"]), "--zero", str(row["zero"]), "--sequence-parallel", "--tp-overlap",
                          "--microbatch-size", str(row["microbatch_size"]), "--global-batch", "16",
                          "--recompute-stages", row["recompute"], "--schedule", row["schedule"])
    assert again["tokens_per_s"] == pytest.approx(row["tokens_per_s"], rel=1e-12)
    keys = ("tp", "pp", "dp", "cp", "zero", "microbatch_size", "schedule", "stages_per_rank", "recompute",
            "sequence_parallel")
    same = [other for other in json.loads(plain.stdout)["candidates"]
            if all(other[key] == row[key] for key in keys) and other["status"] == "simulated"]
    assert same and all(other["tokens_per_s"] < row["tokens_per_s"] for other in same)


def test_search_in_fp8_ranks_what_simulate_in_fp8_gives_and_refuses_a_card_without_it() -> None:
    args = ("search", "--model", "llama3-8b", "--device", "h100", "--gpus", "8", "--global-batch", "16",
            "--seq-len", "2048", "--json")
    plain, fp8 = (pipesim(*args, *extra) for extra in ((), ("--precision", "fp8")))
    assert plain.returncode == 0 and fp8.returncode == 0, plain.stderr + fp8.stderr
    data = json.loads(fp8.stdout)
    assert data["run"]["precision"] == "fp8" and json.loads(plain.stdout)["run"]["precision"] == "bf16"
    row = next(row for row in data["candidates"] if row["status"] == "simulated")
    again = simulate_json("--model", "llama3-8b", "--device", "h100", "--seq-len", "2048", "--precision", "fp8",
                          "--partition", row["partition"], "--tp", str(row["tp"]), "--ranks", str(row["pp"]),
                          "--stages-per-rank", str(row["stages_per_rank"]), "--dp", str(row["dp"]),
                          "--cp", str(row["cp"]), "--zero", str(row["zero"]),
                          *(("--sequence-parallel",) if row["sequence_parallel"] else ()),
                          "--microbatch-size", str(row["microbatch_size"]), "--global-batch", "16",
                          "--recompute-stages", row["recompute"], "--schedule", row["schedule"])
    assert again["tokens_per_s"] == pytest.approx(row["tokens_per_s"], rel=1e-12)
    assert again["mfu"] == pytest.approx(row["mfu"], rel=1e-12)  # both over the fp8 peak
    refused = pipesim("search", "--model", "llama3-8b", "--device", "a100-80gb", "--gpus", "8", "--global-batch", "16",
                      "--precision", "fp8")
    assert refused.returncode == 2 and refused.stderr.startswith("pipesim: error: precision='fp8'")
    assert len(refused.stderr.splitlines()) == 1
