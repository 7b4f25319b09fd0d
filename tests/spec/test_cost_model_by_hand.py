"""The op cost model and its parallelism against closed forms worked out by hand in each test.

Each number is written out from the model's definition (the module docstrings of pipesim.spec.device,
opcost, collectives and sharding) on round devices and clusters, not read back from the code.
"""

from __future__ import annotations

from typing import Any

import pytest

from pipesim.errors import ConfigError
from pipesim.spec.collectives import Group
from pipesim.spec.device import Device
from pipesim.spec.layout import Parallelism
from pipesim.spec.opcost import OpCost, Setting, head_ops, layer_ops, matmul_op, memory_op, totals
from pipesim.spec.transformer import TransformerConfig
from pipesim.spec.transformer_profile import transformer_profile
from pipesim.training import simulate_training
from tests.support.cost_fixtures import GB, ideal_device, round_device, two_nodes

PEAK = 100e12  # round_device's bf16 peak
# Llama-style: grouped-query attention (16 heads of 64, 4 KV heads), SwiGLU, RMSNorm, rotary, no biases.
LLAMA = TransformerConfig(name="llama-toy", num_layers=2, hidden_size=1024, ffn_hidden_size=3584, num_heads=16,
                          num_kv_heads=4, vocab_size=32000, seq_len=2048, is_gated_ffn=True, norm="rmsnorm",
                          has_dropout=False, has_rotary=True, ffn_activation="swiglu")
# GPT-style: biases, LayerNorm, learned positions: 12 h^2 + 13 h parameters a layer.
GPT = TransformerConfig(name="gpt-toy", num_layers=4, hidden_size=1024, ffn_hidden_size=4096, num_heads=16,
                        num_kv_heads=16, vocab_size=32000, seq_len=1024, has_bias=True, num_positions=1024,
                        has_dropout=False)
GPT_LAYER = 12 * 1024**2 + 13 * 1024


def device(**update: Any) -> Device:
    """round_device with ``update`` applied."""
    return Device.model_validate({**round_device().model_dump(by_alias=True), **update})


def setting(**fields: Any) -> Setting:
    return Setting(**{"device": round_device(), "cluster": two_nodes(), "precision": "bf16", "microbatch_size": 1,
                      "seq_len": 2048, **fields})


def test_one_tile_past_a_full_wave_costs_a_whole_wave() -> None:
    # round_device: 10 SMs, each 0.5 x 100 TFLOP/s / 10 = 5 TFLOP/s; a 100 x 100 tile of k = 950 (+ 50
    # overhead) is 2 x 100 x 100 x 1000 = 2e7 FLOPs: 4 us. 100 tiles are 10 waves: 40 us; a 101st tile
    # starts an 11th wave on one SM while nine wait: 44 us, not 40.4. (Bytes: (10100 x 950 + 950 x 100 +
    # 10100 x 100) x 2 = 21.4 MB at 0.8 TB/s = 26.75 us, under the compute.) Plus one 1 us launch.
    card = round_device()
    assert card.matmul_s(10_000, 100, 950, precision="bf16") == pytest.approx(10 * 4e-6 + 1e-6, rel=1e-12)
    assert card.matmul_s(10_100, 100, 950, precision="bf16") == pytest.approx(11 * 4e-6 + 1e-6, rel=1e-12)


def test_a_transfer_of_half_bytes_reaches_half_the_copy_rate() -> None:
    # bytes / (bytes + half_bytes) of 0.8 x 1 TB/s: 1 MB with half_bytes 1 MB streams at 0.4 TB/s.
    card = device(memory={"max_efficiency": 0.8, "half_bytes": 1e6})
    assert card.stream_s(1e6) == pytest.approx(1e6 / 0.4e12, rel=1e-12)
    assert card.stream_s(3e6) == pytest.approx(3e6 / (0.8e12 * 3 / 4), rel=1e-12)
    assert card.stream_s(0) == 0.0


