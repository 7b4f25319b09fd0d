"""Transformer profiles against the closed forms of the papers they come from."""

from __future__ import annotations

from dataclasses import replace

import pytest

import pipesim
from pipesim.errors import ConfigError
from pipesim.spec.transformer import (
    PRESETS,
    TransformerConfig,
    forward_flops_per_token,
    head_forward_flops,
    layer_activation_bytes,
    layer_forward_flops,
    layer_parameters,
    parameters,
)

# Megatron-LM's GPT configurations (Narayanan et al., SC'21, Table 1): layers, hidden, heads.
MEGATRON_GPT = [(24, 2304, 24), (30, 3072, 32), (36, 4096, 32), (40, 6144, 48), (48, 8192, 64), (60, 10240, 80),
                (80, 12288, 96), (96, 16384, 128), (105, 20480, 128), (128, 25600, 160)]


def megatron_gpt(layers: int, hidden: int, heads: int) -> TransformerConfig:
    return TransformerConfig(name="gpt", num_layers=layers, hidden_size=hidden, ffn_hidden_size=4 * hidden,
                             num_heads=heads, num_kv_heads=heads, vocab_size=51200, seq_len=2048,
                             has_tied_embeddings=True, has_bias=True, num_positions=2048)


@pytest.mark.parametrize("name", [name for name in PRESETS if name != "bert-large"])
def test_preset_parameters_within_one_percent_of_the_published_size(name: str) -> None:
    config = PRESETS[name]
    assert parameters(config) == pytest.approx(config.published_parameters, rel=0.01)


def test_bert_parameters_round_to_the_papers_two_significant_figures() -> None:
    """Devlin et al. give sizes to two significant figures: "340M" is any count in [335M, 345M).

    BERT-large: embeddings 31,782,912 (30522 x 1024 tokens, 512 x 1024 positions, 2 x 1024 token
    types, a 2 x 1024 norm), 24 layers of 12h^2 + 13h = 12,596,224, pooler 1,049,600: 335,141,888;
    the MLM head (an h x h transform, its norm, the output bias; the decoder is the tied
    embedding) adds 1,082,170: 336,224,058, 1.1% under 340M and within its rounding. BERT-base
    (L=12, H=768, A=12) counts 109,482,240 + 622,650 the same way, the paper's "110M".
    """
    large = PRESETS["bert-large"]
    assert parameters(large) == 31_782_912 + 24 * 12_596_224 + 1_049_600 + 1_082_170
    base = replace(large, name="bert-base", num_layers=12, hidden_size=768, ffn_hidden_size=3072, num_heads=12,
                   num_kv_heads=12, published_parameters=110e6)
    assert parameters(base) == 109_482_240 + 622_650
    for config, mlm_head in ((large, 1_082_170), (base, 622_650)):
        for count in (parameters(config), parameters(config) - mlm_head):
            assert float(f"{count:.2g}") == config.published_parameters


def test_gpt_layer_parameters_are_12h2_plus_13h() -> None:
    h = 12288
    assert layer_parameters(PRESETS["gpt3-175b"]) == 12 * h**2 + 13 * h


@pytest.mark.parametrize(("layers", "hidden", "heads"), MEGATRON_GPT)
def test_flops_equal_megatron_closed_form(layers: int, hidden: int, heads: int) -> None:
    # Narayanan et al. (SC'21), eq. (3): with full recomputation an iteration costs
    # F = 96 B s l h^2 (1 + s/6h + V/16lh): four passes over the layers (forward, recomputed
    # forward, backward twice the forward) and three over the logit layer. Per token, forward
    # alone is therefore 24 l h^2 (1 + s/6h) + 2 V h.
    config = megatron_gpt(layers, hidden, heads)
    s, h, v, l = 2048, hidden, 51200, layers
    matmul, attention = layer_forward_flops(config, tokens=1, seq_len=s)
    logits = head_forward_flops(config, tokens=1)
    paper = 96 * l * h**2 * (1 + s / (6 * h) + v / (16 * l * h))
    assert 4 * l * (matmul + attention) + 3 * logits == pytest.approx(paper, rel=1e-12)
    assert forward_flops_per_token(config) == pytest.approx(24 * l * h**2 * (1 + s / (6 * h)) + 2 * v * h, rel=1e-12)


