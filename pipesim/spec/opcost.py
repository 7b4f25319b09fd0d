"""A transformer layer as its ops, each priced on a device and a cluster: forward, input gradient, weight gradient.

Per tensor-parallel rank, for a microbatch of b sequences of s tokens (T = b s), hidden h,
heads a (KV heads g, head size d), FFN size f, TP degree t, 2-byte activations (e):

    norm -> [SP all-gather] -> QKV (T x h x (h + 2gd)/t) -> [rotary] -> attention core
    -> projection (T x h/t x h) -> TP all-reduce [SP reduce-scatter] -> bias-dropout-add
    -> norm -> [SP all-gather] -> FC1 (T x h x f/t, 2f/t gated) -> GELU | SwiGLU
    -> FC2 (T x f/t x h) -> TP all-reduce [SP reduce-scatter] -> bias-dropout-add

A product Y = X W (X: M x K, W: K x N) costs ``matmul(M, N, K)`` forward, ``matmul(M, K, N)``
for dX (input gradient, I) and ``matmul(K, N, M)`` for dW (weight gradient, W). The attention
core is fused (FlashAttention: causal FLOPs 2 b s^2 h / t forward, 2.5x that backward, at the
device's attention efficiency) or unfused as Megatron-LM ran it before FlashAttention (two
batched products per head, a fused scale-mask-softmax, dropout; 2 b s^2 h / t FLOPs... each
batched product 2 b s^2 h / t, the causal half not skipped). Element-wise ops are priced by the
bytes they read and write (the counts are in each op's comment) at the device's memory rate
for their kind. Tensor parallelism's collectives run on the TP group's tier, not overlapped with
compute: forward one all-reduce of T h e after each block (with sequence parallelism a
reduce-scatter, and an all-gather before it), backward the same at the block's input. With
sequence parallelism and ``Setting.tp_overlap`` (Megatron-Core's ``--tp-comm-overlap``) each
all-gather and reduce-scatter runs beside the GEMM next to it (``overlap_tp_collectives``).

Context parallelism of degree C gives each rank T = b s / C tokens and runs the attention as a
ring (``_ring_attention``); multi-head latent attention replaces QKV by its down- and
up-projections (``_latent_projections``); a mixture-of-experts layer replaces FC1, the activation
and FC2 by the router, the dispatch, the experts and the combine (``pipesim.spec.moe_ops``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipesim.errors import ConfigError
from pipesim.spec.cluster import Cluster
from pipesim.spec.collectives import Group, allgather_s, allreduce_s, group_path, reduce_scatter_s, send_s
from pipesim.spec.device import Device
from pipesim.spec.transformer import TransformerConfig

Attention = Literal["flash", "unfused"]
ATTENTION_KINDS: tuple[Attention, ...] = ("flash", "unfused")
FLASH_BACKWARD_FLOPS = 2.5  # FlashAttention's backward: five products of the forward's two (Dao, 2023)


@dataclass(frozen=True)
class OpCost:
    """One op's seconds: forward, input gradient (I), weight gradient (W)."""

    name: str
    kind: str
    forward_s: float
    input_grad_s: float = 0.0
    weight_grad_s: float = 0.0


@dataclass(frozen=True)
class Setting:
    """What every op of one rank's profile shares.

    Attributes:
        device, cluster: where it runs; ``precision`` the matrix precision (bf16, fp16, fp8).
        microbatch_size, seq_len: b and s.
        tp, sequence_parallel: tensor-parallel degree and Megatron's sequence parallelism.
        attention: ``flash`` or ``unfused``.
        tp_stride: GPUs between neighbouring TP ranks (1 under Megatron's placement).
        cp, cp_stride: context-parallel degree C (the sequence split over C ranks) and the GPUs
            between neighbouring CP ranks.
        ep, ep_stride: expert-parallel degree (the routed experts split over E ranks) and the
            GPUs between neighbouring EP ranks.
        tp_overlap: sequence parallelism's all-gathers and reduce-scatters run beside the GEMM
            next to them (Megatron-Core's ``--tp-comm-overlap``), each taking its tier's share of
            the compute; only their excess over that GEMM is exposed (``overlap_tp_collectives``).
    """

    device: Device
    cluster: Cluster
    precision: str
    microbatch_size: int
    seq_len: int
    tp: int = 1
    sequence_parallel: bool = False
    attention: Attention = "flash"
    tp_stride: int = 1
    cp: int = 1
    cp_stride: int = 1
    ep: int = 1
    ep_stride: int = 1
    tp_overlap: bool = False

    @property
    def tokens(self) -> int:
        """The tokens of a microbatch this rank holds: b s, over C under context parallelism."""
        return self.microbatch_size * self.seq_len // self.cp

    @property
    def element_bytes(self) -> float:
        return 4.0 if self.precision in ("fp32", "tf32") else 2.0

    @property
    def tp_group(self) -> Group:
        return Group(self.tp, self.tp_stride)

    @property
    def sixteen_bit(self) -> str:
        """What runs outside fp8's linear layers under ``precision`` fp8 (attention, the logits):
        the card's 16-bit type; otherwise the precision itself."""
        if self.precision != "fp8":
            return self.precision
        return "bf16" if "bf16" in self.device.peak_flops else "fp16"