def test_the_weight_gradient_is_the_inputs_transposed_times_the_output_gradient() -> None:
    # Y (m x n) = X (m x k) W (k x n) with m = 1000 tokens, k = 100, n = 2000, on round_device (5 TFLOP/s
    # an SM, 10 SMs, 100 x 100 tiles, k overhead 50, 1 us launch); bytes (m k + k n + m n) x 2 = 4.6 MB
    # take 5.75 us at 0.8 TB/s, under each product's compute below.
    # forward: 1000 x 2000 outputs = 200 tiles = 20 waves of 2e4 x (100 + 50) / 5e12 = 0.6 us: 12 us.
    # dX = dY W^T: 1000 x 100 outputs = 10 tiles, one wave over n = 2000: 2e4 x 2050 / 5e12 = 8.2 us.
    # dW = X^T dY: 100 x 2000 outputs = 20 tiles, two waves over m = 1000: 2 x 2e4 x 1050 / 5e12 = 8.4 us.
    op = matmul_op(setting(), "w", 1000, 2000, 100)
    assert op.forward_s == pytest.approx(12e-6 + 1e-6, rel=1e-12)
    assert op.input_grad_s == pytest.approx(8.2e-6 + 1e-6, rel=1e-12)
    assert op.weight_grad_s == pytest.approx(8.4e-6 + 1e-6, rel=1e-12)


def test_a_gated_gqa_layer_is_its_products_flops_plus_the_attention_kernel() -> None:
    # T = b s = 2 x 2048 tokens, h = 1024, Q 16 x 64 = 1024 wide, K and V 4 x 64 = 256 each, SwiGLU f = 3584.
    b, s, h, q, kv, f = 2, 2048, 1024, 1024, 256, 3584
    tokens = b * s
    # 2 FLOPs a weight and token: QKV h (q + 2 kv), output q h, gate and up 2 h f, down f h.
    matmul = 2 * tokens * (h * (q + 2 * kv) + q * h + 2 * h * f + f * h) / PEAK
    # causal fused attention: 2 b s^2 (a d) FLOPs at 0.6 of the peak, its backward 2.5 x at 0.4.
    attention = 2 * b * s * s * 16 * 64
    ops = layer_ops(LLAMA, setting(device=ideal_device(), microbatch_size=b, seq_len=s))
    forward, input_grad, weight_grad = totals(ops)
    assert forward == pytest.approx(matmul + attention / (0.6 * PEAK), rel=1e-9)
    assert input_grad == pytest.approx(matmul + 2.5 * attention / (0.4 * PEAK), rel=1e-9)
    assert weight_grad == pytest.approx(matmul, rel=1e-9)


def test_a_tensor_parallel_blocks_all_reduce_is_a_ring_over_the_nodes_links() -> None:
    # TP 4 inside a node of two_nodes: 300 GB/s x 0.8 = 240 GB/s, 1 us a hop. A block's output is
    # T h e = 2048 x 1024 x 2 bytes; a ring all-reduce takes 2 (n-1) hops and moves 2 (n-1)/n of it:
    # 6 us + 1.5 x 2,097,152 / 240e9 (a chain inside the node, the "tree", moves 2 S: slower).
    size = 2048 * 1024 * 2
    ring = 2 * 3 * 1e-6 + 2 * 3 / 4 * size / (240 * GB)
    reductions = [op for op in layer_ops(LLAMA, setting(tp=4)) if op.name == "tp-all-reduce"]
    assert len(reductions) == 2  # after attention and after the MLP
    for op in reductions:  # forward at the block's output, backward the same bytes at its input
        assert op.forward_s == pytest.approx(1e-6 + ring, rel=1e-12)
        assert op.input_grad_s == pytest.approx(1e-6 + ring, rel=1e-12)


def by_name(ops: list[OpCost]) -> dict[str, list[OpCost]]:
    named: dict[str, list[OpCost]] = {}
    for op in ops:
        named.setdefault(op.name, []).append(op)
    return named