@pytest.mark.parametrize("t", [1, 2, 8])
def test_activation_bytes_per_layer_equal_korthikanti(t: int) -> None:
    # Korthikanti et al. 2022, Reducing Activation Recomputation in Large Transformer Models, Table 2.
    config = PRESETS["gpt3-175b"]
    s, b, h, a = 2048, 1, 12288, 96
    sbh = s * b * h

    def stash(**options: object) -> float:
        return layer_activation_bytes(config, microbatch_size=b, seq_len=s, tp=t, **options)  # type: ignore[arg-type]

    assert stash() == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12)
    assert stash(sequence_parallel=True) == pytest.approx(sbh / t * (34 + 5 * a * s / h), rel=1e-12)
    assert stash(recompute="selective") == pytest.approx(sbh * (10 + 24 / t), rel=1e-12)
    assert stash(recompute="selective", sequence_parallel=True) == pytest.approx(34 * sbh / t, rel=1e-12)
    assert stash(recompute="full") == 2 * sbh
    if t == 1:
        assert stash() == pytest.approx(sbh * (34 + 5 * a * s / h), rel=1e-12)


def test_profile_layers_carry_embedding_and_head_and_their_weights() -> None:
    profile = pipesim.transformer_profile("llama3-8b", device="h100", microbatch_size=2, seq_len=4096)
    assert [layer.name for layer in profile.layers[:2]] == ["embedding", "layer0"]
    assert profile.layers[-1].name == "head" and profile.num_layers == 32 + 2
    config = PRESETS["llama3-8b"]
    block = profile.layers[1]
    assert block.param_bytes == 2 * layer_parameters(config)
    assert block.backward_s == pytest.approx(block.backward_input_s + block.backward_weight_s)
    assert profile.has_split_backward
    # Every product at the device's best would take 2 x FLOPs / peak; the ops take longer, never shorter.
    tokens, h = 2 * 4096, 4096
    matmul = 2 * tokens * (h * (h + 2 * 1024) + h * h + 3 * h * 14336)
    assert block.forward_s > matmul / 989.4e12 and block.backward_weight_s > matmul / 989.4e12


def test_tensor_parallel_divides_compute_and_adds_two_allreduces_each_way() -> None:
    from pipesim.spec.transformer_profile import layer_op_costs

    ops = layer_op_costs("gpt3-175b", device="a100-80gb", tp=8)
    reductions = [op for op in ops if op.kind == "collective"]
    # 2 all-reduces of b s h bf16 values (2048 x 12288 x 2 bytes) a direction, ring over the 8 GPUs of a DGX
    # A100 node: 2 (n-1) hops of 1 us and 2 (n-1)/n x bytes at NVLink's 300 GB/s x 0.77, plus a launch.
    ring = 2 * 7 * 1e-6 + 2 * 7 / 8 * (2048 * 12288 * 2) / (300e9 * 0.77)
    launch = pipesim.load_device("a100-80gb").launch_s
    assert [op.forward_s for op in reductions] == [pytest.approx(ring + launch)] * 2
    assert [op.input_grad_s for op in reductions] == [pytest.approx(ring + launch)] * 2
    one = {op.name: op for op in layer_op_costs("gpt3-175b", device="a100-80gb", tp=1)}
    eight = {op.name: op for op in ops}
    assert eight["fc1"].forward_s < one["fc1"].forward_s / 7  # an eighth of the product, a little waste


def test_recompute_moves_forward_time_into_the_backward() -> None:
    none, full, selective = (pipesim.transformer_profile("llama2-7b", recompute=mode, attention="unfused").layers[1]
                             for mode in ("none", "full", "selective"))
    assert full.backward_s == pytest.approx(none.backward_s + none.forward_s, rel=1e-12)
    assert none.backward_s < selective.backward_s < full.backward_s
    assert full.stashed_bytes < selective.stashed_bytes < none.stashed_bytes
    flash = pipesim.transformer_profile("llama2-7b", recompute="none").layers[1]
    assert flash.stashed_bytes == selective.stashed_bytes  # a fused attention keeps no scores


