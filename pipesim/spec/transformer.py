"""Transformer configurations, the published models' presets, and their closed-form sizes and FLOPs.

Notation (Narayanan et al., SC'21; Korthikanti et al., 2022): L layers, hidden size h, FFN size
f, a heads, KV heads g (GQA; g = a is multi-head attention), head size d = h / a, sequence s,
microbatch b, vocabulary V, tensor-parallel degree t.

- Forward FLOPs of one layer: 2bs (h (h + 2gd) + h^2 + n h f) + 4 b s^2 h, with n = 2 for a
  plain FFN and 3 for a gated one (SwiGLU). With g = a, f = 4h, n = 2 this is the 24bsh^2 +
  4bs^2h of Narayanan et al.; with the logit layer's 2bshV, a token's forward costs
  24 L h^2 (1 + s / 6h) + 2Vh, and an iteration with full recomputation (four passes over the
  layers, three over the logits) their equation (3), 96 B s L h^2 (1 + s / 6h + V / 16Lh).
- Activations a layer keeps for its backward, 16-bit, by Korthikanti et al. (Table 2 and
  section 4): sbh (34 + 5as/h) without tensor parallelism; sbh (10 + 24/t + 5as/ht) with it;
  sbh/t (34 + 5as/h) with sequence parallelism too; the 5as/h term goes with selective
  recomputation; 2sbh (the layer's input) with full recomputation. The general form below
  splits the 34 into what tensor parallelism leaves whole (two norm inputs, the QKV and MLP
  inputs, two dropout masks: 10) and what it shards (Q, K, V, the projection input, the MLP's
  inner activations: 24 when g = a and f = 4h), and reduces to their numbers exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipesim.errors import ConfigError
from pipesim.spec.experts import (
    attention_weights,
    ffn_parameters,
    moe_ffn_weights_per_token,
    moe_shared_parameters,
    routed_expert_parameters,
)
from pipesim.spec.presets import lookup

Recompute = Literal["none", "selective", "full"]
RECOMPUTE_MODES: tuple[Recompute, ...] = ("none", "selective", "full")
FfnActivation = Literal["gelu", "relu", "swiglu", "geglu"]
FFN_ACTIVATIONS: tuple[FfnActivation, ...] = ("gelu", "relu", "swiglu", "geglu")


@dataclass(frozen=True)
class TransformerConfig:
    """A transformer stack's shape.

    Attributes:
        name: preset key or free label.
        num_layers, hidden_size, ffn_hidden_size, num_heads, num_kv_heads, vocab_size: L, h, f,
            a, g, V.
        seq_len: the sequence length it was trained at (the default s).
        is_gated_ffn: SwiGLU-style FFN with three h x f matrices (Llama) instead of two.
        has_tied_embeddings: the output head reuses the input embedding (counted once).
        has_bias: linear layers carry biases (GPT-3, BERT) or not (Llama).
        norm: ``"layernorm"`` (weight and bias) or ``"rmsnorm"`` (weight only).
        num_positions: rows of a learned position embedding; 0 for rotary embeddings.
        has_dropout: dropout after attention and MLP (its masks are stashed, one byte each).
        is_encoder: a BERT encoder: token-type embeddings, embedding norm, pooler and MLM head.
        published_parameters: the size its authors state, for the tests.
        source: where the shape and the size come from.
        has_rotary: rotary position embeddings (Llama, GPT-NeoX, Falcon, Qwen2, Phi-3, Gemma):
            no position parameters (ALiBi, as in BLOOM, has none either and leaves this False).
        has_qkv_bias, has_mlp_bias: biases on Q, K, V (Qwen2: on these alone) and on the FFN's
            matrices; None means as ``has_bias``, which then covers the output projection.
        ffn_activation: ``gelu``, ``relu``, ``swiglu`` or ``geglu``; informational, the third
            matrix is ``is_gated_ffn``'s.
        has_parallel_layers: attention and MLP read the same input and add into one residual
            (GPT-NeoX, Falcon) instead of one after the other.
        has_embedding_norm: a norm after the token embedding (BLOOM).
        num_layer_norms: norms per layer: 2 (before attention and MLP), 1 (Falcon-7B's shared
            one), 4 (Gemma 2 also norms both outputs).
        head_size: d when it is not h / a (Gemma: 256); None means h / a. Under MLA the Q and K
            head size, its rotary part included.
        num_experts, num_experts_per_token: a mixture of experts' routed experts E and top-k
            (0: a dense FFN in every layer).
        expert_ffn_hidden_size: one routed expert's FFN size (None: ``ffn_hidden_size``).
        shared_expert_ffn_hidden_size: the FFN size of the shared experts every token passes
            through, all of them together (DeepSeek: count x expert size); 0 for none.
        has_shared_expert_gate: a sigmoid gate (h x 1) on the shared expert's output (Qwen2-MoE).
        num_dense_layers: the first layers keep a dense FFN of ``ffn_hidden_size`` (DeepSeek's
            ``first_k_dense_replace``); the rest are mixtures of experts.
        capacity_factor: tokens an expert takes, as a multiple of an even share (tokens x k / E);
            None: dropless, every expert gets an even share (routing assumed balanced).
        q_lora_rank, kv_lora_rank, qk_rope_head_size, v_head_size: DeepSeek's multi-head latent
            attention (MLA, ``kv_lora_rank`` > 0): Q through a rank-``q_lora_rank`` bottleneck
            (0: projected directly), K and V from a shared rank-``kv_lora_rank`` latent, a
            ``qk_rope_head_size`` rotary part of K shared by all heads, V heads of ``v_head_size``.
    """

    name: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    seq_len: int
    is_gated_ffn: bool = False
    has_tied_embeddings: bool = False
    has_bias: bool = False
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    num_positions: int = 0
    has_dropout: bool = True
    is_encoder: bool = False
    published_parameters: float = 0.0
    source: str = ""
    has_rotary: bool = False
    has_qkv_bias: bool | None = None
    has_mlp_bias: bool | None = None
    ffn_activation: FfnActivation = "gelu"
    has_parallel_layers: bool = False
    has_embedding_norm: bool = False
    num_layer_norms: int = 2
    head_size: int | None = None
    num_experts: int = 0
    num_experts_per_token: int = 0
    expert_ffn_hidden_size: int | None = None
    shared_expert_ffn_hidden_size: int = 0
    has_shared_expert_gate: bool = False
    num_dense_layers: int = 0
    capacity_factor: float | None = None
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_size: int = 0
    v_head_size: int | None = None

    def __post_init__(self) -> None:
        for field in ("num_layers", "hidden_size", "ffn_hidden_size", "num_heads", "num_kv_heads", "seq_len"):
            if getattr(self, field) < 1:
                raise ConfigError(field, getattr(self, field), "must be >= 1")
        if self.head_size is None and self.hidden_size % self.num_heads:
            raise ConfigError("num_heads", self.num_heads, f"must divide hidden_size ({self.hidden_size})")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError("num_kv_heads", self.num_kv_heads, f"must divide num_heads ({self.num_heads})")
        if self.head_size is not None and self.head_size < 1:
            raise ConfigError("head_size", self.head_size, "must be >= 1 (or null for hidden_size / num_heads)")
        if self.num_layer_norms < 0:
            raise ConfigError("num_layer_norms", self.num_layer_norms, "must be >= 0")
        if self.ffn_activation not in FFN_ACTIVATIONS:
            raise ConfigError("ffn_activation", self.ffn_activation, f"must be one of {', '.join(FFN_ACTIVATIONS)}")
        self._check_experts()
        self._check_latent_attention()

    def _check_experts(self) -> None:
        for field in ("num_experts", "num_experts_per_token", "shared_expert_ffn_hidden_size", "num_dense_layers",
                      "q_lora_rank", "kv_lora_rank", "qk_rope_head_size"):
            if getattr(self, field) < 0:
                raise ConfigError(field, getattr(self, field), "must be >= 0")
        if self.num_experts == 1:
            raise ConfigError("num_experts", 1, "must be 0 (a dense FFN) or >= 2 (a mixture of experts)")
        if self.num_experts and not 1 <= self.num_experts_per_token <= self.num_experts:
            raise ConfigError("num_experts_per_token", self.num_experts_per_token,
                              f"must be in 1..{self.num_experts} (the routed experts)")
        if not self.num_experts and (self.num_experts_per_token or self.shared_expert_ffn_hidden_size
                                     or self.num_dense_layers or self.has_shared_expert_gate):
            raise ConfigError("num_experts", 0, "must be >= 2 where a config sets top-k, shared experts or dense "
                              "layers")
        if self.num_dense_layers > self.num_layers:
            raise ConfigError("num_dense_layers", self.num_dense_layers, f"must be <= num_layers ({self.num_layers})")
        if self.expert_ffn_hidden_size is not None and self.expert_ffn_hidden_size < 1:
            raise ConfigError("expert_ffn_hidden_size", self.expert_ffn_hidden_size, "must be >= 1 (or null)")
        if self.capacity_factor is not None and not self.capacity_factor > 0:
            raise ConfigError("capacity_factor", self.capacity_factor, "must be > 0 (or null: dropless)")

    def _check_latent_attention(self) -> None:
        if not self.kv_lora_rank:
            if self.q_lora_rank or self.qk_rope_head_size or self.v_head_size is not None:
                raise ConfigError("kv_lora_rank", 0, "must be > 0 where q_lora_rank, qk_rope_head_size or "
                                  "v_head_size is set (multi-head latent attention)")
            return
        if self.num_kv_heads != self.num_heads:
            raise ConfigError("num_kv_heads", self.num_kv_heads, f"must equal num_heads ({self.num_heads}) under "
                              "multi-head latent attention")
        if not 0 < self.qk_rope_head_size < self.head_dim:
            raise ConfigError("qk_rope_head_size", self.qk_rope_head_size, f"must be in 1..{self.head_dim - 1} "
                              "(the rotary part of the Q and K head size)")
        if self.v_head_size is None or self.v_head_size < 1:
            raise ConfigError("v_head_size", self.v_head_size, "must be >= 1 under multi-head latent attention")

    @property
    def head_dim(self) -> int:
        """d: ``head_size`` where given, else h / a."""
        return self.head_size if self.head_size is not None else self.hidden_size // self.num_heads

    @property
    def q_size(self) -> int:
        """a d: the width of Q (and the output projection's input); h unless ``head_size`` says otherwise."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """g d: the width of K (and of V)."""
        return self.num_kv_heads * self.head_dim

    @property
    def v_size(self) -> int:
        """The width of V: g d, or under MLA a x ``v_head_size`` (the output projection's input too)."""
        return self.num_heads * self.v_head_size if self.v_head_size is not None else self.kv_size

    @property
    def is_moe(self) -> bool:
        """Whether the layers past ``num_dense_layers`` are mixtures of experts."""
        return self.num_experts > 0

    @property
    def expert_ffn_size(self) -> int:
        """One routed expert's FFN size."""
        return self.ffn_hidden_size if self.expert_ffn_hidden_size is None else self.expert_ffn_hidden_size

    @property
    def num_moe_layers(self) -> int:
        """Layers whose FFN is a mixture of experts (the last L - ``num_dense_layers``)."""
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer ``index`` (0-based) is a mixture of experts."""
        return self.is_moe and index >= self.num_dense_layers

    @property
    def norm_parameters(self) -> int:
        """Parameters of one norm: 2h for LayerNorm, h for RMSNorm."""
        return (2 if self.norm == "layernorm" else 1) * self.hidden_size


def _gpt(name: str, layers: int, hidden: int, heads: int, published: float, source: str) -> TransformerConfig:
    return TransformerConfig(name=name, num_layers=layers, hidden_size=hidden, ffn_hidden_size=4 * hidden,
                             num_heads=heads, num_kv_heads=heads, vocab_size=50257, seq_len=2048,
                             has_tied_embeddings=True, has_bias=True, num_positions=2048,
                             published_parameters=published, source=source)


def _llama(name: str, layers: int, hidden: int, ffn: int, heads: int, kv_heads: int, vocab: int, seq: int,
           published: float, source: str) -> TransformerConfig:
    return TransformerConfig(name=name, num_layers=layers, hidden_size=hidden, ffn_hidden_size=ffn, num_heads=heads,
                             num_kv_heads=kv_heads, vocab_size=vocab, seq_len=seq, is_gated_ffn=True,
                             norm="rmsnorm", has_dropout=False, published_parameters=published, source=source,
                             has_rotary=True, ffn_activation="swiglu")


# Shapes and sizes as their papers and model cards state them (recalled in this session).
PRESETS: dict[str, TransformerConfig] = {
    "gpt3-175b": _gpt("gpt3-175b", 96, 12288, 96, 175e9,
                      "Brown et al. 2020, Language Models are Few-Shot Learners, Table 2.1 (175.0B)"),
    "llama2-7b": _llama("llama2-7b", 32, 4096, 11008, 32, 32, 32000, 4096, 6.74e9,
                        "Touvron et al. 2023, Llama 2, Table 1; 6.74B in Meta's model card"),
    "llama2-70b": _llama("llama2-70b", 80, 8192, 28672, 64, 8, 32000, 4096, 69.0e9,
                         "Touvron et al. 2023, Llama 2, Table 1 (GQA, 8 KV heads); 69.0B in Meta's model card"),
    "llama3-8b": _llama("llama3-8b", 32, 4096, 14336, 32, 8, 128256, 8192, 8.03e9,
                        "Llama 3 Herd of Models 2024, Table 3; 8.03B in Meta's model card"),
    "llama3-70b": _llama("llama3-70b", 80, 8192, 28672, 64, 8, 128256, 8192, 70.6e9,
                         "Llama 3 Herd of Models 2024, Table 3; 70.6B in Meta's model card"),
    "llama3-405b": _llama("llama3-405b", 126, 16384, 53248, 128, 8, 128256, 8192, 405e9,
                          "Llama 3 Herd of Models 2024, Table 3 (405B)"),
    "bert-large": TransformerConfig(name="bert-large", num_layers=24, hidden_size=1024, ffn_hidden_size=4096,
                                    num_heads=16, num_kv_heads=16, vocab_size=30522, seq_len=512, has_bias=True,
                                    has_tied_embeddings=True,
                                    num_positions=512, is_encoder=True, published_parameters=340e6,
                                    source="Devlin et al. 2019, BERT, section 3: 340M, two significant figures "
                                           "(336.2M with the MLM head, 335.1M without; BERT-base's 110M is "
                                           "109.5M rounded the same way)"),
}


def preset(name: str) -> TransformerConfig:
    """The published model called ``name`` (case-insensitive).

    Raises:
        ConfigError: an unknown name; the message lists the known ones.
    """
    return lookup(PRESETS, "model", name)


def layer_linear_parameters(config: TransformerConfig) -> int:
    """Weights and biases of one dense layer's matrices: QKV, output projection and FFN (up and
    down, and the gate of a gated FFN)."""
    h, q, kv = config.hidden_size, config.q_size, config.kv_size
    has_qkv_bias = config.has_bias if config.has_qkv_bias is None else config.has_qkv_bias
    biases = (q + 2 * kv if has_qkv_bias else 0) + (h if config.has_bias else 0)
    return attention_weights(config) + biases + ffn_parameters(config, config.ffn_hidden_size)


def layer_norm_parameters(config: TransformerConfig) -> int:
    """One layer's norms (and MLA's norms of its two latents)."""
    return config.num_layer_norms * config.norm_parameters + (config.q_lora_rank + config.kv_lora_rank)


def layer_parameters(config: TransformerConfig, *, moe: bool = False) -> int:
    """Parameters of one layer: its matrices and its norms (12h^2 + 13h for GPT); ``moe``: a
    mixture-of-experts layer, its FFN the router, all routed experts and the shared ones."""
    if not moe:
        return layer_linear_parameters(config) + layer_norm_parameters(config)
    dense_ffn = ffn_parameters(config, config.ffn_hidden_size)
    return layer_parameters(config) - dense_ffn + moe_shared_parameters(config) + routed_expert_parameters(config)


def embedding_parameters(config: TransformerConfig) -> int:
    """Token and position embeddings (and BERT's token types and embedding norm, BLOOM's embedding norm)."""
    h = config.hidden_size
    encoder = 2 * h + config.norm_parameters if config.is_encoder else 0
    norm = config.norm_parameters if config.has_embedding_norm else 0
    return config.vocab_size * h + config.num_positions * h + encoder + norm


def head_parameters(config: TransformerConfig) -> int:
    """The final norm and the output head, without the tied embedding (BERT: pooler and MLM head)."""
    h = config.hidden_size
    output = 0 if config.has_tied_embeddings else config.vocab_size * h
    if config.is_encoder:  # pooler h x h, MLM transform h x h with its norm, and the output bias
        return output + 2 * (h * h + h) + config.norm_parameters + config.vocab_size
    return output + config.norm_parameters


def parameters(config: TransformerConfig) -> int:
    """Parameters of the whole model (a tied embedding counted once)."""
    dense = config.num_layers - config.num_moe_layers
    return embedding_parameters(config) + dense * layer_parameters(config) \
        + config.num_moe_layers * layer_parameters(config, moe=True) + head_parameters(config)


def active_parameters_per_token(config: TransformerConfig) -> int:
    """The parameters one token's forward uses: all but the routed experts it is not sent to
    (E - k of them in each mixture-of-experts layer); embeddings counted, as Mistral and Qwen count."""
    unused = (config.num_experts - config.num_experts_per_token) * ffn_parameters(config, config.expert_ffn_size)
    return parameters(config) - config.num_moe_layers * unused


def layer_forward_flops(config: TransformerConfig, *, tokens: int, seq_len: int,
                        moe: bool = False) -> tuple[float, float]:
    """``(matmul, attention)`` forward FLOPs of one layer over ``tokens`` = b s tokens.

    ``matmul``: the weight matrices, 2 FLOPs per weight and token (a mixture of experts: the
    router, k routed experts and the shared ones); ``attention``: QK^T and attention over V,
    2 b s^2 h each (no saving for the causal mask, as Narayanan et al. count; MLA: 2 b s^2 a d_qk
    and 2 b s^2 a d_v).
    """
    h, f, q = config.hidden_size, config.ffn_hidden_size, config.q_size
    ffn = moe_ffn_weights_per_token(config) if moe else (3 if config.is_gated_ffn else 2) * h * f
    if config.kv_lora_rank:
        core = 2.0 * tokens * seq_len * (q + config.v_size)
    else:
        core = 4.0 * tokens * seq_len * q
    return 2.0 * tokens * (attention_weights(config) + ffn), core


def head_forward_flops(config: TransformerConfig, *, tokens: int) -> float:
    """Forward FLOPs of the output head (logits: 2 h V per token; BERT adds its h x h transform)."""
    h = config.hidden_size
    return 2.0 * tokens * h * config.vocab_size + (2.0 * tokens * h * h if config.is_encoder else 0.0)


def forward_flops_per_token(config: TransformerConfig, seq_len: int | None = None) -> float:
    """Forward FLOPs of the whole model per token at sequence length ``seq_len`` (default the config's)."""
    s = seq_len or config.seq_len
    matmul, attention = layer_forward_flops(config, tokens=1, seq_len=s)
    if not config.is_moe:
        return config.num_layers * (matmul + attention) + head_forward_flops(config, tokens=1)
    expert_matmul, _ = layer_forward_flops(config, tokens=1, seq_len=s, moe=True)
    return (config.num_dense_layers * (matmul + attention) + config.num_moe_layers * (expert_matmul + attention)
            + head_forward_flops(config, tokens=1))


def layer_activation_bytes(
    config: TransformerConfig,
    *,
    microbatch_size: int,
    seq_len: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: Recompute = "none",
    attention: str = "unfused",
    moe: bool = False,
) -> float:
    """Bytes one layer stashes for its backward, 16-bit activations (Korthikanti et al., 2022).

    Their count is for an unfused attention, which keeps its scores; a fused (``flash``) one
    keeps none (it re-computes them in its backward), as selective recomputation would drop them.
    Under MLA, Q and K are a d_qk wide, V and the projection's input a d_v, and the latents (and
    their normed copies) are kept whole. A mixture-of-experts layer (``moe``) keeps, for the k
    copies of each token its experts take (x the capacity factor), the experts' inputs and
    outputs whole and their inner activations sharded, the shared experts' inner activations,
    and the router's fp32 probabilities (T x E).

    Raises:
        ConfigError: an unknown recompute mode or a degree below 1.
    """
    if recompute not in RECOMPUTE_MODES:
        raise ConfigError("recompute", recompute, f"must be one of {', '.join(RECOMPUTE_MODES)}")
    if tp < 1:
        raise ConfigError("tp", tp, "must be >= 1")
    s, b, h, f = seq_len, microbatch_size, config.hidden_size, config.ffn_hidden_size
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh / (tp if sequence_parallel else 1)
    masks = 2 * sbh if config.has_dropout else 0  # attention and MLP dropout masks, a byte each
    whole: float = 2 * config.num_layer_norms * sbh + 2 * sbh + 2 * sbh + masks  # norm inputs (two), QKV, MLP inputs
    inner = 3 if config.is_gated_ffn else 2  # gate and up outputs and their product, or GeLU in and out
    tokens = s * b
    if config.kv_lora_rank:  # Q, K; V, projection input; the Q latent and the KV latent (with K's rotary part)
        attention_sharded = 2 * tokens * (2 * config.q_size + 2 * config.v_size)
        whole += 2 * tokens * (2 * config.q_lora_rank + 2 * config.kv_lora_rank + config.qk_rope_head_size)
    else:  # Q; K, V; projection input
        attention_sharded = 2 * sbh + 4 * s * b * config.kv_size + 2 * sbh
    if moe:
        routed = tokens * config.num_experts_per_token * (config.capacity_factor or 1)
        whole += 4 * routed * h + 4 * tokens * config.num_experts
        sharded = attention_sharded + inner * 2 * (routed * config.expert_ffn_size
                                                   + tokens * config.shared_expert_ffn_hidden_size)
    else:
        sharded = attention_sharded + inner * 2 * s * b * f  # MLP
    # softmax output (2 bytes), dropout mask (1) and dropout output (2) per score; without dropout
    # the softmax output alone feeds both backwards.
    scores = (5 if config.has_dropout else 2) * config.num_heads * s * s * b
    core = 0 if recompute == "selective" or attention == "flash" else scores / tp
    if sequence_parallel:
        return (whole + sharded) / tp + core
    return whole + sharded / tp + core