def test_context_parallelism_gives_each_rank_s_over_c_tokens_for_every_op_but_attention() -> None:
    # CP 2 over a 4096-token sequence: every op but the attention sees 2048 tokens, as an unsplit run of
    # 2048 tokens does; the attention is the ring (its own test in test_parallelism.py).
    split = by_name(layer_ops(LLAMA, setting(seq_len=4096, cp=2, cp_stride=1)))
    whole = by_name(layer_ops(LLAMA, setting(seq_len=2048)))
    assert set(split) - {"ring-attention"} == set(whole) - {"attention"}
    for name, ops in whole.items():
        if name != "attention":
            assert split[name] == ops, name
    # On the ideal device the QKV product is 2 (s / C) h (q + 2 kv) FLOPs: 2 x 2048 x 1024 x 1536.
    qkv = by_name(layer_ops(LLAMA, setting(device=ideal_device(), seq_len=4096, cp=2)))["qkv"][0]
    assert qkv.forward_s == pytest.approx(2 * 2048 * 1024 * 1536 / PEAK, rel=1e-12)


def test_zero1_steps_a_shard_and_reduce_scatters_then_all_gathers_where_zero0_all_reduces() -> None:
    # 16 data-parallel GPUs over two nodes of two_nodes: 8 members a node drive 8 NICs, 8 x 25 GB/s x 0.9 =
    # 180 GB/s (under NVLink's 8/7 x 240); 5 us a hop across nodes, 1 us inside. A layer of Psi = 12 h^2 + 13 h
    # parameters has 4 Psi bytes of fp32 gradients (bf16 training) and 2 Psi bytes of weights.
    psi, bus = GPT_LAYER, 180 * GB
    # Adam's step streams 34 bytes a parameter at 0.8 TB/s, on the whole layer or (ZeRO-1) its 1/16 shard.
    step0, step1 = 1e-6 + 34 * psi / 0.8e12, 1e-6 + 34 * psi / 16 / 0.8e12
    ring = 2 * 15 * 5e-6 + 2 * 15 / 16 * 4 * psi / bus
    tree = 2 * (1 * 5e-6 + 7 * 1e-6) + 2 * 4 * psi / bus  # a tree of 2 nodes (1 level), a chain of 8 in each
    scatter, gather = 15 * 5e-6 + 15 / 16 * 4 * psi / bus, 15 * 5e-6 + 15 / 16 * 2 * psi / bus
    zero0, zero1 = (transformer_profile(GPT, device=round_device(), cluster=two_nodes(), dp=16, zero=zero).layers[1]
                    for zero in (0, 1))
    assert zero0.param_bytes == 2 * psi
    assert zero0.update_s == pytest.approx(step0 + min(ring, tree), rel=1e-12)
    assert zero1.update_s == pytest.approx(step1 + scatter + gather, rel=1e-12)


def test_a_tensor_parallel_layers_weight_gradient_is_every_products_dw_over_t() -> None:
    # On the ideal device a product's dW is 2 m n k FLOPs over the peak; TP 4 splits each of the layer's
    # matrices four ways: 2 T (h (q + 2 kv) + q h + 3 h f) / 4 FLOPs, T = 2048 tokens.
    tokens, h, q, kv, f = 2048, 1024, 1024, 256, 3584
    block = transformer_profile(LLAMA, device=ideal_device(), cluster=two_nodes(), tp=4).layers[1]
    assert block.backward_weight_s == pytest.approx(2 * tokens * (h * (q + 2 * kv) + q * h + 3 * h * f) / 4 / PEAK,
                                                    rel=1e-9)


