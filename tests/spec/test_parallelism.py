"""ZeRO and context parallelism against the ZeRO paper's bytes and hand-computed collective and ring times.

The cluster is a file (two nodes of 8 GPUs: NVLink at 300 GB/s, 0.8 of it in collectives, 1 us a
hop; InfiniBand at 25 GB/s per GPU, 0.9 of it, 5 us a hop), the device one with round numbers
(``tests/support/cost_fixtures.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipesim.errors import ConfigError
from pipesim.spec.cluster import Cluster, load_cluster
from pipesim.spec.opcost import Setting, layer_ops
from pipesim.spec.transformer import TransformerConfig, layer_activation_bytes
from pipesim.spec.transformer_profile import transformer_profile
from pipesim.training import simulate_training
from tests.support.cost_fixtures import round_device

GB = 1e9


def two_nodes(tmp_path: Path, compute_share: float = 0.0) -> Cluster:
    path = tmp_path / "two-nodes.json"
    path.write_text(json.dumps({"schema": "pipesim.cluster/1", "name": "two-nodes", "tiers": [
        {"name": "nvlink", "gpus": 8, "bandwidth_bytes_per_s": 300e9, "latency_s": 1e-6, "bus_efficiency": 0.8,
         "compute_share": compute_share},
        {"name": "ib", "gpus": None, "bandwidth_bytes_per_s": 25e9, "latency_s": 5e-6, "bus_efficiency": 0.9,
         "compute_share": compute_share}]}))
    return load_cluster(str(path))


# GPT-style: learned positions, biases, LayerNorm, 12h^2 + 13h a layer; an output layer of its own.
GPT = TransformerConfig(name="gpt-toy", num_layers=4, hidden_size=1024, ffn_hidden_size=4096, num_heads=16,
                        num_kv_heads=16, vocab_size=32000, seq_len=1024, has_bias=True, num_positions=1024,
                        has_dropout=False)
H, V, P, L = 1024, 32000, 1024, 4
LAYER = 12 * H * H + 13 * H  # 12,596,224
EMBEDDING = (V + P) * H  # 33,816,576
HEAD = V * H + 2 * H  # the output layer and the final norm: 32,770,048
PSI = EMBEDDING + L * LAYER + HEAD  # 116,971,520


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_zero_memory_per_gpu_is_the_papers_2_2_12_bytes_split_as_each_stage_splits_them(
        tmp_path: Path, zero: int) -> None:
    # One pipeline stage holds the whole model: Psi parameters on each of N_d = 8 data-parallel GPUs.
    # ZeRO (Rajbhandari et al. 2020, section 5): 2 Psi of 16-bit weights, 2 Psi of 16-bit gradients and
    # K Psi = 12 Psi of Adam's fp32 state. Stage 1 splits the 12, stage 2 the gradients too, stage 3 all.
    assert PSI == 116_971_520
    n = 8
    run = simulate_training(GPT, device=round_device(), cluster=two_nodes(tmp_path), global_batch=16, dp=n, zero=zero)
    held = run.result.metrics.device_peak_breakdown_bytes[0]
    weights = {0: 2 * PSI, 1: 2 * PSI, 2: 2 * PSI,
               # the shard, and the whole weights of the stage's two largest layers gathered at once:
               # the embedding table (33.8 M) and the output layer (32.8 M)
               3: 2 * PSI / n + 2 * (EMBEDDING + HEAD)}[zero]
    gradients = 2 * PSI / n if zero >= 2 else 2 * PSI
    optimizer = 12 * PSI / n if zero >= 1 else 12 * PSI
    assert held["weights"] == pytest.approx(weights, rel=1e-12)
    assert held["gradients"] == pytest.approx(gradients, rel=1e-12)
    assert held["optimizer"] == pytest.approx(optimizer, rel=1e-12)


def test_zero3_gathers_each_layer_before_its_forward_and_backward_as_hand_computed(tmp_path: Path) -> None:
    cluster = two_nodes(tmp_path)
    # 16 data-parallel GPUs, TP 1: the group spans both nodes on InfiniBand, 8 members a node drive 8 NICs,
    # under what NVLink carries: bus = min(8 x 25 x 0.9, 8/7 x 300 x 0.8) = 180 GB/s; 15 hops of 5 us.
    bus, hops = 180 * GB, 15 * 5e-6
    gather = hops + 15 / 16 * 2 * LAYER / bus  # the layer's 16-bit weights
    scatter = hops + 15 / 16 * 4 * LAYER / bus  # its gradients, in fp32 under bf16
    short = TransformerConfig(**{**GPT.__dict__, "seq_len": 128})
    base, zero2, zero3 = (transformer_profile(short, device=round_device(), cluster=cluster, dp=16, zero=zero).layers[1]
                          for zero in (0, 2, 3))
    assert gather > base.forward_s  # b = 1, s = 128: the gather outlasts the forward, so it decides
    assert zero3.forward_s == pytest.approx(max(base.forward_s, gather), rel=1e-12)
    assert zero3.backward_input_s == pytest.approx(max(base.backward_input_s or 0, gather), rel=1e-12)
    assert zero3.backward_weight_s == pytest.approx(max(base.backward_weight_s or 0, scatter), rel=1e-12)
    # ZeRO-2 scatters each microbatch's gradients the same way but gathers nothing per layer: the
    # updated weights' all-gather joins the step.
    assert zero2.forward_s == base.forward_s
    assert zero2.backward_weight_s == pytest.approx(max(base.backward_weight_s or 0, scatter), rel=1e-12)
    step = 1e-6 + 34 * LAYER / 16 / (1e12 * 0.8)  # Adam's 34 bytes a parameter over the shard
    assert zero3.update_s == pytest.approx(step, rel=1e-12)
    assert zero2.update_s == pytest.approx(step + gather, rel=1e-12)


def test_a_gather_beside_compute_takes_its_tiers_share_of_the_compute(tmp_path: Path) -> None:
    shared = two_nodes(tmp_path, compute_share=0.25)
    gather = 15 * 5e-6 + 15 / 16 * 2 * LAYER / (180 * GB)
    config = TransformerConfig(**{**GPT.__dict__, "seq_len": 8192})  # a long forward: the compute outlasts the gather
    base = transformer_profile(config, device=round_device(), cluster=shared, dp=16).layers[1]
    zero3 = transformer_profile(config, device=round_device(), cluster=shared, dp=16, zero=3).layers[1]
    assert base.forward_s > gather
    assert zero3.forward_s == pytest.approx(base.forward_s + 0.25 * gather, rel=1e-12)


def test_ring_attention_steps_equal_the_hand_computed_times(tmp_path: Path) -> None:
    cluster = two_nodes(tmp_path)
    # 16 heads of 64 (4 KV heads), TP 4 and CP 4: CP ranks are 4 GPUs apart, the ring spans 13 GPUs,
    # so its slowest hop crosses InfiniBand: 5 us + bytes / 22.5 GB/s.
    config = TransformerConfig(name="gqa", num_layers=2, hidden_size=1024, ffn_hidden_size=4096, num_heads=16,
                               num_kv_heads=4, vocab_size=1000, seq_len=8192, has_dropout=False)
    for s in (8192, 1024):
        setting = Setting(device=round_device(), cluster=cluster, precision="bf16", microbatch_size=1, seq_len=s, tp=4,
                          tp_stride=1, cp=4, cp_stride=4)
        ring = next(op for op in layer_ops(config, setting) if op.name == "ring-attention")
        # Each of 4 steps: 1/16 of the causal 2 b s^2 (a/t) d FLOPs; forward at 0.6 of 100 TFLOP/s,
        # backward 2.5 times those FLOPs at 0.4.
        flops = 2 * s * s * 4 * 64 / 16
        forward, backward = 1e-6 + flops / 60e12, 1e-6 + 2.5 * flops / 40e12
        chunk = s / 4 * (64 + 64) * 2  # K and V of s/4 tokens, one KV head (64 wide) each on this TP rank
        hop, both = 5e-6 + chunk / 22.5e9, 5e-6 + 2 * chunk / 22.5e9
        assert ring.forward_s == pytest.approx(forward + 3 * max(forward, hop), rel=1e-12)
        assert ring.input_grad_s == pytest.approx(backward + 3 * max(backward, both) + hop, rel=1e-12)
        assert (forward > hop) == (s == 8192)  # the long sequence hides its hops, the short one waits for them


def test_context_parallelism_divides_the_tokens_and_reduces_over_dp_x_cp(tmp_path: Path) -> None:
    cluster = two_nodes(tmp_path)
    llama = TransformerConfig(name="llama-toy", num_layers=4, hidden_size=1024, ffn_hidden_size=3584, num_heads=16,
                              num_kv_heads=4, vocab_size=32000, seq_len=8192, is_gated_ffn=True, norm="rmsnorm",
                              has_dropout=False, has_rotary=True, ffn_activation="swiglu")
    split = transformer_profile(llama, device=round_device(), cluster=cluster, cp=4, dp=2)
    whole = transformer_profile(llama, device=round_device(), cluster=cluster, dp=8)
    block = split.layers[1]
    assert block.stash_bytes == layer_activation_bytes(llama, microbatch_size=1, seq_len=2048, attention="flash")
    assert block.activation_bytes == 2048 * 1024 * 2 and split.input_bytes == 8 * 2048
    # the dense weights' gradients reduce over DP x CP = 8 GPUs, as DP = 8 alone would
    assert block.update_s == whole.layers[1].update_s


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"cp": 3}, "cp=3: must split the sequence (1024) into 2 x cp = 6 equal chunks"),
    ({"cp": 2, "attention": "unfused"}, "cp=2: needs --attention flash"),
    ({"ep": 2, "dp": 2}, "ep=2: needs a mixture of experts"),
    ({"ep": 3, "dp": 2}, "ep=3: must divide dp x cp (2 x 1 = 2)"),
    ({"zero": 4}, "zero=4: must be 0 (none), 1 (optimizer state), 2 (and gradients) or 3"),
    ({"zero": 2, "dp": 2, "dp_overlap": True}, "dp_overlap=True: applies to --zero 0 and 1"),
])
def test_a_degree_that_does_not_divide_what_it_splits_is_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        transformer_profile(GPT, device=round_device(), **kwargs)  # type: ignore[arg-type]
    assert str(caught.value).startswith(message)
