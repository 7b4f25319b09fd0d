"""Mixtures of experts: sizes against the published figures, a layer's time against the hand sum of its ops."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipesim.spec.model_files import load_model
from pipesim.spec.opcost import Setting, layer_ops, totals
from pipesim.spec.transformer import (
    TransformerConfig,
    active_parameters_per_token,
    embedding_parameters,
    forward_flops_per_token,
    parameters,
)
from pipesim.spec.transformer_profile import transformer_profile
from tests.support.cost_fixtures import GB, round_device, two_nodes

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "hf_configs"


def fixture(name: str) -> TransformerConfig:
    return load_model(str(FIXTURES / name / "config.json"))


@pytest.mark.parametrize(("name", "total", "active"), [
    # Mistral AI's announcement of Mixtral 8x7B: 46.7B parameters in all, 12.9B used per token.
    ("Mixtral-8x7B-v0.1", 46.7e9, 12.9e9),
    # Qwen1.5-MoE-A2.7B's model card: 14.3B in all, 2.7B activated.
    ("Qwen1.5-MoE-A2.7B", 14.3e9, 2.7e9),
])
def test_an_moe_configs_parameters_and_active_parameters_are_within_1_percent_of_published(
        name: str, total: float, active: float) -> None:
    config = fixture(name)
    assert parameters(config) == pytest.approx(total, rel=0.01)
    assert active_parameters_per_token(config) == pytest.approx(active, rel=0.01)


def test_mixtral_by_hand() -> None:
    config = fixture("Mixtral-8x7B-v0.1")
    h, f, layers, vocab = 4096, 14336, 32, 32000
    attention = h * h + 2 * h * 1024 + h * h  # Q, K and V (8 KV heads of 128), the output projection
    expert = 3 * h * f  # gate, up, down
    layer = attention + h * 8 + 8 * expert + 2 * h  # router, eight experts, two RMSNorms
    tables = 2 * vocab * h  # untied input and output embeddings
    assert parameters(config) == tables + layers * layer + h == 46_702_792_704
    assert active_parameters_per_token(config) == parameters(config) - layers * 6 * expert == 12_879_925_248
    # the FLOPs of a token: two experts of eight, the router and attention at s = 4096
    per_layer = 2 * (attention + h * 8 + 2 * expert) + 4 * 4096 * h
    assert forward_flops_per_token(config, 4096) == layers * per_layer + 2 * h * vocab


def test_qwen3_moe_by_hand() -> None:
    config = fixture("Qwen3-30B-A3B")
    h, e, layers, vocab = 2048, 768, 48, 151936
    attention = h * 4096 + 2 * h * 512 + 4096 * h  # Q (32 heads of 128), K and V (4 KV heads), the projection
    expert = 3 * h * e  # gate, up, down; no shared expert
    layer = attention + h * 128 + 128 * expert + 2 * h  # router, 128 experts, two RMSNorms
    assert parameters(config) == 2 * vocab * h + layers * layer + h == 30_532_110_336
    assert active_parameters_per_token(config) == parameters(config) - layers * 120 * expert == 3_353_020_416
    # The model card: "30.5B in total and 3.3B activated", both this count cut to its figures.
    assert (f"{parameters(config) / 1e9:.4}"[:4], f"{active_parameters_per_token(config) / 1e9:.4}"[:3]) == ("30.5", "3.3")


@pytest.mark.parametrize(("name", "total", "active"), [
    # DeepSeek-V3's README_WEIGHTS.md: 671B main-model parameters, 36.6B activated (including the
    # output head's 0.9B: DeepSeek counts the activated parameters without the input embedding).
    ("DeepSeek-V3", 671e9, 36.6e9),
    # DeepSeek-V2 (Liu et al. 2024): 236B in all, 21B activated per token.
    ("DeepSeek-V2", 236e9, 21e9),
])
def test_deepseek_with_latent_attention_matches_its_published_sizes(name: str, total: float, active: float) -> None:
    config = fixture(name)
    assert parameters(config) == pytest.approx(total, rel=0.01)
    assert active_parameters_per_token(config) - embedding_parameters(config) == pytest.approx(active, rel=0.01)


def test_deepseek_v2_lite_projects_q_straight_from_the_hidden_state() -> None:
    config = fixture("DeepSeek-V2-Lite")
    assert (config.q_lora_rank, config.kv_lora_rank, config.num_dense_layers) == (0, 512, 1)
    assert parameters(config) == pytest.approx(15.7e9, rel=0.01)  # its model card: 15.7B in all


MOE = TransformerConfig(name="moe-toy", num_layers=4, hidden_size=1024, ffn_hidden_size=2816, num_heads=16,
                        num_kv_heads=4, vocab_size=32000, seq_len=4096, is_gated_ffn=True, norm="rmsnorm",
                        has_dropout=False, has_rotary=True, ffn_activation="swiglu", num_experts=16,
                        num_experts_per_token=2)


def test_an_moe_layers_time_is_the_hand_sum_of_router_dispatch_experts_and_combine() -> None:
    device = round_device()
    # TP 2, EP 4 with EP ranks TP apart: 4 members 2 apart span 7 GPUs, inside a node: the all-to-all
    # runs at NVLink's collective rate, 240 GB/s, 3 hops of 1 us.
    setting = Setting(device=device, cluster=two_nodes(), precision="bf16", microbatch_size=2, seq_len=4096, tp=2,
                      ep=4, ep_stride=2)
    tokens, h, experts, k, f, t = 8192, 1024, 16, 2, 2816, 2
    copies = tokens * k  # 16384 token copies leave and (routing balanced) arrive
    per_expert, local = copies * 4 / experts, experts // 4  # 4096 tokens for each of 4 local experts
    all_to_all = 1e-6 + 3 * 1e-6 + 3 / 4 * copies * h * 2 / (240 * GB)  # a launch and (n-1) a + (n-1)/n S / B
    router = device.matmul_s(tokens, experts, h, precision="bf16")
    router_softmax = 1e-6 + device.stream_s(2 * tokens * experts * 4, "softmax")  # fp32 logits in, probabilities out
    permute = 1e-6 + device.stream_s((tokens + copies) * h * 2, "elementwise")
    experts_fc1 = device.matmul_s(per_expert, 2 * f / t, h, precision="bf16", batch=local)  # one grouped GEMM
    swiglu = 1e-6 + device.stream_s(3 * copies * f / t * 2, "elementwise")
    experts_fc2 = device.matmul_s(per_expert, h, f / t, precision="bf16", batch=local)
    unpermute = 1e-6 + device.stream_s((copies + tokens) * h * 2, "elementwise")
    by_hand = (router + router_softmax) + (permute + all_to_all) + (experts_fc1 + swiglu + experts_fc2) \
        + (all_to_all + unpermute)
    moe = layer_ops(MOE, setting, moe=True)
    dense = layer_ops(MOE, setting)
    names = ("router", "router-softmax", "permute", "dispatch", "expert-fc1", "expert-swiglu", "expert-fc2", "combine",
             "unpermute")
    ffn = [op for op in moe if op.name in names]
    assert [op.name for op in ffn] == list(names)
    assert sum(op.forward_s for op in ffn) == pytest.approx(by_hand, rel=1e-12)
    # The rest of the layer is the dense layer's: attention, the norms, TP's reductions, the residuals.
    dense_ffn = [op for op in dense if op.name in ("fc1", "swiglu", "fc2")]
    assert totals(moe)[0] == pytest.approx(totals(dense)[0] - sum(op.forward_s for op in dense_ffn) + by_hand,
                                           rel=1e-12)
    # Backward: the all-to-alls carry the gradients back the same way.
    assert next(op for op in moe if op.name == "combine").input_grad_s == pytest.approx(all_to_all, rel=1e-12)


def test_expert_parallelism_splits_the_experts_weights_and_their_optimizer_state() -> None:
    device, cluster = round_device(), two_nodes()
    whole = transformer_profile(MOE, device=device, cluster=cluster, dp=8).layers[1]
    split = transformer_profile(MOE, device=device, cluster=cluster, dp=8, ep=8, zero=1).layers[1]
    expert = 3 * 1024 * 2816
    attention = 1024 * 1024 + 2 * 1024 * 256 + 1024 * 1024
    shared = attention + 1024 * 16 + 2 * 1024  # attention, router, norms: on every rank
    assert whole.param_bytes == 2 * (shared + 16 * expert)
    assert split.param_bytes == 2 * (shared + 2 * expert)  # 16 experts over EP 8
    # ZeRO-1: Adam's 12 bytes of the dense weights over the 8 data-parallel ranks, of the experts over
    # the 8 / 8 = 1 rank holding the same experts.
    assert split.optimizer_bytes == pytest.approx(12 * (shared / 8 + 2 * expert), rel=1e-12)
    assert split.gradient_bytes == split.param_bytes


def test_dense_first_layers_stay_dense() -> None:
    config = TransformerConfig(**{**MOE.__dict__, "num_dense_layers": 1})
    profile = transformer_profile(config, device=round_device(), cluster=two_nodes(), ep=2, dp=2)
    dense, moe = profile.layers[1], profile.layers[2]
    assert dense.param_bytes < moe.param_bytes and moe.param_bytes == profile.layers[4].param_bytes


def test_an_moe_file_round_trips_through_pipesims_model_json(tmp_path: Path) -> None:
    from pipesim.spec.model_files import model_to_json

    for name in ("Mixtral-8x7B-v0.1", "DeepSeek-V3", "Qwen1.5-MoE-A2.7B"):
        config = fixture(name)
        path = tmp_path / f"{name}.json"
        path.write_text(model_to_json(config))
        assert load_model(str(path)) == config
        assert json.loads(path.read_text())["num_experts"] == config.num_experts
