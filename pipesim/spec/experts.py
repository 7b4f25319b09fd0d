"""Sizes of the layer parts beyond a dense GPT block: mixture-of-experts FFNs and multi-head latent attention.

A mixture-of-experts FFN (Mixtral, Qwen2-MoE, DeepSeek-V2/V3) is a router (h x E), E routed
experts, each an FFN of the expert size, of which every token goes through k, and optional
shared experts every token goes through (DeepSeek: several, counted together as one FFN of
their summed size; Qwen2-MoE: one, with a sigmoid gate h x 1). Multi-head latent attention
(DeepSeek-V2, Liu et al. 2024) projects K and V up from a shared latent of rank ``kv_lora_rank``
(plus a rotary part of K shared by all heads) and Q through a rank-``q_lora_rank`` bottleneck.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipesim.spec.transformer import TransformerConfig


def attention_weights(config: TransformerConfig) -> int:
    """Weights of one layer's attention projections: Q, K, V and the output projection; under MLA
    Q's (bottleneck or direct), the latent's down-projection (with K's shared rotary part), its
    up-projection to K and V, and the output projection."""
    h, q = config.hidden_size, config.q_size
    if not config.kv_lora_rank:
        return h * (q + 2 * config.kv_size) + q * h
    rank_q, rank_kv, rope = config.q_lora_rank, config.kv_lora_rank, config.qk_rope_head_size
    query = h * rank_q + rank_q * q if rank_q else h * q
    nope = config.head_dim - rope
    return query + h * (rank_kv + rope) + rank_kv * config.num_heads * (nope + (config.v_head_size or 0)) \
        + config.v_size * h


def ffn_parameters(config: TransformerConfig, width: int) -> int:
    """One FFN ``width`` wide: its up and down matrices (and gate when gated), with their biases
    where the model has MLP biases."""
    matrices = 3 if config.is_gated_ffn else 2
    has_mlp_bias = config.has_bias if config.has_mlp_bias is None else config.has_mlp_bias
    return matrices * config.hidden_size * width + ((matrices - 1) * width + config.hidden_size if has_mlp_bias else 0)


def routed_expert_parameters(config: TransformerConfig) -> int:
    """The routed experts of one mixture-of-experts layer, all E of them (what expert parallelism splits)."""
    return config.num_experts * ffn_parameters(config, config.expert_ffn_size)


def moe_shared_parameters(config: TransformerConfig) -> int:
    """What of a mixture-of-experts FFN every rank holds whole (TP aside): the router (h x E), the
    shared experts and their gate."""
    h = config.hidden_size
    shared = ffn_parameters(config, config.shared_expert_ffn_hidden_size) if config.shared_expert_ffn_hidden_size else 0
    return h * config.num_experts + shared + (h if config.has_shared_expert_gate else 0)


def moe_ffn_weights_per_token(config: TransformerConfig) -> int:
    """The mixture-of-experts FFN's weights one token multiplies: the router, its k routed experts,
    the shared experts and their gate (biases aside)."""
    h, matrices = config.hidden_size, 3 if config.is_gated_ffn else 2
    used = config.num_experts_per_token * config.expert_ffn_size + config.shared_expert_ffn_hidden_size
    return h * config.num_experts + matrices * h * used + (h if config.has_shared_expert_gate else 0)
