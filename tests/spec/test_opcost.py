"""The op cost model against hand arithmetic: products, memory-bound ops, attention, a whole layer, the optimizer."""

from __future__ import annotations

import pytest

from pipesim.spec.cluster import Cluster, Tier
from pipesim.spec.device import Device, load_device
from pipesim.spec.opcost import Setting, layer_ops, totals
from pipesim.spec.transformer import TransformerConfig, preset
from pipesim.spec.transformer_profile import ADAM_BYTES_PER_PARAMETER, transformer_profile


def toy_device(**update: object) -> Device:
    """Round numbers: 100 TFLOP/s on 10 SMs, one 100 x 100 tile, half of peak, 1 TB/s memory."""
    data = {
        "name": "toy", "memory_bytes": 80e9, "peak_flops": {"bf16": 100e12}, "vector_flops": 10e12,
        "memory_bandwidth_bytes_per_s": 1e12, "num_sms": 10, "launch_s": 1e-6, "sustained_share": 1.0,
        "matmul": {"max_efficiency": 0.5, "k_overhead": 50, "tiles": [{"m": 100, "n": 100, "efficiency": 1.0}]},
        "memory": {"max_efficiency": 0.8, "half_bytes": 0, "kind_efficiency": {"norm": 0.5}},
        "attention": {"forward_max_efficiency": 0.6, "backward_max_efficiency": 0.4, "forward_seq_half": 1024,
                      "backward_seq_half": 2048, "head_dim_half": 64},
    }
    data.update(update)
    return Device.model_validate(data)


def toy_cluster() -> Cluster:
    return Cluster(name="toy", tiers=(Tier(name="nvlink", gpus=8, bandwidth_bytes_per_s=100e9, latency_s=0.0),
                                      Tier(name="nic", gpus=None, bandwidth_bytes_per_s=10e9, latency_s=0.0)))


def test_a_product_costs_its_waves_of_tiles_or_its_bytes_plus_one_launch() -> None:
    device = toy_device()
    # 1000 x 1000 outputs: 10 x 10 = 100 tiles of 100 x 100 on 10 SMs, 10 waves. A tile: 2 x 100 x 100 x
    # (k + 50) FLOPs at 0.5 x 100e12 / 10 = 5e12 FLOP/s per SM: 2e4 x 1050 / 5e12 = 4.2e-6 s; 10 waves 4.2e-5 s.
    # Bytes: (1000^2 x 3) x 2 = 6e6 at 1e12 x 0.8: 7.5e-6 s, less. Plus the 1 us launch.
    assert device.matmul_s(1000, 1000, 1000, precision="bf16") == pytest.approx(4.2e-5 + 1e-6)
    # 1001 rows need an eleventh row of tiles: 110 tiles, 11 waves.
    assert device.matmul_s(1001, 1000, 1000, precision="bf16") == pytest.approx(11 * 4.2e-6 + 1e-6)
    # k = 1: a tile is 2e4 x 51 / 5e12 = 2.04e-7 s x 10 waves = 2.04e-6 s; the bytes (1e6 + 2e3) x 2 = 2.004e6
    # at 0.8e12 take 2.505e-6 s: the product is bound by memory.
    assert device.matmul_s(1000, 1000, 1, precision="bf16") == pytest.approx(2.004e6 / 0.8e12 + 1e-6)


def test_sustained_share_scales_every_compute_bound_product() -> None:
    hot = toy_device(sustained_share=0.5)
    assert hot.matmul_s(1000, 1000, 1000, precision="bf16") == pytest.approx(2 * 4.2e-5 + 1e-6)


def test_memory_bound_time_is_bytes_over_the_kinds_rate() -> None:
    device = toy_device()
    assert device.stream_s(8e9) == pytest.approx(8e9 / (1e12 * 0.8))  # a copy: 0.8 of 1 TB/s
    assert device.stream_s(8e9, "norm") == pytest.approx(8e9 / (1e12 * 0.8 * 0.5))  # a norm: half a copy's rate
    assert device.stream_s(8e9, "softmax") == device.stream_s(8e9)  # an unmeasured kind streams as a copy


def test_attention_efficiency_ramps_with_sequence_and_head_size() -> None:
    device = toy_device()
    # forward at s = 1024, d = 128: 0.6 x 1024 / (1024 + 1024) x (1 + 64/128) x 128 / (128 + 64) = 0.3
    assert device.attention_efficiency(1024, 128, backward=False) == pytest.approx(0.3)
    # backward at s = 2048, d = 64: 0.4 x 1/2 x 1.5 x 64 / 128 = 0.15
    assert device.attention_efficiency(2048, 64, backward=True) == pytest.approx(0.15)


def ideal_device() -> Device:
    """Every product at full peak with no waste (1 x 1 tiles on one SM), memory and launches free."""
    return toy_device(num_sms=1, launch_s=0.0, memory_bandwidth_bytes_per_s=1e30,
                      matmul={"max_efficiency": 1.0, "k_overhead": 0, "tiles": [{"m": 1, "n": 1, "efficiency": 1.0}]})