def test_mfu_and_model_tflops_count_the_runs_sequence_length() -> None:
    # GPT-toy trained at s = 512 (its config says 1024) on TP 2 x DP 2 = 4 GPUs of 100 TFLOP/s:
    # forward FLOPs a token = L (2 x 12 h^2 + 4 s h) + 2 h V (Narayanan et al.; no causal saving).
    h, vocab, layers, s = 1024, 32000, 4, 512
    flops = layers * (2 * 12 * h * h + 4 * s * h) + 2 * h * vocab
    assert flops == 174_587_904
    run = simulate_training(GPT, device=round_device(), cluster=two_nodes(), global_batch=4, tp=2, dp=2, seq_len=s)
    tokens_per_s = 4 * s / run.iteration_time_s
    assert run.num_gpus == 4
    assert run.tokens_per_s == pytest.approx(tokens_per_s, rel=1e-12)
    assert run.mfu == pytest.approx(3 * flops * tokens_per_s / (4 * PEAK), rel=1e-12)
    assert run.model_tflops_per_gpu == pytest.approx(3 * flops * tokens_per_s / 4 / 1e12, rel=1e-12)


def test_zero1_splits_the_optimizer_state_over_dp_times_cp() -> None:
    # GPT-toy on one stage: Psi = (V + P) h + L (12 h^2 + 13 h) + V h + 2 h = 116,971,520 parameters. DP 2 x CP 2
    # = 4 ranks hold the same weights, so ZeRO-1 leaves each 12 Psi / 4 bytes of Adam's state (ZeRO, section 5).
    psi = (32000 + 1024) * 1024 + 4 * GPT_LAYER + 32000 * 1024 + 2 * 1024
    assert psi == 116_971_520
    run = simulate_training(GPT, device=round_device(), cluster=two_nodes(), global_batch=4, dp=2, cp=2, zero=1)
    held = run.result.metrics.device_peak_breakdown_bytes[0]
    assert held["optimizer"] == pytest.approx(12 * psi / 4, rel=1e-12)
    assert held["weights"] == pytest.approx(2 * psi, rel=1e-12) and held["gradients"] == pytest.approx(2 * psi,
                                                                                                        rel=1e-12)


def test_a_memory_op_launches_a_kernel_each_way() -> None:
    # 8 MB forward and 12 MB backward on round_device: 1 us a launch, 0.8 TB/s; no backward bytes, no backward.
    op = memory_op(setting(), "norm", 8e6, 12e6, "norm")
    assert (op.forward_s, op.input_grad_s) == pytest.approx((1e-6 + 8e6 / 0.8e12, 1e-6 + 12e6 / 0.8e12), rel=1e-12)
    assert memory_op(setting(), "add", 8e6, 0.0, "elementwise").input_grad_s == 0.0


def test_the_cross_entropy_is_megatrons_passes_over_the_logits() -> None:
    # T = 2048 tokens, V / t = 32000 / 2 logits a token on each TP rank. Forward, six kernels: an fp32 copy
    # of the bf16 logits (2 + 4 bytes a logit), the row max (4), minus it (4 + 4), exp (4 + 4), the row sum
    # (4), divided by it (4 + 4): 38 bytes; the max and the sum at the norm kind's rate, here 0.5 of a copy.
    # Backward, two: the softmax times the loss's gradient (4 + 4), cast back to bf16 (4 + 2): 14 bytes.
    # round_device streams at 0.8 TB/s after a 1 us launch.
    logits = 2048 * 16000
    card = device(memory={"max_efficiency": 0.8, "half_bytes": 0, "kind_efficiency": {"norm": 0.5}})
    loss = next(op for op in head_ops(LLAMA, setting(device=card, tp=2)) if op.name == "cross-entropy")
    assert loss.forward_s == pytest.approx(6e-6 + logits * 30 / 0.8e12 + logits * 8 / 0.4e12, rel=1e-12)
    assert loss.input_grad_s == pytest.approx(2e-6 + logits * 14 / 0.8e12, rel=1e-12)


