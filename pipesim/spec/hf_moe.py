"""Hugging Face configs of mixtures of experts: Mixtral's and Qwen2-MoE's expert keys, and DeepSeek-V2/V3 whole.

Mixtral and Qwen2-MoE are read as their dense families (Mistral, Qwen2) are, with these keys on
top; DeepSeek's layers (latent attention, dense first layers, shared experts) are read here. The
expert counts, top-k and sizes are shape keys: required, never defaulted.
"""

from __future__ import annotations

from typing import Any

from pipesim.spec.hf_keys import ConfigKeys


def mixtral_experts(keys: ConfigKeys) -> dict[str, Any]:
    """Beside Mistral's layers: ``num_local_experts`` experts of the FFN size, top-k routed."""
    experts = keys.integer("num_local_experts")
    return dict(num_experts=experts, num_experts_per_token=top_k(keys, experts))


def qwen2_moe_experts(keys: ConfigKeys) -> dict[str, Any]:
    """Beside Qwen2's layers: ``num_experts`` experts of ``moe_intermediate_size`` and a gated
    shared expert of ``shared_expert_intermediate_size`` (0: none), in every layer."""
    shared = required(keys, "shared_expert_intermediate_size")
    return {**_qwen_experts(keys), "shared_expert_ffn_hidden_size": shared, "has_shared_expert_gate": shared > 0}


def qwen3_moe_experts(keys: ConfigKeys) -> dict[str, Any]:
    """Beside Qwen3's layers: ``num_experts`` experts of ``moe_intermediate_size``, no shared
    expert, in every layer."""
    return _qwen_experts(keys)


def _qwen_experts(keys: ConfigKeys) -> dict[str, Any]:
    """The routed experts of a Qwen MoE config, where every layer is a mixture of experts."""
    if keys.integer("decoder_sparse_step", 1) != 1:
        raise keys.error("decoder_sparse_step", keys.get("decoder_sparse_step")[1], "must be 1: every layer a "
                         "mixture of experts")
    dense = keys.get("mlp_only_layers")[1]
    if dense:
        raise keys.error("mlp_only_layers", dense, "must be empty: dense layers among the experts' are not modelled")
    experts = keys.integer("num_experts")
    return dict(num_experts=experts, num_experts_per_token=top_k(keys, experts),
                expert_ffn_hidden_size=keys.integer("moe_intermediate_size"))


def deepseek(keys: ConfigKeys) -> dict[str, Any]:
    """DeepSeek-V2/V3: multi-head latent attention; the first ``first_k_dense_replace`` layers dense,
    the rest ``n_routed_experts`` experts top-k routed beside ``n_shared_experts`` shared ones, all of
    ``moe_intermediate_size``. ``q_lora_rank`` null projects Q directly (V2-Lite)."""
    if keys.integer("moe_layer_freq", 1) != 1:
        raise keys.error("moe_layer_freq", keys.get("moe_layer_freq")[1], "must be 1: every layer past "
                         "first_k_dense_replace a mixture of experts")
    if keys.boolean("attention_bias", False):
        raise keys.error("attention_bias", True, "is not modelled for latent attention")
    hidden, heads = keys.integer("hidden_size"), keys.integer("num_attention_heads")
    kv_heads = keys.integer("num_key_value_heads", heads)
    if kv_heads != heads:
        raise keys.error("num_key_value_heads", kv_heads, f"must equal num_attention_heads ({heads}) under latent "
                         "attention")
    rope, experts = keys.integer("qk_rope_head_dim"), required(keys, "n_routed_experts")
    moe: dict[str, Any] = {}
    if experts:
        expert_size = keys.integer("moe_intermediate_size")
        moe = dict(num_experts=experts, num_experts_per_token=top_k(keys, experts), expert_ffn_hidden_size=expert_size,
                   shared_expert_ffn_hidden_size=required(keys, "n_shared_experts") * expert_size,
                   num_dense_layers=required(keys, "first_k_dense_replace"))
    return dict(num_layers=keys.integer("num_hidden_layers"), hidden_size=hidden,
                ffn_hidden_size=keys.integer("intermediate_size"), num_heads=heads, num_kv_heads=heads,
                head_size=keys.integer("qk_nope_head_dim") + rope, vocab_size=keys.integer("vocab_size"),
                seq_len=keys.integer("max_position_embeddings", 2048), is_gated_ffn=True,
                ffn_activation=keys.activation(("hidden_act",), "silu", is_gated=True),
                has_tied_embeddings=keys.boolean("tie_word_embeddings", False), norm="rmsnorm", has_rotary=True,
                has_dropout=keys.has_dropout("attention_dropout"), q_lora_rank=required(keys, "q_lora_rank"),
                kv_lora_rank=keys.integer("kv_lora_rank"), qk_rope_head_size=rope,
                v_head_size=keys.integer("v_head_dim"), **moe)


def top_k(keys: ConfigKeys, experts: int) -> int:
    """``num_experts_per_tok``: the routed experts each token goes to, at most ``experts``."""
    chosen = keys.integer("num_experts_per_tok")
    if chosen > experts:
        raise keys.error("num_experts_per_tok", chosen, f"must be <= the routed experts ({experts})")
    return chosen


def required(keys: ConfigKeys, key: str) -> int:
    """A shape key that may be 0 or null (none of it) but must be given: transformers' default for
    it is one reference model's number."""
    if key not in keys.data:
        raise keys.error(key, None, f"is required in a {keys.model_type} config.json (0 or null for none)")
    return keys.optional_integer(key, 0) or 0