def overlapped_s(compute_s: float, comm_s: float, share: float) -> float:
    """A collective beside compute: the longer of the two, the compute slowed by ``share`` x comm."""
    return max(compute_s + share * comm_s, comm_s) if comm_s > 0 else compute_s


def matmul_op(setting: Setting, name: str, m: float, n: float, k: float, *, has_weight: bool = True,
              batch: float = 1.0, linear: bool = True) -> OpCost:
    """Y (m x n) = X (m x k) W (k x n), ``batch`` of them: forward, dX, and dW (a weight's gradient,
    else a second input's).

    Under fp8 only a layer's linear products (a weight, ``linear``) run in fp8, as
    TransformerEngine's linear layers do: the forward first casts X to fp8 and its transpose, the
    input gradient casts dY the same way (read 16 bits, write 8 + 8 a value); products of two
    activations (attention's) and others (``linear=False``: the logits, a router) stay in 16 bits.
    """
    device = setting.device
    fp8 = setting.precision == "fp8" and has_weight and linear
    precision = "fp8" if fp8 else setting.sixteen_bit
    forward = device.matmul_s(m, n, k, precision=precision, batch=batch)
    input_grad = device.matmul_s(m, k, n, precision=precision, batch=batch)
    other = device.matmul_s(k, n, m, precision=precision, batch=batch)
    if fp8:
        cast = setting.element_bytes + 2.0
        forward += device.launch_s + device.stream_s(batch * m * k * cast, "elementwise")
        input_grad += device.launch_s + device.stream_s(batch * m * n * cast, "elementwise")
    if has_weight:
        return OpCost(name, "matmul", forward, input_grad, other)
    return OpCost(name, "matmul", forward, input_grad + other)


def memory_op(setting: Setting, name: str, forward_bytes: float, backward_bytes: float, kind: str) -> OpCost:
    """A memory-bound op moving ``forward_bytes`` forward and ``backward_bytes`` in its backward (I)."""
    device = setting.device
    launch = device.launch_s
    return OpCost(name, "memory", launch + device.stream_s(forward_bytes, kind),
                  launch + device.stream_s(backward_bytes, kind) if backward_bytes > 0 else 0.0)


def _attention_core(setting: Setting, config: TransformerConfig, has_dropout: bool) -> list[OpCost]:
    """The attention between QKV and the projection, per TP rank."""
    b, s, t, e = setting.microbatch_size, setting.seq_len, setting.tp, setting.element_bytes
    heads = config.num_heads // t
    d = config.head_dim
    device = setting.device
    if setting.cp > 1:
        return [_ring_attention(setting, config)]
    if setting.attention == "flash":
        # causal: half of QK^T and PV, 2 b s^2 (a d) / t; under MLA QK^T is d_qk wide, PV d_v
        flops = 2.0 * b * s * s * heads * (d if config.v_head_size is None else (d + config.v_head_size) / 2)
        peak = device.peak(setting.sixteen_bit)
        forward = device.launch_s + flops / (peak * device.attention_efficiency(s, d, backward=False))
        backward = device.launch_s + FLASH_BACKWARD_FLOPS * flops / (peak * device.attention_efficiency(s, d,
                                                                                                      backward=True))
        return [OpCost("attention", "attention", forward, backward)]
    scores = b * heads * s * s
    ops = [matmul_op(setting, "scores", s, s, d, has_weight=False, batch=b * heads),
           # Megatron's fused scale-mask-softmax: reads the scores, writes the probabilities; its
           # backward reads the probabilities and their gradient and writes the scores' gradient.
           memory_op(setting, "softmax", 2 * scores * e, 3 * scores * e, "softmax")]
    if has_dropout:  # reads and writes the probabilities, writes a byte mask; backward reads both, writes one
        ops.append(memory_op(setting, "attention-dropout", scores * (2 * e + 1), scores * (2 * e + 1), "dropout"))
    ops.append(matmul_op(setting, "context", s, config.v_head_size or d, s, has_weight=False, batch=b * heads))
    return ops