def test_fp8_runs_the_layers_gemms_in_fp8_with_their_casts_and_attention_and_logits_in_16_bits() -> None:
    # Products at exactly 2 m n k FLOPs over the peak (one 1 x 1 tile, one SM), 200 TFLOP/s in fp8 and 100 in
    # bf16, 1 us a launch, memory at 0.8 TB/s. Llama-toy, T = 2048 tokens: QKV is T x 1536 x 1024 (Q 1024,
    # K and V 256 each). In fp8 each of its three products takes 2 T 1536 1024 / 200e12 plus a launch; the
    # forward first casts its bf16 input (T x 1024) to fp8 and its transpose (read 2 bytes, write 1 + 1),
    # the input gradient casts the output's gradient (T x 1536) the same way; the weight gradient reuses both.
    card = device(peak_flops={"bf16": 100e12, "fp8": 200e12}, num_sms=1,
                  matmul={"max_efficiency": 1.0, "k_overhead": 0, "tiles": [{"m": 1, "n": 1, "efficiency": 1.0}]})
    tokens, product = 2048, 2 * 2048 * 1536 * 1024 / 200e12 + 1e-6
    ops = {op.name: op for op in layer_ops(LLAMA, setting(device=card, precision="fp8"))}
    assert ops["qkv"].forward_s == pytest.approx(product + 1e-6 + tokens * 1024 * 4 / 0.8e12, rel=1e-12)
    assert ops["qkv"].input_grad_s == pytest.approx(product + 1e-6 + tokens * 1536 * 4 / 0.8e12, rel=1e-12)
    assert ops["qkv"].weight_grad_s == pytest.approx(product, rel=1e-12)
    # Fused attention stays in bf16 (TransformerEngine's default: FP8 attention is opt-in): 2 s^2 heads d
    # causal FLOPs at 0.6 of the bf16 peak, as in bf16 training.
    attention = 2 * 2048**2 * 16 * 64
    assert ops["attention"].forward_s == pytest.approx(1e-6 + attention / (100e12 * 0.6), rel=1e-12)
    bf16 = {op.name: op for op in layer_ops(LLAMA, setting(device=card, precision="bf16"))}
    assert ops["attention"] == bf16["attention"]
    # The output layer is Megatron's own (not TransformerEngine's): its logits stay in bf16.
    logits = next(op for op in head_ops(LLAMA, setting(device=card, precision="fp8")) if op.name == "logits")
    assert logits.forward_s == pytest.approx(2 * 2048 * 32000 * 1024 / 100e12 + 1e-6, rel=1e-12)


def test_tf32_keeps_activations_in_4_bytes() -> None:
    # A norm reads and writes T h values: 2048 x 1024 x 4 bytes each way under tf32.
    card = device(peak_flops={"bf16": 100e12, "tf32": 50e12})
    norm = next(op for op in layer_ops(LLAMA, setting(device=card, precision="tf32")) if op.name == "norm")
    assert norm.forward_s == pytest.approx(1e-6 + 2 * 2048 * 1024 * 4 / 0.8e12, rel=1e-12)


def test_an_overlapped_gradient_all_reduce_leaves_its_compute_share_in_the_step() -> None:
    # As in the ZeRO-1 test: 16 GPUs over two nodes, the all-reduce of 4 Psi bytes is the tree's (faster);
    # overlapped with the backward it is the layer's gradient_allreduce_s and the step keeps only the
    # SMs it takes from compute: its tier's share (0.25) of it.
    psi, bus = GPT_LAYER, 180 * GB
    allreduce = min(2 * 15 * 5e-6 + 2 * 15 / 16 * 4 * psi / bus, 2 * (5e-6 + 7 * 1e-6) + 2 * 4 * psi / bus)
    layer = transformer_profile(GPT, device=round_device(), cluster=two_nodes(compute_share=0.25), dp=16,
                                dp_overlap=True).layers[1]
    assert layer.gradient_allreduce_s == pytest.approx(allreduce, rel=1e-12)
    assert layer.update_s == pytest.approx(1e-6 + 34 * psi / 0.8e12 + 0.25 * allreduce, rel=1e-12)


