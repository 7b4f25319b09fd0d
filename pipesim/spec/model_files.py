"""Model files: a preset name, a Hugging Face ``config.json`` or pipesim's own model JSON, as a TransformerConfig.

A ``config.json`` is read as Hugging Face transformers reads it for its ``model_type``. The keys
that give the shape (layers, hidden size, heads, vocabulary, and the FFN size where the type has
no rule for it) are required: transformers' defaults for them are one reference model's numbers,
and a file that forgot one would otherwise describe that model silently. Every other key the
count needs follows transformers' documented default for the type: ``num_key_value_heads``
absent means multi-head attention, GPT-2's ``n_inner`` null means 4h, ``head_dim`` absent means
h / a (256 for Gemma), ``tie_word_embeddings`` is what the type's config class sets. The
sequence length is the config's context length (``max_position_embeddings``). Mixtures of experts
are read for mixtral, qwen2_moe, deepseek_v2 and deepseek_v3 (their expert counts, top-k, expert
and shared-expert sizes and dense first layers are shape keys, required; DeepSeek's latent
attention too; its multi-token-prediction modules are not counted, as its published size leaves
them out); other MoE types are refused. The file is data: read, never executed (``auto_map`` is
ignored).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pipesim.errors import ConfigError
from pipesim.spec.files import dumps, parse_json, read_text
from pipesim.spec.hf_keys import ConfigKeys
from pipesim.spec.hf_moe import deepseek, mixtral_experts, qwen2_moe_experts, qwen3_moe_experts
from pipesim.spec.transformer import PRESETS, TransformerConfig, preset

SCHEMA = "pipesim.model/1"
_FIELDS = {field.name: field for field in dataclasses.fields(TransformerConfig)}
_FIELD_TYPES = typing.get_type_hints(TransformerConfig)

# Model types whose layers are mixtures of experts that are not read (refused), and the keys that
# give a config's expert count (a dense type's config that sets one is refused too).
MOE_MODEL_TYPES = ("dbrx", "granitemoe", "jamba", "jetmoe", "olmoe", "phimoe")
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def load_model(name_or_path: str) -> TransformerConfig:
    """The model called ``name_or_path``: a preset (case-insensitive), else a JSON file, told apart
    by content: a Hugging Face ``config.json`` (``model_type``) or ``pipesim.model/1`` (``schema``).

    Raises:
        ConfigError: an unknown name that is no file (the message lists the presets), an
            unreadable file, or a value that breaks a rule (naming the key, value and rule).
    """
    if name_or_path.strip().lower() in PRESETS:
        return preset(name_or_path)
    if not _exists(name_or_path):
        raise ConfigError("model", name_or_path, f"must be one of {', '.join(PRESETS)} or a model file (a Hugging "
                          f"Face config.json or {SCHEMA} JSON); no such file")
    data = parse_json(read_text(name_or_path, "model"), name_or_path, "model")
    if not isinstance(data, dict):
        raise ConfigError("model", name_or_path, "must hold a JSON object")
    if "schema" in data:
        return model_from_json(data, source=name_or_path)
    if "model_type" in data:
        return model_from_hf_config(data, source=name_or_path)
    raise ConfigError("model", name_or_path, f"is neither a Hugging Face config.json (no model_type key) nor {SCHEMA} "
                      "JSON (no schema key)")


def _exists(path: str) -> bool:
    try:
        return Path(path).exists()
    except ValueError:  # a NUL byte: no such file
        return False


def model_to_json(config: TransformerConfig) -> str:
    """``config`` as ``pipesim.model/1`` JSON: every field, sorted keys, a final newline."""
    return dumps({"schema": SCHEMA, **dataclasses.asdict(config)})


def model_from_json(data: Mapping[str, Any], *, source: str) -> TransformerConfig:
    """Read ``pipesim.model/1`` JSON (the fields of TransformerConfig, each of its declared type).

    Raises:
        ConfigError: another schema, an unknown or missing field, or a value that breaks a rule.
    """
    if data.get("schema") != SCHEMA:
        raise ConfigError("schema", data.get("schema"), f"must be {SCHEMA!r}", source=source)
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key == "schema":
            continue
        if key not in _FIELDS:
            raise ConfigError(key, value, f"is not a field of {SCHEMA} (known: {', '.join(_FIELDS)})", source=source)
        broken = _broken_rule(value, _FIELD_TYPES[key])
        if broken:
            raise ConfigError(key, value, broken, source=source)
        values[key] = value
    for name, field in _FIELDS.items():
        if name not in values and field.default is dataclasses.MISSING:
            raise ConfigError(name, None, f"is required in {SCHEMA}", source=source)
    for name, minimum in (("vocab_size", 1), ("num_positions", 0), ("published_parameters", 0)):
        if name in values and values[name] < minimum:
            raise ConfigError(name, values[name], f"must be >= {minimum}", source=source)
    return _built(values, source)


def _broken_rule(value: Any, hint: Any) -> str:
    """What ``value`` breaks of the type ``hint`` (int, float, bool, str, a Literal, or X | None), or ''."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return "" if isinstance(value, str) and value in args else f"must be one of {', '.join(args)}"
    if origin in (typing.Union, types.UnionType):
        inner = [arg for arg in args if arg is not type(None)]
        return "" if value is None else _broken_rule(value, inner[0])
    if hint is bool:
        return "" if isinstance(value, bool) else "must be true or false"
    if hint is str:
        return "" if isinstance(value, str) else "must be a string"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "must be a number" if hint is float else "must be an integer"
    if hint is int:
        return "" if isinstance(value, int) else "must be an integer"
    return "" if math.isfinite(value) else "must be finite"