def _ring_attention(setting: Setting, config: TransformerConfig) -> OpCost:
    """Context parallelism's attention: the sequence in 2C chunks, rank i holding chunks i and
    2C-1-i (Megatron-Core and TransformerEngine's load balancing), so each of the C ring steps
    does 1/C^2 of the causal FLOPs on chunks of s/C tokens (the fused kernel's efficiency at s/C).
    Between steps each rank passes its K and V chunk (b s/C tokens of K and V per TP rank) to the
    next over the ring's slowest hop (the tier the CP group spans), overlapped with the step's
    compute: forward = step + (C-1) max(step, hop); backward the same with K, V and their
    gradients going round (twice the bytes), and the last gradients' hop home exposed."""
    b, s, t, c, e = setting.microbatch_size, setting.seq_len, setting.tp, setting.cp, setting.element_bytes
    device, heads, d = setting.device, config.num_heads // t, config.head_dim
    v = config.v_head_size or d
    peak = device.peak(setting.sixteen_bit)
    step = 2.0 * b * s * s * heads * (d + v) / 2 / (c * c)
    local = s / c
    forward = device.launch_s + step / (peak * device.attention_efficiency(local, d, backward=False))
    backward = device.launch_s + FLASH_BACKWARD_FLOPS * step / (peak * device.attention_efficiency(local, d,
                                                                                                 backward=True))
    key_width = config.q_size / t if config.kv_lora_rank else max(config.kv_size / t, d)
    value_width = config.v_size / t if config.kv_lora_rank else max(config.kv_size / t, d)
    chunk = b * local * (key_width + value_width) * e
    span = setting.cp_stride * (c - 1)
    hop, both = send_s(setting.cluster, span, chunk), send_s(setting.cluster, span, 2 * chunk)
    return OpCost("ring-attention", "attention", forward + (c - 1) * max(forward, hop),
                  backward + (c - 1) * max(backward, both) + hop)


def layer_ops(config: TransformerConfig, setting: Setting, *, moe: bool = False) -> list[OpCost]:
    """The ops of one transformer layer on one TP rank, in forward order (module docstring);
    ``moe``: its FFN a mixture of experts."""
    t, e = setting.tp, setting.element_bytes
    tokens = setting.tokens
    h, f, q, kv = config.hidden_size, config.ffn_hidden_size, config.q_size, config.kv_size
    local = tokens / t if setting.sequence_parallel else tokens  # tokens the norms and residuals see
    activations = local * h * e
    dropout = config.has_dropout
    norm = memory_op(setting, "norm", 2 * activations, 3 * activations, "norm")  # x -> y; x, dy -> dx
    # bias + dropout + residual add: x, residual -> out (+ a byte mask); backward dy, mask -> dx.
    residual = memory_op(setting, "residual", 3 * activations + (local * h if dropout else 0),
                         2 * activations + (local * h if dropout else 0), "dropout" if dropout else "elementwise")
    # A pre-norm layer norms before attention and before the MLP; one norm serves both where the
    # layer has one (Falcon-7B), and further norms (Gemma 2's on each output) come on top.
    extra_norms = [norm] * max(0, config.num_layer_norms - 2)
    ops = [*([norm] if config.num_layer_norms else []), *_gather(setting, config)]
    if config.kv_lora_rank:
        ops += _latent_projections(setting, config)
        rotated = config.num_heads * config.qk_rope_head_size / t + config.qk_rope_head_size  # Q's and K's rotary parts
    else:
        ops.append(matmul_op(setting, "qkv", tokens, (q + 2 * kv) / t, h))
        rotated = (q + kv) / t
    if config.has_rotary:  # q and k rotated: read and write each, both ways
        ops.append(memory_op(setting, "rotary", 2 * tokens * rotated * e, 2 * tokens * rotated * e, "elementwise"))
    ops += _attention_core(setting, config, dropout)
    ops += [matmul_op(setting, "projection", tokens, h, config.v_size / t if config.kv_lora_rank else q / t),
            *_reduce(setting, config), residual,
            *([norm] if config.num_layer_norms >= 2 else []), *_gather(setting, config), *extra_norms]
    if moe:
        from pipesim.spec.moe_ops import moe_ffn_ops  # noqa: PLC0415 - moe_ops builds on this module's ops

        return overlap_tp_collectives([*ops, *moe_ffn_ops(config, setting), *_reduce(setting, config), residual],
                                      setting)
    inner = tokens * f / t * e
    if config.is_gated_ffn:  # gate, up -> silu(gate) * up; backward dy, gate, up -> dgate, dup
        ops += [matmul_op(setting, "fc1", tokens, 2 * f / t, h),
                memory_op(setting, "swiglu", 3 * inner, 5 * inner, "elementwise")]
    else:  # bias + GELU fused: x -> y; backward dy, x -> dx
        ops += [matmul_op(setting, "fc1", tokens, f / t, h), memory_op(setting, "gelu", 2 * inner, 3 * inner,
                                                                       "elementwise")]
    ops += [matmul_op(setting, "fc2", tokens, h, f / t), *_reduce(setting, config), residual]
    return overlap_tp_collectives(ops, setting)


