"""Recomputation's working memory, the model's input and the loss buffer (issue 18 item 3),
against GPipe's bound and Megatron's activation-memory formulas."""

from __future__ import annotations

from pathlib import Path

import pytest

import pipesim
from pipesim.cli.options import parse_uniform
from pipesim.spec.transformer import PRESETS


def activation_peaks(result: pipesim.Result) -> list[float]:
    """Per stage, what activations take at its peak: the stashed ("activations") and what a
    backward re-creates ("working")."""
    return [stage.peak_breakdown_bytes["activations"] + stage.peak_breakdown_bytes["working"]
            for stage in result.metrics.stages]


@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_gpipe_recomputation_holds_the_stage_inputs_and_one_microbatch_re_created(engine: str) -> None:
    # GPipe (Huang et al., NeurIPS 2019, section 2.3): with re-materialization the peak activation
    # memory is O(N + L/K x N/M): every stage keeps its input for all M microbatches (N samples in
    # all), and the backward of one microbatch re-creates the activations of its L/K layers.
    # Here N = 32 samples, M = 8, n = N/M = 4, one sample's output of a layer x = 1e6 bytes:
    # a = n x per layer and microbatch; the model's input is a sample of the same size.
    num_layers, num_stages, num_microbatches, per_sample = 16, 4, 8, 1e6
    a = 4 * per_sample
    profile = pipesim.uniform_profile(num_layers=num_layers, forward_s=1e-3, backward_s=2e-3, activation_bytes=a,
                                      microbatch_size=4, input_bytes=a)
    topology = pipesim.Topology.uniform(num_devices=num_stages)
    bound = num_microbatches * a + num_layers // num_stages * a  # N x + (L/K)(N/M) x
    recomputed = pipesim.simulate(profile, topology, schedule="gpipe", num_stages=num_stages,
                                  num_microbatches=num_microbatches, recompute=True, engine=engine)
    assert activation_peaks(recomputed) == [bound] * num_stages
    # of which the backward's re-created layers are the working kind, the stashed inputs the rest
    breakdowns = [stage.peak_breakdown_bytes for stage in recomputed.metrics.stages]
    assert [(b["activations"], b["working"]) for b in breakdowns] == \
        [(num_microbatches * a, num_layers // num_stages * a)] * num_stages
    # Without recomputation a stage keeps all of its layers' activations for every microbatch
    # (stage 0 its input too): O(N L/K).
    kept = pipesim.simulate(profile, topology, schedule="gpipe", num_stages=num_stages,
                            num_microbatches=num_microbatches, engine=engine)
    layers = num_layers // num_stages
    assert activation_peaks(kept) == [num_microbatches * (layers + 1) * a] + [num_microbatches * layers * a] * 3


def test_1f1b_recomputation_holds_p_minus_s_inputs_and_one_stage_re_created() -> None:
    # 1F1B keeps min(m, p - s) microbatches in flight on stage s; with recomputation each is its
    # stage input alone, and a backward re-creates the stage's L/K layers for one microbatch.
    profile = pipesim.uniform_profile(num_layers=8, forward_s=1e-3, backward_s=2e-3, activation_bytes=1e6)
    result = pipesim.simulate(profile, schedule="1f1b", num_stages=4, num_microbatches=8, recompute=True)
    assert activation_peaks(result) == [2e6] + [(4 - s) * 1e6 + 2e6 for s in range(1, 4)]


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_megatron_activation_memory_per_layer_and_the_re_created_layer(recompute: str) -> None:
    # Korthikanti et al., Reducing Activation Recomputation in Large Transformer Models (2022),
    # Table 2 and section 5, 16-bit activations, no tensor parallelism: a layer keeps
    # sbh(34 + 5as/h) bytes without recomputation, 34 sbh with selective, 2 sbh (its input) with
    # full. What the paper's totals leave out is the working memory of the backward: Megatron
    # checkpoints per layer, so a layer's backward re-creates its own dropped activations
    # (5as^2b with selective, sbh(34 + 5as/h) - 2sbh with full) and holds them while it runs.
    config = PRESETS["gpt3-175b"]
    s, b, h, a = 2048, 1, config.hidden_size, config.num_heads
    sbh = s * b * h
    per_layer = {"none": sbh * (34 + 5 * a * s / h), "selective": 34 * sbh, "full": 2 * sbh}[recompute]
    working = sbh * (34 + 5 * a * s / h) - per_layer
    profile = pipesim.transformer_profile(config, device="a100-80gb", microbatch_size=b, seq_len=s, attention="unfused",
                                          recompute=recompute, include_embeddings=False)  # type: ignore[arg-type]
    # GPipe, 4 stages of 24 layers, 2 microbatches: both are stashed when the first backward starts.
    result = pipesim.simulate(profile, schedule="gpipe", num_stages=4, num_microbatches=2)
    for peak in activation_peaks(result):
        assert peak == pytest.approx(2 * 24 * per_layer + working, rel=1e-12)


def test_the_model_input_and_the_loss_buffer_stay_whatever_the_recomputation() -> None:
    profile = parse_uniform("layers=4,forward_ms=1,backward_ms=2,activation_bytes=100,input_bytes=30,loss_bytes=7")
    assert (profile.input_bytes, profile.loss_bytes) == (30.0, 7.0)
    # GPipe, 2 stages of 2 layers, 3 microbatches in flight.
    kept = pipesim.simulate(profile, schedule="gpipe", num_stages=2, num_microbatches=3)
    assert activation_peaks(kept) == [3 * (200 + 30), 3 * (200 + 7)]
    recomputed = pipesim.simulate(profile, schedule="gpipe", num_stages=2, num_microbatches=3, recompute=True)
    assert activation_peaks(recomputed) == [3 * 30 + 200, 3 * (100 + 7) + 200]
    # The transformer's: its token ids (int64) on stage 0 and its fp32 logits on the last stage.
    model = pipesim.transformer_profile("llama3-8b", microbatch_size=2, seq_len=1024, tp=2)
    assert (model.input_bytes, model.loss_bytes) == (8 * 2 * 1024, 4 * 2 * 1024 * 128256 / 2)


def test_a_profile_input_layer_is_kept_by_recomputation() -> None:
    # PipeDream's graph.txt profiles carry the input as a layer of their own (no time, no weights).
    profile = pipesim.load_profile(Path(__file__).resolve().parents[2] / "traces" / "alexnet.json")
    data = profile.layers[0]
    assert data.forward_s == data.backward_s == data.param_bytes == 0 and data.stashed_bytes > 0
    result = pipesim.simulate(profile, schedule="gpipe", num_stages=2, num_microbatches=2, recompute=True)
    # Stage 0 keeps the input for both microbatches, and re-creates the rest of its layers.
    end = result.plan.partition[0][1]
    again = sum(layer.stashed_bytes for layer in profile.layers[1:end])
    assert activation_peaks(result)[0] == 2 * data.stashed_bytes + again


def test_tensor_parallelism_divides_the_loss_buffer_and_the_re_created_bytes_not_the_input() -> None:
    from pipesim.spec.parallel import tensor_parallel_profile

    model = pipesim.transformer_profile("llama3-8b", microbatch_size=1, seq_len=1024, recompute="selective",
                                        attention="unfused")
    # Selective recomputation re-creates the attention scores: without dropout (Llama) the softmax
    # output alone, 2 bytes a score, a s^2 b of them.
    assert model.layers[1].recomputed_bytes == 2 * 32 * 1024 * 1024
    split = tensor_parallel_profile(model, 4, 900e9)
    assert split.layers[1].recomputed_bytes == model.layers[1].recomputed_bytes / 4  # type: ignore[operator]
    assert (split.input_bytes, split.loss_bytes) == (model.input_bytes, model.loss_bytes / 4)  # type: ignore[operator]