def test_a_gpt_layer_forward_is_megatrons_24bsh2_plus_the_attention_kernel() -> None:
    b, s, h, heads = 2, 1024, 512, 8
    config = TransformerConfig(name="gpt", num_layers=1, hidden_size=h, ffn_hidden_size=4 * h, num_heads=heads,
                               num_kv_heads=heads, vocab_size=1000, seq_len=s, has_bias=True)
    device = ideal_device()
    ops = layer_ops(config, Setting(device=device, cluster=toy_cluster(), precision="bf16", microbatch_size=b,
                                    seq_len=s))
    forward, input_grad, weight_grad = totals(ops)
    peak = 100e12
    matmul = 24 * b * s * h**2 / peak  # QKV 6bsh^2, projection 2bsh^2, MLP 16bsh^2
    # FlashAttention's causal forward 2 b s^2 h FLOPs at the forward efficiency; its backward 2.5 x that.
    forward_attention = 2 * b * s**2 * h / (peak * device.attention_efficiency(s, h // heads, backward=False))
    backward_attention = 2.5 * 2 * b * s**2 * h / (peak * device.attention_efficiency(s, h // heads, backward=True))
    assert forward == pytest.approx(matmul + forward_attention)
    assert input_grad == pytest.approx(matmul + backward_attention)  # dX of every product, and the attention's
    assert weight_grad == pytest.approx(matmul)  # dW of every product
    unfused = layer_ops(config, Setting(device=device, cluster=toy_cluster(), precision="bf16", microbatch_size=b,
                                        seq_len=s, attention="unfused"))
    # Unfused: Q K^T and P V as batched products, 4 b s^2 h FLOPs forward (no causal saving), twice that backward.
    assert totals(unfused)[0] == pytest.approx(matmul + 4 * b * s**2 * h / peak)
    assert totals(unfused)[1] == pytest.approx(matmul + 8 * b * s**2 * h / peak)


def test_a_layers_memory_ops_move_the_bytes_written_in_their_comments() -> None:
    b, s, h, f = 1, 2048, 1024, 4096
    config = TransformerConfig(name="gpt", num_layers=1, hidden_size=h, ffn_hidden_size=f, num_heads=8,
                               num_kv_heads=8, vocab_size=1000, seq_len=s, has_bias=True, has_dropout=False)
    device = toy_device(launch_s=0.0, memory={"max_efficiency": 1.0, "half_bytes": 0, "kind_efficiency": {}})
    ops = {op.name: op for op in layer_ops(config, Setting(device=device, cluster=toy_cluster(), precision="bf16",
                                                            microbatch_size=b, seq_len=s))}
    activations = b * s * h * 2  # bytes of one b s h bf16 tensor
    assert ops["norm"].forward_s == pytest.approx(2 * activations / 1e12)  # reads x, writes y
    assert ops["norm"].input_grad_s == pytest.approx(3 * activations / 1e12)  # reads x and dy, writes dx
    assert ops["residual"].forward_s == pytest.approx(3 * activations / 1e12)  # x + residual -> out
    assert ops["gelu"].forward_s == pytest.approx(2 * b * s * f * 2 / 1e12)  # the 4h activation, in and out


def test_the_optimizer_step_streams_adams_bytes_per_parameter() -> None:
    device = load_device("h100")
    profile = transformer_profile("llama2-7b", device=device, seq_len=1024)
    layer = profile.layers[1]
    parameters = layer.param_bytes / 2
    rate = device.memory_bandwidth_bytes_per_s * device.memory.max_efficiency * device.memory.kind_efficiency["optimizer"]
    assert ADAM_BYTES_PER_PARAMETER == 4 + 4 + 8 + 8 + 8 + 2  # grad twice, master, m, v read and written, bf16 weight
    assert layer.update_s == pytest.approx(device.launch_s + parameters * 34 / rate)
    # fp16 adds the gradients' copy into fp32 (2 + 4 bytes) and the unscale with its overflow check (4 + 4).
    fp16 = transformer_profile("llama2-7b", device=device, seq_len=1024, precision="fp16").layers[1]
    assert fp16.update_s == pytest.approx(device.launch_s + parameters * (34 + 14) / rate)


def test_recomputation_adds_what_it_re_runs_to_the_input_gradient() -> None:
    none, selective, full = (transformer_profile("llama2-7b", seq_len=2048, recompute=mode).layers[1]
                             for mode in ("none", "selective", "full"))
    setting = Setting(device=load_device("h100"), cluster=toy_cluster(), precision="bf16", microbatch_size=1,
                      seq_len=2048)
    attention = next(op for op in layer_ops(preset("llama2-7b"), setting) if op.name == "attention")
    assert full.backward_input_s == pytest.approx(none.backward_input_s + none.forward_s)
    assert selective.backward_input_s == pytest.approx(none.backward_input_s + attention.forward_s)
    assert full.forward_s == none.forward_s and full.backward_weight_s == none.backward_weight_s