# Sequence parallelism's collectives and the side of them their GEMM is on: the all-gather feeds
# the GEMM after it (its backward, a reduce-scatter of that GEMM's input gradient, beside the input
# gradient's GEMM), the reduce-scatter takes the GEMM before it (its backward all-gathers the
# gradient that GEMM's input gradient needs).
OVERLAPPED_SIDE = {"tp-all-gather": 1, "tp-reduce-scatter": -1}


def tp_overlap_applies(sequence_parallel: bool, tp: int) -> bool:
    """Whether ``--tp-overlap`` has collectives to overlap: it overlaps sequence parallelism's
    all-gathers and reduce-scatters, so it needs sequence parallelism over more than one TP rank."""
    return sequence_parallel and tp > 1


def overlap_tp_collectives(ops: list[OpCost], setting: Setting) -> list[OpCost]:
    """With ``setting.tp_overlap``, each sequence-parallel collective next to a GEMM in ``ops`` run
    beside it: the collective keeps only what it adds to the GEMM, forward and input gradient
    (``overlapped_s`` with the TP tier's compute share), so the ops' sum is the overlapped time and
    what is left of the communication stays a collective. Others (an all-gather before an
    expert dispatch) stay whole."""
    if not setting.tp_overlap:
        return ops
    share = setting.cluster.tiers[group_path(setting.cluster, setting.tp_group).tier_index].compute_share
    folded = list(ops)
    for index, op in enumerate(ops):
        side = OVERLAPPED_SIDE.get(op.name, 0)
        if not side or not 0 <= index + side < len(ops) or ops[index + side].kind != "matmul":
            continue
        gemm = ops[index + side]
        folded[index] = OpCost(f"{op.name} (overlapped)", op.kind,
                               overlapped_s(gemm.forward_s, op.forward_s, share) - gemm.forward_s,
                               overlapped_s(gemm.input_grad_s, op.input_grad_s, share) - gemm.input_grad_s)
    return folded


def _latent_projections(setting: Setting, config: TransformerConfig) -> list[OpCost]:
    """Multi-head latent attention's projections on one TP rank: Q down to its latent, normed and
    up (or straight from h), the KV latent (with K's shared rotary part) down, normed and up to
    K and V. The down-projections are whole on every TP rank (Megatron-Core's MLA), the
    up-projections split over the heads."""
    tokens, h, t, e = setting.tokens, config.hidden_size, setting.tp, setting.element_bytes
    rank_q, rank_kv, rope = config.q_lora_rank, config.kv_lora_rank, config.qk_rope_head_size
    nope = config.head_dim - rope
    if rank_q:
        query = [matmul_op(setting, "q-down", tokens, rank_q, h),
                 memory_op(setting, "q-norm", 2 * tokens * rank_q * e, 3 * tokens * rank_q * e, "norm"),
                 matmul_op(setting, "q-up", tokens, config.q_size / t, rank_q)]
    else:
        query = [matmul_op(setting, "q", tokens, config.q_size / t, h)]
    return [*query, matmul_op(setting, "kv-down", tokens, rank_kv + rope, h),
            memory_op(setting, "kv-norm", 2 * tokens * rank_kv * e, 3 * tokens * rank_kv * e, "norm"),
            matmul_op(setting, "kv-up", tokens, config.num_heads * (nope + (config.v_head_size or 0)) / t, rank_kv)]


def _gather(setting: Setting, config: TransformerConfig) -> list[OpCost]:
    """Sequence parallelism's all-gather before a block (its backward: a reduce-scatter)."""
    if not setting.sequence_parallel or setting.tp == 1:
        return []
    size = setting.tokens * config.hidden_size * setting.element_bytes
    gather = allgather_s(setting.cluster, setting.tp_group, size)
    scatter = reduce_scatter_s(setting.cluster, setting.tp_group, size)
    return [OpCost("tp-all-gather", "collective", setting.device.launch_s + gather, setting.device.launch_s + scatter)]