def _built(values: Mapping[str, Any], source: str) -> TransformerConfig:
    try:
        return TransformerConfig(**values)
    except ConfigError as error:
        raise ConfigError(error.field, error.value, error.rule, source=source) from None


def _biases(*, qkv: bool, out: bool, mlp: bool) -> dict[str, Any]:
    """TransformerConfig's bias fields: ``has_bias`` is the output projection's, the others where they differ."""
    return {"has_bias": out, "has_qkv_bias": None if qkv == out else qkv, "has_mlp_bias": None if mlp == out else mlp}


@dataclasses.dataclass(frozen=True)
class _Decoder:
    """A Llama-like model type (RMSNorm, gated FFN, rotary, no learned positions) and transformers'
    defaults for it: tied embeddings, context length, activation, head size, which biases exist."""

    is_tied: bool
    max_positions: int
    activation: str = "silu"
    activation_keys: tuple[str, ...] = ("hidden_act",)
    head_dim: int | None = None
    attention_bias_key: str | None = None  # true: biases on Q, K, V and the output projection
    mlp_bias_key: str | None = None
    has_qkv_bias: bool = False  # Qwen2's Q, K and V always carry one
    num_layer_norms: int = 2
    dropout_keys: tuple[str, ...] = ("attention_dropout",)


