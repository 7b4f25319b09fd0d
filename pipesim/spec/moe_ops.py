"""A mixture-of-experts FFN as its ops on one rank: router, dispatch, the experts' GEMMs, combine.

Per TP rank, for the T tokens of a microbatch the rank holds (b s, over C under context
parallelism), E routed experts of FFN size f_e split over EP ranks (E / EP local experts, each
split over TP as Megatron-Core's expert tensor parallelism = TP does), top-k routing:

    router (T x h x E, whole on every TP rank) -> softmax and top-k (fp32 T x E)
    -> permute (the T k' token copies gathered in expert order) -> dispatch all-to-all over EP
    -> experts: FC1 and FC2 as one grouped GEMM of E / EP products of (T k' EP / E) tokens
    -> GELU | SwiGLU -> combine all-to-all over EP -> unpermute and the top-k weighted sum
    [-> shared experts on all T tokens (and Qwen2-MoE's sigmoid gate on them)]

k' = k, or k x the capacity factor when one is set (its padded slots computed too). Routing is
taken as balanced: each rank receives as many token copies as it sends, each expert an even
share. The all-to-alls run on the tier the EP group spans (``pipesim.spec.collectives``), not
overlapped with compute; their backward moves the gradients the same way.
"""

from __future__ import annotations

from pipesim.spec.collectives import Group, all_to_all_s
from pipesim.spec.opcost import OpCost, Setting, matmul_op, memory_op
from pipesim.spec.transformer import TransformerConfig

ROUTER_BYTES = 4.0  # the router's logits and probabilities in fp32, as Megatron-Core keeps them


def routed_tokens(config: TransformerConfig, tokens: float) -> float:
    """The token copies ``tokens`` tokens send to their experts: T x k (x the capacity factor)."""
    return tokens * config.num_experts_per_token * (config.capacity_factor or 1)


def moe_ffn_ops(config: TransformerConfig, setting: Setting) -> list[OpCost]:
    """The ops of one mixture-of-experts FFN on one rank, in forward order (module docstring)."""
    tokens, h, t, e = setting.tokens, config.hidden_size, setting.tp, setting.element_bytes
    experts, f = config.num_experts, config.expert_ffn_size
    routed = routed_tokens(config, tokens)
    local_experts = experts // setting.ep
    per_expert = routed * setting.ep / experts
    probabilities = tokens * experts * ROUTER_BYTES
    # all-to-all of the token copies (each rank keeps 1/EP of its buffer), forward and backward
    exchange = all_to_all_s(setting.cluster, Group(setting.ep, setting.ep_stride), routed * h * e)
    launch = setting.device.launch_s if setting.ep > 1 else 0.0
    gated = config.is_gated_ffn
    inner = routed * f / t * e
    ops = [matmul_op(setting, "router", tokens, experts, h, linear=False),
           # softmax and top-k: read the logits, write the probabilities; backward reads them and
           # their gradient, writes the logits'
           memory_op(setting, "router-softmax", 2 * probabilities, 3 * probabilities, "softmax"),
           # gather each token's k' copies in expert order: read T h, write T k' h (backward: the sum back)
           memory_op(setting, "permute", (tokens + routed) * h * e, (tokens + routed) * h * e, "elementwise"),
           OpCost("dispatch", "collective", launch + exchange, launch + exchange),
           matmul_op(setting, "expert-fc1", per_expert, (2 if gated else 1) * f / t, h, batch=local_experts),
           memory_op(setting, "expert-swiglu" if gated else "expert-gelu", (3 if gated else 2) * inner,
                     (5 if gated else 3) * inner, "elementwise"),
           matmul_op(setting, "expert-fc2", per_expert, h, f / t, batch=local_experts),
           OpCost("combine", "collective", launch + exchange, launch + exchange),
           # the k' outputs of each token weighted and summed: read T k' h and the weights, write T h;
           # backward: read dY, write the copies' gradient, and read the outputs again for the weights' gradient
           memory_op(setting, "unpermute", (routed + tokens) * h * e, (tokens + 2 * routed) * h * e, "elementwise")]
    shared = config.shared_expert_ffn_hidden_size
    if shared:
        inner = tokens * shared / t * e
        ops += [matmul_op(setting, "shared-fc1", tokens, (2 if gated else 1) * shared / t, h),
                memory_op(setting, "shared-swiglu" if gated else "shared-gelu", (3 if gated else 2) * inner,
                          (5 if gated else 3) * inner, "elementwise"),
                matmul_op(setting, "shared-fc2", tokens, h, shared / t)]
        if config.has_shared_expert_gate:  # sigmoid(x w) scales the shared output: read it and write it back
            ops += [matmul_op(setting, "shared-gate", tokens, 1, h, linear=False),
                    memory_op(setting, "shared-scale", 2 * tokens * h * e, 3 * tokens * h * e, "elementwise")]
    return ops