def test_zero1_overlapped_scatters_beside_the_backward_and_gathers_beside_the_next_forward() -> None:
    # As in the ZeRO-1 test: 16 GPUs over two nodes. Overlapped, the reduce-scatter of the fp32 gradients is
    # the layer's gradient_allreduce_s (after its backward) and the all-gather of the updated bf16 weights its
    # param_gather_s (after the optimizer step, before its next forward); the step keeps the SMs both
    # take from compute: the tier's share (0.25) of each.
    psi, bus = GPT_LAYER, 180 * GB
    scatter, gather = 15 * 5e-6 + 15 / 16 * 4 * psi / bus, 15 * 5e-6 + 15 / 16 * 2 * psi / bus
    layer = transformer_profile(GPT, device=round_device(), cluster=two_nodes(compute_share=0.25), dp=16, zero=1,
                                dp_overlap=True).layers[1]
    assert layer.gradient_allreduce_s == pytest.approx(scatter, rel=1e-12)
    assert layer.param_gather_s == pytest.approx(gather, rel=1e-12)
    assert layer.update_s == pytest.approx(1e-6 + 34 * psi / 16 / 0.8e12 + 0.25 * (scatter + gather), rel=1e-12)


TIED = TransformerConfig(**{**GPT.__dict__, "name": "gpt-tied", "has_tied_embeddings": True})


def test_a_tied_output_layer_keeps_its_own_table_only_on_another_stage_and_syncs_it_across_the_pipeline() -> None:
    # One stage: the head is the final norm (2 h) and uses the embedding's table. Four stages: the last keeps
    # its own V h table, whose fp32 gradient (V h x 4 bytes) the first and the last stage all-reduce. With
    # DP 4 under tp-in-node, pipeline neighbours sit 4 GPUs apart: stages 0 and 3 are 12 apart, on two
    # nodes: one NIC each (25 GB/s x 0.9), a ring of 2: 2 hops of 5 us and the table's bytes once.
    h, vocab = 1024, 32000
    one, four = (transformer_profile(TIED, device=round_device(), cluster=two_nodes(), pp=pp, dp=4).layers
                 for pp in (1, 4))
    assert one[-1].param_bytes == 2 * (2 * h)
    assert four[-1].param_bytes == 2 * (vocab * h + 2 * h)
    sync = 2 * 5e-6 + vocab * h * 4 / (22.5 * GB)
    assert four[0].update_s == pytest.approx(one[0].update_s + sync, rel=1e-12)


def test_expert_parallelisms_all_to_all_crosses_the_tier_its_group_spans() -> None:
    # TP 4, EP 4 with EP ranks TP apart: members 4 GPUs apart span 13, two nodes, two members a node.
    # Each rank sends 2/4 of its token copies over its NIC (22.5 GB/s) and 1/4 over NVLink: the NIC
    # decides, S / 45 GB/s (test_collectives.py), after 3 hops of 5 us and a 1 us launch. T = 4096
    # tokens, top-2: S = 8192 copies x h x 2 bytes.
    from tests.spec.test_moe import MOE

    size = 4096 * 2 * 1024 * 2
    ops = layer_ops(MOE, setting(seq_len=4096, tp=4, ep=4, ep_stride=4), moe=True)
    dispatch = next(op for op in ops if op.name == "dispatch")
    assert dispatch.forward_s == pytest.approx(1e-6 + 3 * 5e-6 + size / (45 * GB), rel=1e-12)


def test_a_job_exactly_at_its_memory_budget_fits() -> None:
    run = simulate_training(GPT, device=round_device(), cluster=two_nodes(), global_batch=2)
    peak = run.peak_memory_bytes
    at = simulate_training(GPT, device=round_device(), cluster=two_nodes(), global_batch=2, memory_bytes=peak)
    under = simulate_training(GPT, device=round_device(), cluster=two_nodes(), global_batch=2,
                              memory_bytes=peak - 1.0)
    assert (at.peak_memory_bytes, at.fits, under.fits) == (peak, True, False)


