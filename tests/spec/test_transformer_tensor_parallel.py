"""A transformer profile under tensor parallelism, against hand arithmetic: the head's logits split over
the TP ranks by vocabulary (Megatron's vocabulary-parallel cross-entropy), and the hidden states a
layer hands on: each TP rank sends its share, gathered on arrival unless sequence parallelism keeps
them split."""

from __future__ import annotations

import pytest

import pipesim
from pipesim.spec.layout import Parallelism
from pipesim.spec.transformer_profile import pipeline_bandwidth_bytes_per_s
from tests.support.cost_fixtures import free_links, ideal_device, two_nodes


def test_the_head_splits_its_logits_over_the_tensor_parallel_ranks() -> None:
    # Llama 2 7B at s = 2048 on the ideal device (a product takes 2 m n k / 100 TFLOP/s, memory and links
    # free): the logits of one microbatch are 2 b s h V = 2 x 2048 x 4096 x 32000 FLOPs, an eighth of it
    # on each of 8 TP ranks, for the forward, the input gradient and the weight gradient alike.
    logits = 2 * 2048 * 4096 * 32000 / 100e12
    one, eight = (pipesim.transformer_profile("llama2-7b", device=ideal_device(), cluster=free_links(), seq_len=2048,
                                              tp=tp).layers[-1] for tp in (1, 8))
    assert one.name == eight.name == "head"
    for head, tp in ((one, 1), (eight, 8)):
        assert head.forward_s == pytest.approx(logits / tp, rel=1e-9)
        assert head.backward_input_s == pytest.approx(logits / tp, rel=1e-9)
        assert head.backward_weight_s == pytest.approx(logits / tp, rel=1e-9)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_a_layer_hands_on_its_share_gathered_on_arrival_unless_sequence_parallel(sequence_parallel: bool) -> None:
    # b s h bf16 values: 1 x 2048 x 4096 x 2 bytes = 16,777,216; each of 8 TP ranks sends an eighth.
    layer = pipesim.transformer_profile("llama2-7b", device=ideal_device(), cluster=two_nodes(), seq_len=2048, tp=8,
                                        sequence_parallel=sequence_parallel).layers[1]
    assert layer.activation_bytes == 16_777_216 / 8
    # PP 2 after TP 8 (tp-in-node): the next stage is a node away, over InfiniBand at 25 GB/s x 0.9. Without
    # sequence parallelism the receiving ranks all-gather the eighths over NVLink (240 GB/s bus): 7 of the 8
    # shares arrive there, so each byte sent costs 1 / 22.5e9 + 7 / 240e9 seconds.
    rate = pipeline_bandwidth_bytes_per_s(two_nodes(), Parallelism(tp=8, pp=2), sequence_parallel=sequence_parallel)
    assert rate == pytest.approx(22.5e9 if sequence_parallel else 1 / (1 / 22.5e9 + 7 / 240e9), rel=1e-12)