DECODERS: dict[str, _Decoder] = {
    "llama": _Decoder(is_tied=False, max_positions=2048, attention_bias_key="attention_bias", mlp_bias_key="mlp_bias"),
    "mistral": _Decoder(is_tied=False, max_positions=4096 * 32),
    "qwen2": _Decoder(is_tied=False, max_positions=32768, has_qkv_bias=True),
    "phi3": _Decoder(is_tied=False, max_positions=4096,
                     dropout_keys=("attention_dropout", "resid_pdrop", "embd_pdrop")),
    "gemma": _Decoder(is_tied=True, max_positions=8192, activation="gelu_pytorch_tanh", head_dim=256,
                      activation_keys=("hidden_activation", "hidden_act"), attention_bias_key="attention_bias"),
    "gemma2": _Decoder(is_tied=True, max_positions=8192, activation="gelu_pytorch_tanh", head_dim=256,
                       activation_keys=("hidden_activation", "hidden_act"), attention_bias_key="attention_bias",
                       num_layer_norms=4),
    "mixtral": _Decoder(is_tied=False, max_positions=4096 * 32),
    "qwen2_moe": _Decoder(is_tied=False, max_positions=8192, has_qkv_bias=True),
    # Qwen3: as Llama with head_dim 128 by default; its per-head RMSNorms of Q and K (2 x head_dim
    # weights a layer) are left out of the count and the time.
    "qwen3": _Decoder(is_tied=False, max_positions=32768, head_dim=128, attention_bias_key="attention_bias"),
    "qwen3_moe": _Decoder(is_tied=False, max_positions=32768, attention_bias_key="attention_bias"),
}


def _decoder(keys: ConfigKeys) -> dict[str, Any]:
    family = DECODERS[keys.model_type]
    hidden = keys.integer("hidden_size")
    head_dim = keys.optional_integer("head_dim") or family.head_dim
    heads, kv_heads, head_size = keys.heads(hidden, "num_attention_heads", "num_key_value_heads", head_dim)
    attention_bias = keys.boolean(family.attention_bias_key, False) if family.attention_bias_key else False
    mlp_bias = keys.boolean(family.mlp_bias_key, False) if family.mlp_bias_key else False
    context = keys.integer("max_position_embeddings", family.max_positions)
    return dict(num_layers=keys.integer("num_hidden_layers"), hidden_size=hidden,
                ffn_hidden_size=keys.integer("intermediate_size"), num_heads=heads, num_kv_heads=kv_heads,
                head_size=head_size, vocab_size=keys.integer("vocab_size"), seq_len=context, is_gated_ffn=True,
                ffn_activation=keys.activation(family.activation_keys, family.activation, is_gated=True),
                has_tied_embeddings=keys.boolean("tie_word_embeddings", family.is_tied), norm="rmsnorm",
                has_rotary=True, has_dropout=keys.has_dropout(*family.dropout_keys),
                num_layer_norms=family.num_layer_norms,
                **_biases(qkv=attention_bias or family.has_qkv_bias, out=attention_bias, mlp=mlp_bias))


def _gpt2(keys: ConfigKeys) -> dict[str, Any]:
    hidden = keys.integer("n_embd")
    heads, _, _ = keys.heads(hidden, "n_head", None, None)
    positions = keys.integer("n_positions", 1024)
    return dict(num_layers=keys.integer("n_layer"), hidden_size=hidden,
                ffn_hidden_size=keys.integer("n_inner", 4 * hidden),
                num_heads=heads, num_kv_heads=heads, vocab_size=keys.integer("vocab_size"), seq_len=positions,
                num_positions=positions, ffn_activation=keys.activation(("activation_function",), "gelu_new",
                                                                        is_gated=False),
                has_tied_embeddings=keys.boolean("tie_word_embeddings", True), has_bias=True,
                has_dropout=keys.has_dropout("resid_pdrop", "embd_pdrop", "attn_pdrop", default=0.1))


def _gpt_neox(keys: ConfigKeys) -> dict[str, Any]:
    hidden = keys.integer("hidden_size")
    heads, _, _ = keys.heads(hidden, "num_attention_heads", None, None)
    attention_bias = keys.boolean("attention_bias", True)  # Q, K, V and the output projection; the MLP always has one
    return dict(num_layers=keys.integer("num_hidden_layers"), hidden_size=hidden,
                ffn_hidden_size=keys.integer("intermediate_size"), num_heads=heads, num_kv_heads=heads,
                vocab_size=keys.integer("vocab_size"), seq_len=keys.integer("max_position_embeddings", 2048),
                ffn_activation=keys.activation(("hidden_act",), "gelu", is_gated=False),
                has_tied_embeddings=keys.boolean("tie_word_embeddings", False), has_rotary=True,
                has_parallel_layers=keys.boolean("use_parallel_residual", True),
                has_dropout=keys.has_dropout("hidden_dropout", "attention_dropout"),
                **_biases(qkv=attention_bias, out=attention_bias, mlp=True))