def test_pp_in_node_numbers_pipeline_stages_first_then_tp_then_cp() -> None:
    # pp-in-node: GPU = stage + pp (tp rank + tp (cp rank + cp dp rank)). With PP 4, TP 2, CP 2, DP 2 a CP
    # neighbour is pp x tp = 8 GPUs on, a DP neighbour pp x tp x cp = 16; the ranks with the same dense
    # weights are the DP x CP = 4 of them, 8 apart. Megatron's tp-in-node: TP first, so CP is tp = 2 on.
    layout = Parallelism(tp=2, pp=4, dp=2, cp=2, placement="pp-in-node")
    assert (layout.cp_stride, layout.strides) == (8, (4, 1, 16))
    assert layout.data_group == Group(4, 8)
    assert Parallelism(tp=2, pp=4, dp=2, cp=2).cp_stride == 2


def test_tp_overlap_leaves_each_sequence_parallel_collective_only_what_outlasts_its_gemm() -> None:
    # TP 4 inside a node of two_nodes(compute_share=0.25), ideal device: an all-gather or reduce-scatter
    # of T h e = 2048 x 1024 x 2 bytes is a ring, 3 hops of 1 us + 3/4 x 4,194,304 / 240e9 = 16.1072 us.
    # Beside a GEMM of g seconds it costs max(g + 0.25 c, c) - g: QKV (2 x 2048 x 384 x 1024 / 1e14 =
    # 16.106 us) and FC2 (k = 3584 / 4: 37.581 us) hide it but their 0.25 c share; the projection
    # (k = 1024 / 4: 10.737 us) is shorter than it, so c - g shows. The same on the input-gradient side.
    comm = 3e-6 + 0.75 * 2048 * 1024 * 2 / (240 * GB)
    qkv, projection, fc2 = (2 * 2048 * n * k / PEAK for n, k in ((384, 1024), (1024, 256), (1024, 896)))
    fields = {"device": ideal_device(), "cluster": two_nodes(compute_share=0.25), "tp": 4, "sequence_parallel": True}
    plain, overlapped = layer_ops(LLAMA, setting(**fields)), layer_ops(LLAMA, setting(**fields, tp_overlap=True))
    assert [op.name for op in plain if op.kind == "collective"] == ["tp-all-gather", "tp-reduce-scatter"] * 2
    hidden = [op for op in overlapped if op.kind == "collective"]
    assert [op.name for op in hidden] == ["tp-all-gather (overlapped)", "tp-reduce-scatter (overlapped)"] * 2
    for op, exposed in zip(hidden, (0.25 * comm, comm - projection, 0.25 * comm, 0.25 * comm), strict=True):
        assert op.forward_s == pytest.approx(exposed, rel=1e-9) and op.input_grad_s == pytest.approx(exposed, rel=1e-9)
    assert qkv + 0.25 * comm > comm > projection + 0.25 * comm and fc2 > comm  # both branches taken
    # The GEMMs and every other op keep their times.
    assert [op for op in overlapped if op.kind != "collective"] == [op for op in plain if op.kind != "collective"]
    # The head's all-gather before the logits (T x h x V/t = 2048 x 1024 x 8000: 33.554 us) is hidden the same way.
    head = {op.name: op for op in head_ops(LLAMA, setting(**fields, tp_overlap=True))}
    assert 2 * 2048 * 1024 * 8000 / PEAK > comm
    assert head["tp-all-gather (overlapped)"].forward_s == pytest.approx(0.25 * comm, rel=1e-9)


def test_tp_overlap_needs_sequence_parallelism() -> None:
    with pytest.raises(ConfigError, match="sequence-parallel") as refused:
        transformer_profile(LLAMA, device=round_device(), cluster=two_nodes(), tp=4, tp_overlap=True)
    assert refused.value.field == "tp_overlap"
