"""Context and expert parallelism and ZeRO-2/3 through the real entry point: contracts, refusals, unchanged results."""

from __future__ import annotations

import json

import pytest

from tests.support.cli_runner import ROOT, pipesim

MIXTRAL = str(ROOT / "tests" / "data" / "hf_configs" / "Mixtral-8x7B-v0.1" / "config.json")
GOLDEN = ROOT / "tests" / "golden" / "cost_model_before_parallelism.json"


def simulate_json(*args: str) -> dict[str, object]:
    done = pipesim("simulate", *args, "--json")
    assert done.returncode == 0, done.stderr
    data: dict[str, object] = json.loads(done.stdout)
    return data


MOE_RUN = ("--model", MIXTRAL, "--seq-len", "1024", "--tp", "2", "--ranks", "2", "--schedule", "1f1b",
           "--microbatches", "4", "--dp", "2", "--cp", "2", "--ep", "4")


def test_simulate_json_adds_cp_ep_zero_and_counts_every_gpu() -> None:
    data = simulate_json(*MOE_RUN, "--zero", "3")
    assert (data["cp"], data["ep"], data["zero"], data["tp"], data["dp"]) == (2, 4, 3, 2, 2)
    assert data["num_gpus"] == 2 * 2 * 2 * 2  # tp x cp x pp x dp
    breakdowns = data["device_peak_breakdown_bytes"]
    assert isinstance(breakdowns, list) and len(breakdowns) == 2
    for breakdown in breakdowns:
        assert set(breakdown) == {"weights", "gradients", "optimizer", "activations", "working"}
    assert [sum(b.values()) for b in breakdowns] == pytest.approx(data["device_peak_memory_bytes"], rel=1e-12)
    # Full recomputation: each backward re-creates its stage's layers, held while it runs (working).
    full = simulate_json(*MOE_RUN, "--zero", "3", "--recompute-stages", "full")["device_peak_breakdown_bytes"]
    assert all(b["working"] > 0 for b in full) and all(b["working"] == 0 for b in breakdowns)
    run = data["run"]
    assert isinstance(run, dict)
    record = run["model_run"]
    assert (record["cp"], record["ep"], record["zero"], record["fsdp"]) == (2, 4, 3, False)


def test_fsdp_is_zero3_by_its_pytorch_name() -> None:
    zero3, fsdp = simulate_json(*MOE_RUN, "--zero", "3"), simulate_json(*MOE_RUN, "--fsdp")
    for key in ("iteration_time_s", "device_peak_memory_bytes", "device_peak_breakdown_bytes", "zero"):
        assert zero3[key] == fsdp[key]


def test_sharding_lowers_each_kind_it_splits() -> None:
    # Mixtral on 16 GPUs (TP 2, PP 2), D = DP x CP = 4, EP 2: the experts' own data-parallel group is 2
    # wide, so each ZeRO stage splits one more kind (with EP 4 it would be 1 wide, and ZeRO-3's gathered
    # layers would outweigh what it splits of the attention).
    run = [*MOE_RUN[:-1], "2"]
    held = [simulate_json(*run, "--zero", str(zero))["device_peak_breakdown_bytes"][0]  # type: ignore[index]
            for zero in (0, 1, 2, 3)]
    assert held[1]["optimizer"] < held[0]["optimizer"] and held[1]["gradients"] == held[0]["gradients"]
    assert held[2]["gradients"] < held[1]["gradients"] and held[2]["weights"] == held[1]["weights"]
    assert held[3]["weights"] < held[2]["weights"]


@pytest.mark.parametrize(("args", "message"), [
    (("--model", "llama3-8b", "--cp", "3"), "cp=3: must split the sequence (8192) into 2 x cp = 6 equal chunks"),
    (("--model", MIXTRAL, "--ep", "3", "--dp", "6"), "ep=3: must divide the routed experts (8)"),
    (("--model", MIXTRAL, "--ep", "4", "--dp", "2"), "ep=4: must divide dp x cp (2 x 1 = 2)"),
    (("--model", "llama3-8b", "--ep", "2", "--dp", "2"), "ep=2: needs a mixture of experts"),
    (("--model", "llama3-8b", "--tp", "3"), "tp=3: must divide the KV heads (8)"),
    (("--model", "llama3-8b", "--dp", "2", "--fsdp", "--zero", "1"), "fsdp=True: is ZeRO-3"),
    (("--model", "llama3-8b", "--zero", "2"), "zero=2: needs --dp D > 1 (ZeRO-2 shards"),
    (("--model", "llama3-8b", "--dp", "2", "--zero", "2", "--optimizer-state", "2"),
     "optimizer_state=2.0: is set by the model under --zero 2"),
    (("--uniform", "layers=4,forward_ms=1,backward_ms=2", "--cp", "2"), "cp=2: applies to --model only"),
    (("--uniform", "layers=4,forward_ms=1,backward_ms=2", "--dp", "2", "--zero", "3"),
     "zero=3: applies to --model only"),
])
def test_a_degree_that_does_not_divide_what_it_splits_is_one_line_and_exit_2(args: tuple[str, ...],
                                                                             message: str) -> None:
    done = pipesim("simulate", *args, "--stages", "2", "--microbatches", "4", "--schedule", "1f1b")
    assert done.returncode == 2, done.stdout
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"pipesim: error: {message}"), done.stderr


def test_model_json_of_an_moe_config_adds_its_active_parameters() -> None:
    done = pipesim("model", "--model", MIXTRAL, "--seq-len", "4096", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["active_parameters_per_token"] == 12_879_925_248 and data["parameters"] == 46_702_792_704
    dense = json.loads(pipesim("model", "--preset", "llama3-8b", "--json").stdout)
    assert "active_parameters_per_token" not in dense


def test_model_text_of_a_config_file_states_a_published_size_only_where_there_is_one() -> None:
    qwen3 = str(ROOT / "tests" / "data" / "hf_configs" / "Qwen3-30B-A3B" / "config.json")
    first = pipesim("model", "--model", qwen3, "--seq-len", "4096").stdout.splitlines()[0]
    assert first.startswith("Qwen3-30B-A3B: 30.532 B parameters (128 experts, top-8: 3.353 B active per token), 48 "
                            "layers"), first
    assert "published" not in first
    preset = pipesim("model", "--preset", "llama3-8b").stdout.splitlines()[0]
    assert preset.startswith("llama3-8b: 8.030 B parameters (published 8.03 B), 32 layers"), preset


@pytest.mark.parametrize("index", range(4))
def test_cp1_ep1_and_zero_0_or_1_give_the_cost_models_results_bit_for_bit(index: int) -> None:
    # The outputs main gave before this work (tests/golden/cost_model_before_parallelism.json).
    golden = json.loads(GOLDEN.read_text())["runs"][index]
    args = [arg for arg in golden["args"] if arg != "--json"]
    if "--zero" not in args:
        args += ["--zero", "0"]
    data = simulate_json(*args[1:], "--cp", "1", "--ep", "1")
    for key in ("run", "engine_wall_s", "cp", "ep", "zero"):
        data.pop(key)
    # The golden's activations held recomputation's working bytes, which now have a kind of their own.
    for breakdown in [*data["device_peak_breakdown_bytes"],
                      *(stage["peak_breakdown_bytes"] for stage in data["stages"])]:
        breakdown["activations"] += breakdown.pop("working")
    assert data == golden["output"]