def _bloom(keys: ConfigKeys) -> dict[str, Any]:
    hidden = keys.integer("hidden_size")
    heads, _, _ = keys.heads(hidden, "n_head", None, None)
    # ALiBi: no position parameters; BLOOM trained at 2048 tokens (its model card) and names no context length.
    return dict(num_layers=keys.integer("n_layer"), hidden_size=hidden, ffn_hidden_size=4 * hidden, num_heads=heads,
                num_kv_heads=heads, vocab_size=keys.integer("vocab_size"), seq_len=keys.integer("seq_length", 2048),
                has_tied_embeddings=keys.boolean("tie_word_embeddings", True), has_bias=True,
                has_embedding_norm=True, has_dropout=keys.has_dropout("hidden_dropout", "attention_dropout"))


def _opt(keys: ConfigKeys) -> dict[str, Any]:
    hidden = keys.integer("hidden_size")
    heads, _, _ = keys.heads(hidden, "num_attention_heads", None, None)
    projection = keys.integer("word_embed_proj_dim", hidden)
    if projection != hidden:
        raise keys.error("word_embed_proj_dim", projection, f"must equal hidden_size ({hidden}): OPT's embedding "
                         "projections (project_in, project_out) are not modelled")
    if not keys.boolean("do_layer_norm_before", True):
        raise keys.error("do_layer_norm_before", False, "is not modelled: a post-norm OPT (OPT-350m) has no final norm")
    if keys.boolean("_remove_final_layer_norm", False):
        raise keys.error("_remove_final_layer_norm", True, "is not modelled: an OPT without its final norm")
    if not keys.boolean("layer_norm_elementwise_affine", True):
        raise keys.error("layer_norm_elementwise_affine", False, "is not modelled: norms without parameters")
    context = keys.integer("max_position_embeddings", 2048)
    return dict(num_layers=keys.integer("num_hidden_layers"), hidden_size=hidden,
                ffn_hidden_size=keys.integer("ffn_dim"),
                num_heads=heads, num_kv_heads=heads, vocab_size=keys.integer("vocab_size"), seq_len=context,
                num_positions=context + 2,  # OPT's learned positions are offset by 2
                ffn_activation=keys.activation(("activation_function",), "relu", is_gated=False),
                has_tied_embeddings=keys.boolean("tie_word_embeddings", True),
                has_bias=keys.boolean("enable_bias", True),
                has_dropout=keys.has_dropout("dropout", "attention_dropout", default=0.1))


def _falcon(keys: ConfigKeys) -> dict[str, Any]:
    hidden = keys.integer("hidden_size")
    is_new = keys.boolean("new_decoder_architecture", False)  # Falcon-40B and later: grouped KV, two norms
    is_parallel = is_new or keys.boolean("parallel_attn", True)
    kv_key = "num_kv_heads" if is_new else None
    heads, kv_heads, _ = keys.heads(hidden, "num_attention_heads", kv_key, None)
    if not is_new and keys.boolean("multi_query", True):
        kv_heads = 1
    norms = keys.integer("num_ln_in_parallel_attn", 2 if is_new else 1) if is_parallel else 2  # before attention, MLP
    if norms > 2:
        raise keys.error("num_ln_in_parallel_attn", norms, "must be 1 (one norm for attention and MLP) or 2")
    bias = keys.boolean("bias", False)
    return dict(num_layers=keys.integer("num_hidden_layers"), hidden_size=hidden,
                ffn_hidden_size=keys.integer("ffn_hidden_size", 4 * hidden), num_heads=heads, num_kv_heads=kv_heads,
                vocab_size=keys.integer("vocab_size"), seq_len=keys.integer("max_position_embeddings", 2048),
                ffn_activation=keys.activation(("activation",), "gelu", is_gated=False),
                has_tied_embeddings=keys.boolean("tie_word_embeddings", True), has_bias=bias,
                has_rotary=not keys.boolean("alibi", False), has_parallel_layers=is_parallel, num_layer_norms=norms,
                has_dropout=keys.has_dropout("hidden_dropout", "attention_dropout"))