def _reduce(setting: Setting, config: TransformerConfig) -> list[OpCost]:
    """A block's output reduction over TP: an all-reduce (sequence parallelism: a reduce-scatter,
    backward an all-gather). Without SP the backward all-reduce is at the block's input (Megatron's
    f), counted here: the same bytes."""
    if setting.tp == 1:
        return []
    size = setting.tokens * config.hidden_size * setting.element_bytes
    launch = setting.device.launch_s
    if setting.sequence_parallel:
        return [OpCost("tp-reduce-scatter", "collective",
                       launch + reduce_scatter_s(setting.cluster, setting.tp_group, size),
                       launch + allgather_s(setting.cluster, setting.tp_group, size))]
    reduce = launch + allreduce_s(setting.cluster, setting.tp_group, size)
    return [OpCost("tp-all-reduce", "collective", reduce, reduce)]


def embedding_ops(config: TransformerConfig, setting: Setting) -> list[OpCost]:
    """The input embedding on the first stage: a vocabulary-parallel lookup, its TP reduction,
    learned positions and dropout. The lookup reads and writes T h e (its backward scatters the
    gradient into the table: reads T h e, adds into T h fp32 rows)."""
    tokens, h, e = setting.tokens, config.hidden_size, setting.element_bytes
    activations = tokens * h * e
    ops = [memory_op(setting, "lookup", 2 * activations, activations + 2 * tokens * h * 4, "elementwise")]
    if setting.tp > 1:
        size = activations
        launch = setting.device.launch_s
        forward = reduce_scatter_s(setting.cluster, setting.tp_group, size) if setting.sequence_parallel else \
            allreduce_s(setting.cluster, setting.tp_group, size)
        ops.append(OpCost("tp-reduce", "collective", launch + forward))
    local = activations / setting.tp if setting.sequence_parallel else activations
    if config.num_positions:
        ops.append(memory_op(setting, "positions", 3 * local, 2 * local, "elementwise"))
    if config.has_dropout:
        ops.append(memory_op(setting, "dropout", 2 * local + local / e, 2 * local + local / e, "dropout"))
    return ops


def head_ops(config: TransformerConfig, setting: Setting) -> list[OpCost]:
    """The last stage's final norm, logits (T x h x V/t) and vocabulary-parallel cross-entropy.

    The loss is Megatron's unfused one, a pass over the T x V/t logits per step: an fp32 copy (read
    e, write 4), the row maximum (read 4), minus it in place (4 + 4), exp in place (4 + 4), the row
    sum (read 4), divided by it in place (4 + 4), with small all-reduces over TP (max and sums per
    token); its backward scales the kept softmax by the loss's gradient in place (4 + 4; the
    targets' minus one is a gather) and casts it back to e bytes (4 + e). The maximum and the sum
    are row reductions (the ``norm`` kind's rate), the rest element-wise.
    """
    tokens, h, e, t = setting.tokens, config.hidden_size, setting.element_bytes, setting.tp
    local = tokens / t if setting.sequence_parallel else tokens
    vocab = config.vocab_size / t
    ops = [memory_op(setting, "final-norm", 2 * local * h * e, 3 * local * h * e, "norm"), *_gather(setting, config),
           matmul_op(setting, "logits", tokens, vocab, h, linear=False), _cross_entropy(setting, tokens * vocab)]
    if t > 1:
        small = 2 * allreduce_s(setting.cluster, setting.tp_group, tokens * 4.0)
        ops.append(OpCost("loss-all-reduce", "collective", 2 * setting.device.launch_s + small))
    return overlap_tp_collectives(ops, setting)


def _cross_entropy(setting: Setting, logits: float) -> OpCost:
    """The vocabulary-parallel cross-entropy's passes over ``logits`` values (``head_ops``)."""
    device, e = setting.device, setting.element_bytes
    forward = 6 * device.launch_s + device.stream_s(logits * (e + 4 + 8 + 8 + 8), "elementwise") \
        + device.stream_s(logits * (4 + 4), "norm")
    backward = 2 * device.launch_s + device.stream_s(logits * (8 + 4 + e), "elementwise")
    return OpCost("cross-entropy", "memory", forward, backward)


def totals(ops: list[OpCost]) -> tuple[float, float, float]:
    """(forward, input gradient, weight gradient) seconds of ``ops``."""
    return (sum(op.forward_s for op in ops), sum(op.input_grad_s for op in ops), sum(op.weight_grad_s for op in ops))


def check_attention(attention: str) -> None:
    """Raises ConfigError for an attention kind other than flash or unfused."""
    if attention not in ATTENTION_KINDS:
        raise ConfigError("attention", attention, f"must be one of {', '.join(ATTENTION_KINDS)}")
