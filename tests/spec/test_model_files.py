"""Model files: Hugging Face config.json and pipesim.model/1 against published sizes and closed forms.

The fixtures in tests/data/hf_configs reproduce public models' configurations (SOURCES.md names
each model card). Parameter counts are checked against the sizes their authors publish, and
against closed forms written out here from the architectures (not from pipesim's code).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import pipesim
from pipesim.errors import ConfigError
from pipesim.spec.model_files import load_model, model_from_hf_config, model_from_json, model_to_json
from pipesim.spec.transformer import PRESETS, TransformerConfig, forward_flops_per_token, parameters

FIXTURES = Path(__file__).parent.parent / "data" / "hf_configs"


def fixture(name: str) -> Path:
    return FIXTURES / name / "config.json"


def fixture_data(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(fixture(name).read_text())
    return data


def write(tmp_path: Path, data: Any, name: str = "config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def refusal(path: str) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load_model(path)
    assert "\n" not in str(caught.value)
    return caught.value


# (fixture, published size, where: see SOURCES.md)
PUBLISHED = [
    ("gpt2", 124e6), ("gpt2-xl", 1.56e9), ("Llama-2-7b-hf", 6.74e9), ("Meta-Llama-3-8B", 8.03e9),
    ("Mistral-7B-v0.1", 7.24e9), ("Qwen2-7B", 7.62e9), ("gpt-neox-20b", 20.6e9), ("bloom-560m", 559e6),
    ("bloom", 176.247e9), ("opt-66b", 66e9), ("Phi-3-mini-4k-instruct", 3.8e9), ("gemma-7b", 8.54e9),
    ("gemma-2-9b", 9.24e9), ("Mixtral-8x7B-v0.1", 46.7e9), ("Qwen1.5-MoE-A2.7B", 14.3e9), ("DeepSeek-V2-Lite", 15.7e9),
    ("DeepSeek-V2", 236e9), ("DeepSeek-V3", 671e9), ("Qwen3-8B", 8.2e9), ("Qwen3-30B-A3B", 30.5e9),
]


@pytest.mark.parametrize(("name", "published"), PUBLISHED)
def test_parameters_within_one_percent_of_the_published_size(name: str, published: float) -> None:
    assert parameters(load_model(str(fixture(name)))) == pytest.approx(published, rel=0.01)


def test_exact_counts_where_the_authors_give_every_digit() -> None:
    # BLOOM's model card: 176,247,271,424 parameters. Gemma's reports split embedding and the rest:
    # 7,751,248,896 and 8,324,201,984 outside the embedding (256,000 x h here; the reports pad the
    # vocabulary of Gemma 1 to 256,128, which is why only the non-embedding part is compared).
    assert parameters(load_model(str(fixture("bloom")))) == 176_247_271_424
    assert parameters(load_model(str(fixture("gemma-7b")))) - 256_000 * 3072 == 7_751_248_896
    assert parameters(load_model(str(fixture("gemma-2-9b")))) - 256_000 * 3584 == 8_324_201_984


def test_opt_1_3b_rounds_to_the_papers_two_significant_figures() -> None:
    # OPT's Table 1 gives "1.3B", two significant figures: embeddings 50272 x 2048 and 2050 x 2048
    # (OPT's positions are offset by 2), 24 layers of 12h^2 + 13h, a final norm 2h: 1,315,758,080,
    # 1.2% over 1.3B and inside its rounding, as BERT's 340M is in test_transformer.py.
    h = 2048
    count = parameters(load_model(str(fixture("opt-1.3b"))))
    assert count == 50272 * h + 2050 * h + 24 * (12 * h * h + 13 * h) + 2 * h
    assert float(f"{count:.2g}") == 1.3e9


def test_qwen3_closed_form_and_the_cards_non_embedding_count() -> None:
    # Qwen3-8B's model card: 8.2B parameters, 6.95B without the embeddings. 36 layers of GQA with
    # head_dim 128 (32 query heads, 8 KV heads: Q and the projection 4096 wide, K and V 1024 each,
    # no biases), a SwiGLU FFN of 12288, two RMSNorms; untied embeddings of 151936 x 4096.
    h, f, vocab = 4096, 12288, 151936
    layer = h * 4096 + 2 * h * 1024 + 4096 * h + 3 * h * f + 2 * h
    count = parameters(load_model(str(fixture("Qwen3-8B"))))
    assert count == 2 * vocab * h + 36 * layer + h == 8_190_726_144
    assert float(f"{(count - 2 * vocab * h) / 1e9:.3g}") == 6.95
    # Without a head_dim key (here at h = 2048 and 32 heads), transformers' Qwen3Config says 128;
    # Qwen3MoeConfig has no default, so its attention takes h / heads (None here).
    moe = {key: value for key, value in fixture_data("Qwen3-30B-A3B").items() if key != "head_dim"}
    dense = {key: value for key, value in moe.items() if key != "num_experts"}
    assert model_from_hf_config({**dense, "model_type": "qwen3"}, source="qwen3").head_size == 128
    assert model_from_hf_config(moe, source="qwen3_moe").head_size is None


def test_falcon_closed_forms() -> None:
    # Falcon-7B: multi-query (one K and one V head of d = 64), parallel attention and MLP under one
    # shared LayerNorm, no biases, tied embedding. Falcon-40B: 8 KV heads, two norms a layer.
    h, d, f = 4544, 64, 4 * 4544
    layer = h * (h + 2 * d) + h * h + 2 * h * f + 2 * h
    assert parameters(load_model(str(fixture("falcon-7b")))) == 65024 * h + 32 * layer + 2 * h
    h, d, f = 8192, 64, 4 * 8192
    layer = h * (h + 2 * 8 * d) + h * h + 2 * h * f + 2 * 2 * h
    assert parameters(load_model(str(fixture("falcon-40b")))) == 65024 * h + 60 * layer + 2 * h


@pytest.mark.parametrize(("preset", "name"), [
    ("llama2-7b", "Llama-2-7b-hf"), ("llama2-70b", "Llama-2-70b-hf"), ("llama3-8b", "Meta-Llama-3-8B"),
    ("llama3-70b", "Meta-Llama-3-70B"), ("llama3-405b", "Meta-Llama-3.1-405B"),
])
def test_presets_equal_their_hugging_face_configs(preset: str, name: str) -> None:
    expected, read = PRESETS[preset], load_model(str(fixture(name)))
    assert parameters(read) == parameters(expected)
    assert forward_flops_per_token(read, expected.seq_len) == forward_flops_per_token(expected)
    same_labels = {"name": expected.name, "source": expected.source,
                   "published_parameters": expected.published_parameters, "seq_len": expected.seq_len}
    assert dataclasses.replace(read, **same_labels) == expected


def test_gpt3_preset_equals_a_gpt2_config_of_its_shape(tmp_path: Path) -> None:
    # GPT-3 has no public config.json; it is GPT-2's architecture at 96 x 12288 with 2048 positions.
    data = {"model_type": "gpt2", "n_embd": 12288, "n_layer": 96, "n_head": 96, "n_positions": 2048,
            "vocab_size": 50257}
    expected, read = PRESETS["gpt3-175b"], load_model(write(tmp_path, data))
    assert parameters(read) == parameters(expected)
    assert forward_flops_per_token(read) == forward_flops_per_token(expected)
    assert dataclasses.replace(read, name=expected.name, source=expected.source,
                               published_parameters=expected.published_parameters) == expected


def test_what_the_readers_take_from_each_architecture() -> None:
    qwen, neox, bloom = (load_model(str(fixture(name))) for name in ("Qwen2-7B", "gpt-neox-20b", "bloom"))
    assert (qwen.has_bias, qwen.has_qkv_bias, qwen.has_rotary, qwen.num_kv_heads) == (False, True, True, 4)
    assert (neox.has_parallel_layers, neox.has_rotary, neox.has_tied_embeddings, neox.has_bias) == (
        True, True, False, True)
    assert not neox.has_dropout  # its legacy *_dropout_prob keys are not the ones transformers reads
    assert (bloom.has_embedding_norm, bloom.has_rotary, bloom.num_positions, bloom.seq_len) == (True, False, 0, 2048)
    assert load_model(str(fixture("gpt2"))).name == "gpt2"  # a config.json is labelled by its folder


@pytest.mark.parametrize(("attention_bias", "mlp_bias", "biases"), [
    (False, True, 2 * 96 + 32),  # gate and up (f each) and down (h)
    (True, False, 32 + 2 * 8 + 32),  # Q (h), K and V (g d = 8 each), the projection (h)
    (True, True, 32 + 2 * 8 + 32 + 2 * 96 + 32),
])
def test_llama_biases(tmp_path: Path, attention_bias: bool, mlp_bias: bool, biases: int) -> None:
    data = {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
            "num_key_value_heads": 1, "intermediate_size": 96, "vocab_size": 10, "attention_bias": attention_bias,
            "mlp_bias": mlp_bias}
    h, kv, f = 32, 8, 96
    plain = 2 * 10 * h + h * (h + 2 * kv) + h * h + 3 * h * f + 2 * h + h
    assert parameters(load_model(write(tmp_path, data))) == plain + biases


@pytest.mark.parametrize(("model_type", "tied"), [
    ("llama", False), ("mistral", False), ("qwen2", False), ("phi3", False), ("gemma", True), ("gemma2", True),
])
def test_absent_keys_follow_the_transformers_defaults_of_decoders(tmp_path: Path, model_type: str,
                                                                  tied: bool) -> None:
    data = {"model_type": model_type, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 128, "vocab_size": 100}
    config = load_model(write(tmp_path, data))
    assert config.num_kv_heads == 4  # num_key_value_heads absent: multi-head attention
    assert config.has_tied_embeddings is tied
    assert config.head_dim == (256 if model_type.startswith("gemma") else 16)


def test_absent_keys_follow_the_transformers_defaults_of_the_others(tmp_path: Path) -> None:
    gpt2 = load_model(write(tmp_path, {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4,
                                       "n_inner": None, "vocab_size": 100}))
    assert (gpt2.ffn_hidden_size, gpt2.num_positions, gpt2.has_tied_embeddings, gpt2.has_dropout) == (
        256, 1024, True, True)
    base = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100}
    neox = load_model(write(tmp_path, {"model_type": "gpt_neox", "intermediate_size": 256, **base}))
    assert (neox.has_tied_embeddings, neox.has_parallel_layers, neox.seq_len) == (False, True, 2048)
    opt = load_model(write(tmp_path, {"model_type": "opt", "ffn_dim": 256, **base}))
    assert (opt.has_tied_embeddings, opt.num_positions, opt.ffn_activation) == (True, 2050, "relu")
    falcon = load_model(write(tmp_path, {"model_type": "falcon", **base}))
    assert (falcon.num_kv_heads, falcon.num_layer_norms, falcon.has_bias, falcon.ffn_hidden_size) == (1, 1, False, 256)


def test_own_json_round_trips_exactly(tmp_path: Path) -> None:
    configs = [*PRESETS.values(), *(load_model(str(path)) for path in FIXTURES.glob("*/config.json"))]
    for config in configs:
        text = model_to_json(config)
        path = tmp_path / f"{config.name}.json"
        path.write_text(text)
        read = load_model(str(path))
        assert read == config
        assert model_to_json(read) == text
    assert json.loads(model_to_json(PRESETS["llama3-8b"]))["schema"] == "pipesim.model/1"


def test_package_exports_load_model() -> None:
    assert pipesim.load_model("LLaMA3-8B") == PRESETS["llama3-8b"]


# --- refusals: one line naming the field, the value and the rule -----------------------------


def test_a_mixture_of_experts_pipesim_does_not_read_is_refused(tmp_path: Path) -> None:
    error = refusal(write(tmp_path, {**fixture_data("Mixtral-8x7B-v0.1"), "model_type": "dbrx"}))
    assert (error.field, error.value) == ("model_type", "dbrx")
    assert "mixture of experts pipesim does not read (it reads mixtral, qwen2_moe, qwen3_moe, deepseek_v2, " \
        "deepseek_v3)" in error.rule
    experts = {**fixture_data("Phi-3-mini-4k-instruct"), "num_local_experts": 8}
    error = refusal(write(tmp_path, experts))
    assert (error.field, error.value) == ("num_local_experts", 8) and "reads for mixtral" in error.rule


@pytest.mark.parametrize(("name", "key", "value", "rule"), [
    ("Mixtral-8x7B-v0.1", "num_local_experts", None, "is required in a mixtral config.json"),
    ("Mixtral-8x7B-v0.1", "num_experts_per_tok", 9, "must be <= the routed experts (8)"),
    ("Qwen1.5-MoE-A2.7B", "shared_expert_intermediate_size", None, "is required in a qwen2_moe config.json"),
    ("Qwen1.5-MoE-A2.7B", "decoder_sparse_step", 2, "must be 1: every layer a mixture of experts"),
    ("Qwen1.5-MoE-A2.7B", "mlp_only_layers", [0], "must be empty"),
    ("Qwen3-30B-A3B", "num_experts", None, "is required in a qwen3_moe config.json"),
    ("Qwen3-30B-A3B", "mlp_only_layers", [0, 47], "must be empty"),
    ("Qwen3-30B-A3B", "decoder_sparse_step", 2, "must be 1: every layer a mixture of experts"),
    ("DeepSeek-V3", "first_k_dense_replace", None, "is required in a deepseek_v3 config.json"),
    ("DeepSeek-V3", "moe_layer_freq", 2, "must be 1"),
    ("DeepSeek-V3", "num_key_value_heads", 16, "must equal num_attention_heads (128)"),
    ("DeepSeek-V2", "attention_bias", True, "is not modelled for latent attention"),
])
def test_an_moe_config_breaking_a_rule_is_refused_naming_the_key(tmp_path: Path, name: str, key: str, value: Any,
                                                                 rule: str) -> None:
    data = fixture_data(name)
    if value is None:
        del data[key]
    else:
        data[key] = value
    error = refusal(write(tmp_path, data))
    assert error.field == key and rule in error.rule


def test_unknown_model_type_lists_the_known_ones(tmp_path: Path) -> None:
    error = refusal(write(tmp_path, {**fixture_data("Llama-2-7b-hf"), "model_type": "t5"}))
    assert (error.field, error.value) == ("model_type", "t5")
    for known in ("llama", "mistral", "qwen2", "gpt2", "gpt_neox", "bloom", "opt", "falcon", "phi3", "gemma2"):
        assert known in error.rule


@pytest.mark.parametrize(("value", "rule"), [(4096.5, "must be an integer"), ("4096", "must be an integer"),
                                             (True, "must be an integer"), (0, "must be >= 1")])
def test_non_integer_hidden_size_is_refused(tmp_path: Path, value: Any, rule: str) -> None:
    error = refusal(write(tmp_path, {**fixture_data("Llama-2-7b-hf"), "hidden_size": value}))
    assert (error.field, error.value, error.rule) == ("hidden_size", value, rule)
    assert str(tmp_path) in str(error)  # names the file


def test_heads_that_do_not_divide_are_refused(tmp_path: Path) -> None:
    error = refusal(write(tmp_path, {**fixture_data("Llama-2-7b-hf"), "num_attention_heads": 30}))
    assert (error.field, error.value, error.rule) == ("num_attention_heads", 30, "must divide the hidden size (4096)")
    error = refusal(write(tmp_path, {**fixture_data("Meta-Llama-3-8B"), "num_key_value_heads": 5}))
    assert (error.field, error.value, error.rule) == ("num_key_value_heads", 5, "must divide the attention heads (32)")


def test_a_missing_shape_key_is_refused(tmp_path: Path) -> None:
    data = fixture_data("Mistral-7B-v0.1")
    del data["intermediate_size"]
    error = refusal(write(tmp_path, data))
    assert (error.field, error.value, error.rule) == ("intermediate_size", None, "is required in a mistral config.json")


@pytest.mark.parametrize(("name", "change", "field"), [
    ("opt-1.3b", {"word_embed_proj_dim": 512}, "word_embed_proj_dim"),
    ("opt-1.3b", {"do_layer_norm_before": False}, "do_layer_norm_before"),
    ("gpt2", {"hidden_size": 1024}, "hidden_size"),  # contradicts n_embd=768
    ("gpt2", {"activation_function": "tanh"}, "activation_function"),
    ("gpt2", {"resid_pdrop": 1.5}, "resid_pdrop"),
    ("Llama-2-7b-hf", {"tie_word_embeddings": "no"}, "tie_word_embeddings"),
    ("Llama-2-7b-hf", {"model_type": None}, "model_type"),
])
def test_other_bad_hugging_face_values_are_refused(tmp_path: Path, name: str, change: dict[str, Any],
                                                   field: str) -> None:
    assert refusal(write(tmp_path, {**fixture_data(name), **change})).field == field


def test_unknown_name_that_is_no_file_lists_the_presets() -> None:
    error = refusal("llama9-1t")
    assert (error.field, error.value) == ("model", "llama9-1t")
    assert all(name in error.rule for name in PRESETS)


@pytest.mark.parametrize(("change", "field"), [
    ({"schema": "pipesim.model/2"}, "schema"), ({"hidden_size": 4096.0}, "hidden_size"),
    ({"has_bias": 1}, "has_bias"), ({"norm": "batchnorm"}, "norm"), ({"wings": 2}, "wings"),
    ({"published_parameters": float("nan")}, "published_parameters"), ({"num_heads": 33}, "num_heads"),
    ({"head_size": 0}, "head_size"), ({"ffn_activation": "tanh"}, "ffn_activation"), ({"vocab_size": 0}, "vocab_size"),
])
def test_bad_own_json_is_refused(tmp_path: Path, change: dict[str, Any], field: str) -> None:
    data = {**json.loads(model_to_json(PRESETS["llama2-7b"])), **change}
    assert refusal(write(tmp_path, data, "model.json")).field == field


def test_own_json_missing_a_field_and_files_of_neither_kind_are_refused(tmp_path: Path) -> None:
    data = json.loads(model_to_json(PRESETS["llama2-7b"]))
    del data["num_layers"]
    assert refusal(write(tmp_path, data, "model.json")).field == "num_layers"
    assert refusal(write(tmp_path, {"hidden_size": 64}, "neither.json")).field == "model"
    assert refusal(write(tmp_path, [1, 2], "list.json")).field == "model"
    (tmp_path / "broken.json").write_text("{")
    assert refusal(str(tmp_path / "broken.json")).field == "model"


# --- any valid config, built by construction, counts as its closed form ----------------------


@st.composite
def hf_configs(draw: st.DrawFn) -> tuple[dict[str, Any], int]:
    """A valid config.json and its parameter count, written out per architecture."""
    model_type = draw(st.sampled_from(["llama", "mistral", "qwen2", "phi3", "gemma", "gemma2", "gpt2", "gpt_neox",
                                       "bloom", "opt", "falcon"]))
    g = draw(st.integers(1, 4))  # KV heads
    a = g * draw(st.integers(1, 3))  # heads, a multiple of g
    d = draw(st.sampled_from([2, 4, 8]))  # head size
    h, f = a * d, draw(st.integers(1, 64))
    layers, vocab = draw(st.integers(1, 3)), draw(st.integers(1, 500))
    tied = draw(st.booleans())
    data: dict[str, Any] = {"model_type": model_type, "vocab_size": vocab, "tie_word_embeddings": tied}
    output = 0 if tied else vocab * h
    if model_type in ("llama", "mistral", "qwen2", "phi3", "gemma", "gemma2"):
        if model_type.startswith("gemma"):  # Gemma's head size is its own, h need not be a d
            h = draw(st.integers(1, 64))
            output = 0 if tied else vocab * h
        data |= {"hidden_size": h, "num_hidden_layers": layers, "num_attention_heads": a, "num_key_value_heads": g,
                 "intermediate_size": f, "head_dim": d}
        # Llama's and Gemma's attention_bias: Q, K, V and the projection; Llama's mlp_bias: gate, up, down.
        attention_bias = model_type in ("llama", "gemma", "gemma2") and draw(st.booleans())
        mlp_bias = model_type == "llama" and draw(st.booleans())
        data |= {"attention_bias": attention_bias, "mlp_bias": mlp_bias} if model_type == "llama" else {}
        data |= {"attention_bias": attention_bias} if model_type.startswith("gemma") else {}
        qkv_bias = a * d + 2 * g * d if model_type == "qwen2" or attention_bias else 0
        biases = qkv_bias + (h if attention_bias else 0) + (2 * f + h if mlp_bias else 0)
        norms = 4 if model_type == "gemma2" else 2
        layer = h * (a * d + 2 * g * d) + a * d * h + 3 * h * f + biases + norms * h
        return data, vocab * h + output + layers * layer + h
    has_bias = draw(st.booleans())  # GPT-2 and BLOOM always have biases; GPT-NeoX's MLP always has them
    ungated = 4 * h * h + 2 * h * f + 4 * h  # QKV, projection, MLP, 2 LayerNorms
    biases = 3 * h + h + f + h
    if model_type == "gpt2":
        data |= {"n_embd": h, "n_layer": layers, "n_head": a, "n_inner": f, "n_positions": 16}
        return data, vocab * h + 16 * h + output + layers * (ungated + biases) + 2 * h
    data |= {"hidden_size": h, "num_hidden_layers": layers, "num_attention_heads": a}
    if model_type == "gpt_neox":
        data |= {"intermediate_size": f, "attention_bias": has_bias}
        neox_biases = (3 * h + h if has_bias else 0) + f + h
        return data, vocab * h + output + layers * (ungated + neox_biases) + 2 * h
    if model_type == "bloom":
        return data, vocab * h + 2 * h + output + layers * (12 * h * h + 13 * h) + 2 * h
    if model_type == "opt":
        data |= {"ffn_dim": f, "max_position_embeddings": 16, "enable_bias": has_bias}
        return data, vocab * h + 18 * h + output + layers * (ungated + (biases if has_bias else 0)) + 2 * h
    data |= {"new_decoder_architecture": True, "num_kv_heads": g, "ffn_hidden_size": f, "bias": has_bias}
    layer = h * (a * d + 2 * g * d) + h * h + 2 * h * f + 2 * 2 * h  # Falcon-40B's kind: two norms
    falcon_biases = a * d + 2 * g * d + h + f + h
    return data, vocab * h + output + layers * (layer + (falcon_biases if has_bias else 0)) + 2 * h


@given(hf_configs())
def test_any_valid_config_counts_as_its_closed_form(case: tuple[dict[str, Any], int]) -> None:
    data, expected = case
    config = model_from_hf_config(data, source="generated/config.json")
    assert parameters(config) == expected
    assert model_from_json(json.loads(model_to_json(config)), source="generated.json") == config


@given(st.builds(TransformerConfig, name=st.text(max_size=8), num_layers=st.integers(1, 4),
                 hidden_size=st.sampled_from([8, 16]), ffn_hidden_size=st.integers(1, 64),
                 num_heads=st.sampled_from([1, 2, 4]), num_kv_heads=st.just(1), vocab_size=st.integers(1, 100),
                 seq_len=st.integers(1, 4096), published_parameters=st.floats(0, 1e12),
                 head_size=st.none() | st.integers(1, 16), has_qkv_bias=st.none() | st.booleans()))
def test_any_config_round_trips_through_own_json(config: TransformerConfig) -> None:
    assert model_from_json(json.loads(model_to_json(config)), source="generated.json") == config
