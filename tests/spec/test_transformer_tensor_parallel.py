"""A transformer profile under tensor parallelism, against hand arithmetic: the head's logits split over
the TP ranks by vocabulary (Megatron's vocabulary-parallel cross-entropy), and the hidden states a
layer hands on, whole on every rank unless sequence parallelism splits them."""

from __future__ import annotations

import pytest

import pipesim


def test_the_head_splits_its_logits_over_the_tensor_parallel_ranks() -> None:
    # GPT-3 175B on A100s at the default half of their 312 TFLOP/s: logits of one microbatch are
    # 2 b s h V = 2 x 2048 x 12288 x 50257 FLOPs, an eighth of it on each of 8 TP ranks, for the
    # forward, the input gradient and the weight gradient alike.
    rate = 312e12 * 0.5
    logits = 2 * 2048 * 12288 * 50257 / rate
    one = pipesim.transformer_profile("gpt3-175b", device="a100-80gb", tp=1).layers[-1]
    eight = pipesim.transformer_profile("gpt3-175b", device="a100-80gb", tp=8).layers[-1]
    assert one.name == eight.name == "head"
    assert one.forward_s == pytest.approx(logits, rel=1e-12)
    assert eight.forward_s == pytest.approx(logits / 8, rel=1e-12)
    assert eight.backward_weight_s == pytest.approx(logits / 8, rel=1e-12)
    # The input gradient also carries half a ring all-reduce of the hidden states (b s h bf16 values
    # over 8 GPUs at 600 GB/s), as the embedding's forward does.
    allreduce = 2 * 7 / 8 * (2048 * 12288 * 2) / 600e9
    assert eight.backward_input_s == pytest.approx(logits / 8 + allreduce / 2, rel=1e-12)


@pytest.mark.parametrize(("sequence_parallel", "share"), [(False, 1), (True, 8)])
def test_a_layer_hands_on_its_hidden_states_whole_unless_sequence_parallel(sequence_parallel: bool,
                                                                           share: int) -> None:
    # b s h bf16 values: 1 x 2048 x 12288 x 2 bytes = 50,331,648; after the layer's all-reduce every
    # TP rank holds them whole, and sequence parallelism leaves each rank an eighth of the sequence.
    layer = pipesim.transformer_profile("gpt3-175b", device="a100-80gb", tp=8,
                                        sequence_parallel=sequence_parallel).layers[1]
    assert layer.activation_bytes == 50_331_648 / share