@pytest.mark.parametrize(("options", "field"), [({"tp": 3}, "tp"), ({"tp": 64}, "tp"), ({"microbatch_size": 0}, "microbatch_size"),
                                                 ({"recompute": "some"}, "recompute"), ({"device": "tpu"}, "device")])
def test_bad_options_name_the_field(options: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as error:
        pipesim.transformer_profile("llama3-8b", **options)  # type: ignore[arg-type]
    assert error.value.field == field


def test_calibration_recovers_the_efficiency_of_a_measured_profile() -> None:
    measured = pipesim.transformer_profile("bert-large", device="v100", efficiency=0.37)
    assert pipesim.calibrated_efficiency(measured, "bert-large", device="v100") == pytest.approx(0.37, rel=0.02)


def test_a_sweep_spec_takes_a_model_in_place_of_a_profile() -> None:
    from pipesim.sweep import PointRunner, Resolved, parse_spec

    spec = {"stages": [2], "microbatches": [4], "schedule": ["1f1b"], "memory_limit": ["80GB"]}
    named = Resolved(parse_spec({**spec, "model": "bert-large"}))
    detailed = Resolved(parse_spec({**spec, "profile": [{"model": {"preset": "llama3-8b", "tp": 2, "seq_len": 1024,
                                                                    "recompute": "selective"}}]}))
    assert named.profiles[0][1] == pipesim.transformer_profile("bert-large")
    assert detailed.profiles[0][1] == pipesim.transformer_profile("llama3-8b", tp=2, seq_len=1024,
                                                                  recompute="selective")
    row = PointRunner(detailed).run_batch(detailed.points())[0]
    direct = pipesim.simulate(detailed.profiles[0][1], schedule="1f1b", num_stages=2, num_microbatches=4, engine="auto")
    assert (row["error"], row["iteration_time_s"]) == ("", direct.metrics.iteration_time_s)
    with pytest.raises(ConfigError):
        parse_spec({**spec, "model": "bert-large", "profile": ["traces/vgg16.json"]})
    with pytest.raises(ConfigError):
        parse_spec({**spec, "profile": [{"model": {"preset": "bert-large"}, "uniform": {"layers": 1, "forward_ms": 1,
                                                                                         "backward_ms": 1}}]})


def test_search_drops_a_recompute_mode_only_when_simulating_it_would_be_over_budget() -> None:
    from pipesim.search import search
    from pipesim.spec.parallel import data_parallel_profile
    from pipesim.spec.transformer_profile import ADAM_STATE_MULTIPLIER

    budget = 36e9
    outcomes = search("llama3-8b", device="a100-40gb", num_gpus=4, global_batch=8, seq_len=2048, memory_bytes=budget)
    inferred = [o for o in outcomes if o.reason.startswith("over budget: it stashes more")]
    assert inferred and any(o.fits for o in outcomes)
    for outcome in inferred[:4]:
        c = outcome.candidate
        profile = data_parallel_profile(pipesim.transformer_profile("llama3-8b", device="a100-40gb", seq_len=2048,
                                                                    tp=c.tp, recompute=c.recompute,
                                                                    microbatch_size=c.microbatch_size), c.dp, 50e9)
        partition = tuple(tuple(int(x) for x in cut.split(":")) for cut in outcome.partition.split(","))
        result = pipesim.simulate(profile, pipesim.Topology.uniform(num_devices=c.pp), schedule=c.schedule,
                                  num_stages=len(partition), num_microbatches=c.num_microbatches,
                                  stages_per_rank=c.stages_per_rank, partition=partition,  # type: ignore[arg-type]
                                  optimizer_state_multiplier=ADAM_STATE_MULTIPLIER, engine="auto")
        assert max(result.metrics.device_peak_memory_bytes) >= outcome.peak_memory_bytes > budget