# model_type -> (reader, the other names transformers accepts for a key the reader asks for)
_READERS: dict[str, tuple[Callable[[ConfigKeys], dict[str, Any]], Mapping[str, tuple[str, ...]]]] = {
    **{name: (_decoder, {}) for name in DECODERS},
    "mixtral": (lambda keys: {**_decoder(keys), **mixtral_experts(keys)}, {}),
    "qwen2_moe": (lambda keys: {**_decoder(keys), **qwen2_moe_experts(keys)}, {}),
    "qwen3_moe": (lambda keys: {**_decoder(keys), **qwen3_moe_experts(keys)}, {}),
    "deepseek_v2": (deepseek, {}),
    "deepseek_v3": (deepseek, {}),
    "gpt2": (_gpt2, {"n_embd": ("hidden_size",), "n_layer": ("num_hidden_layers",), "n_head": ("num_attention_heads",),
                     "n_positions": ("max_position_embeddings",)}),
    "gpt_neox": (_gpt_neox, {}),
    "bloom": (_bloom, {"n_layer": ("num_hidden_layers",), "n_head": ("num_attention_heads",),
                       "hidden_size": ("n_embed",)}),
    "opt": (_opt, {}),
    "falcon": (_falcon, {"num_hidden_layers": ("n_layer",), "num_attention_heads": ("n_head",),
                         "num_kv_heads": ("n_head_kv",), "hidden_size": ("n_embed",)}),
}
HF_MODEL_TYPES = tuple(sorted(_READERS))
MOE_READERS = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3")


def model_from_hf_config(data: dict[str, Any], *, source: str) -> TransformerConfig:
    """Read a Hugging Face ``config.json`` (model_type llama, mistral, qwen2, qwen3, phi3, gemma,
    gemma2, gpt2, gpt_neox, bloom, opt, falcon, and the mixtures of experts mixtral, qwen2_moe,
    qwen3_moe, deepseek_v2, deepseek_v3); ``source`` names the file in errors and in the label (a
    ``config.json``'s folder name, else the file's stem).

    Raises:
        ConfigError: a mixture-of-experts config of another type, an unknown model_type (the known
            ones listed), a missing shape key, or a value that breaks a rule.
    """
    model_type = data.get("model_type")
    if not isinstance(model_type, str):
        raise ConfigError("model_type", model_type, f"must be a string, one of {', '.join(HF_MODEL_TYPES)}",
                          source=source)
    if model_type in MOE_MODEL_TYPES:
        raise ConfigError("model_type", model_type, f"is a mixture of experts pipesim does not read (it reads "
                          f"{', '.join(MOE_READERS)})", source=source)
    for key in EXPERT_KEYS:
        experts = data.get(key)
        if model_type not in MOE_READERS and isinstance(experts, int) and not isinstance(experts, bool) \
                and experts > 1:
            raise ConfigError(key, experts, f"makes a {model_type} config a mixture of experts, which pipesim reads "
                              f"for {', '.join(MOE_READERS)} only", source=source)
    if model_type not in _READERS:
        raise ConfigError("model_type", model_type, f"must be one of {', '.join(HF_MODEL_TYPES)}", source=source)
    reader, aliases = _READERS[model_type]
    path = Path(source)
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    values = reader(ConfigKeys(data, source, aliases))
    return _built({"name": name, "source": f"{source} (Hugging Face config.json, model_type {model_type})", **values},
                  source)
