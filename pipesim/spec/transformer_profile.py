"""A Profile of a transformer from its config, a device and a cluster: the per-layer costs the engines run on.

Layers: ``embedding``, one per transformer layer, ``head`` (final norm, logits and loss), so a
pipeline's first and last stages carry their real extra weight and time.

- Times: each layer is its ops (``pipesim.spec.opcost``), priced on the device's curves and the
  cluster's tiers: forward, input gradient (I) and weight gradient (W) apart, so B = I + W.
- Recomputation is part of the profile: selective re-runs the attention core's forward in I,
  full re-runs the whole layer's forward (its TP collectives too) in I, one layer at a time
  (Megatron's per-layer checkpoints); the stash is what remains (Korthikanti et al.; a fused
  attention keeps no scores), and what a layer's I re-creates and holds is its
  ``recomputed_bytes``.
- Data parallelism of degree D (over DP x CP ranks, ``pipesim.spec.layout``): each layer's
  gradients are reduced over the DP group on the tier it spans (an all-reduce; with ZeRO-1 /
  the distributed optimizer a reduce-scatter of the gradients and an all-gather of the
  weights), after the minibatch's last backward or overlapped with it (``dp_overlap``: then the
  communication kernels take their tier's ``compute_share`` of the compute while they run);
  ZeRO-2 and 3 reduce (and gather) per layer and microbatch. Gradients travel in fp32 under
  bf16 (Megatron's rule) and in fp16 under fp16. The optimizer step (mixed-precision Adam,
  ``ADAM_BYTES_PER_PARAMETER`` bytes streamed per parameter, more under fp16, over D with ZeRO)
  is each layer's ``update_s``; a tied embedding's gradient is also all-reduced between the first
  and last stage (``pipesim.spec.sharding``).
- Context parallelism of degree C: each rank holds b s / C tokens of every sequence: its ops,
  stash and sends are those of its tokens, its attention a ring (``pipesim.spec.opcost``).
- Mixture of experts: the layers past ``num_dense_layers`` run the router, dispatch, experts and
  combine (``pipesim.spec.moe_ops``); a rank holds E / EP of the routed experts.
- Stash: ``layer_activation_bytes``. The head keeps its norm's and the logit layer's inputs
  (2 b s h each); the fp32 logits (4 b s V / t) are ``loss_bytes``, the token ids (int64) the
  ``input_bytes``; the embedding keeps its dropout mask when the model has dropout.
- Sent between stages: b s h activations, a TP rank's 1/t share of them when t > 1 (sequence
  parallelism keeps them sharded; without it Megatron's scatter/gather sends 1/t and
  all-gathers on arrival, whose time ``pipeline_bandwidth_bytes_per_s`` folds into the link).
"""

from __future__ import annotations

from typing import Any

from pipesim.errors import ConfigError
from pipesim.spec.cluster import Cluster, load_cluster
from pipesim.spec.collectives import Group, group_path, send_tier
from pipesim.spec.device import Device, load_device
from pipesim.spec.experts import routed_expert_parameters
from pipesim.spec.layout import PLACEMENTS as PLACEMENTS  # where the CLI and search import them
from pipesim.spec.layout import Parallelism as Parallelism
from pipesim.spec.opcost import (Attention, OpCost, Setting, check_attention, embedding_ops, head_ops, layer_ops,
                                  totals, tp_overlap_applies)
from pipesim.spec.profile import Profile
from pipesim.spec.sharding import ADAM_BYTES_PER_PARAMETER as ADAM_BYTES_PER_PARAMETER
from pipesim.spec.sharding import ADAM_STATE_MULTIPLIER as ADAM_STATE_MULTIPLIER
from pipesim.spec.sharding import FP16_EXTRA_BYTES_PER_PARAMETER as FP16_EXTRA_BYTES_PER_PARAMETER
from pipesim.spec.sharding import BYTES_PER_VALUE, ZERO_STAGES, add_update
from pipesim.spec.topology import Link, Topology
from pipesim.spec.transformer import (
    RECOMPUTE_MODES,
    Recompute,
    TransformerConfig,
    embedding_parameters,
    head_parameters,
    layer_activation_bytes,
    layer_linear_parameters,
    layer_norm_parameters,
    preset,
)
from pipesim.spec.validation import build

TOKEN_ID_BYTES = 8  # a token id as torch.long, the dtype nn.Embedding takes
ATTENTION_CORE = ("scores", "softmax", "attention-dropout", "context", "attention", "ring-attention")


def resolve_device(device: str | Device) -> Device:
    return load_device(device) if isinstance(device, str) else device


def default_cluster(device: Device) -> Cluster:
    """The cluster a device's file names (its DGX/HGX system), else the first shipped one."""
    return load_cluster(device.default_cluster or "dgx-h100")


def transformer_profile(
    model: str | TransformerConfig,
    *,
    device: str | Device = "h100",
    cluster: str | Cluster | None = None,
    microbatch_size: int = 1,
    seq_len: int | None = None,
    tp: int = 1,
    sequence_parallel: bool = False,
    tp_overlap: bool = False,
    recompute: Recompute = "none",
    precision: str | None = None,
    attention: Attention = "flash",
    efficiency: float | None = None,
    include_embeddings: bool = True,
    pp: int = 1,
    dp: int = 1,
    zero: int = 0,
    dp_overlap: bool = False,
    placement: str = "tp-in-node",
    cp: int = 1,
    ep: int = 1,
    layer_state: bool = False,
    update_communication: list[float] | None = None,
    collectives: list[float] | None = None,
) -> Profile:
    """The per-layer profile of ``model`` on one rank of ``device`` in ``cluster``.

    Args:
        model: a preset key (``gpt3-175b``, ``llama3-70b``, ...) or a TransformerConfig.
        device, cluster: a shipped name or a loaded file; the cluster defaults to the device's.
        microbatch_size, seq_len: b and s (s defaults to the model's).
        tp, sequence_parallel: tensor-parallel degree and Megatron's sequence parallelism.
        tp_overlap: with sequence parallelism, its all-gathers and reduce-scatters beside the
            GEMMs next to them (Megatron-Core's ``--tp-comm-overlap``; ``opcost.overlap_tp_collectives``).
        recompute: ``none``, ``selective`` (attention core) or ``full``.
        precision: matrix precision (bf16, fp16, fp8; default the device's 16-bit type).
        attention: ``flash`` (fused) or ``unfused`` (batched products, softmax, dropout).
        efficiency: replaces the device's sustained matrix share of peak (a what-if).
        include_embeddings: False leaves out the embedding and head layers (a bare stack).
        pp, dp, zero, dp_overlap, placement: the pipeline depth (for placement), data
            parallelism, ZeRO stage (0 to 3; 3 is FSDP), overlap of the gradient reduction, and placement.
        cp, ep: context parallelism (the sequence split over ``cp`` ranks) and expert parallelism
            (the routed experts split over ``ep`` of the DP x CP ranks).
        layer_state: every layer states its gradient and (Adam's) optimizer bytes, as ZeRO shards
            them, in place of the plan's optimizer multiplier (as they do anyway under ZeRO-2/3).
        update_communication: when given, receives per profile layer the seconds of its
            ``update_s`` that are data-parallel communication (the rest is the optimizer step).
        collectives: when given, receives per profile layer the seconds of its forward and
            backward (recomputation included) that are collectives (TP/SP, the experts' exchange,
            the loss's all-reduce): what a step breakdown calls TP communication.

    Raises:
        ConfigError: a bad count, an unknown preset, device, cluster, precision or mode, or a
            degree that does not divide what it splits (heads, sequence, experts, DP x CP).
    """
    config = preset(model) if isinstance(model, str) else model
    spec = resolve_device(device)
    if efficiency is not None:
        if not 0 < efficiency <= 1:
            raise ConfigError("efficiency", efficiency, "must be in (0, 1]")
        spec = spec.model_copy(update={"matmul": spec.matmul.model_copy(update={"max_efficiency": efficiency})})
    wiring = default_cluster(spec) if cluster is None else load_cluster(cluster) if isinstance(cluster, str) else cluster
    s = seq_len if seq_len is not None else config.seq_len
    _check(config, microbatch_size=microbatch_size, seq_len=s, tp=tp, recompute=recompute, zero=zero)
    if tp_overlap and not tp_overlap_applies(sequence_parallel, tp):
        raise ConfigError("tp_overlap", True, "needs --sequence-parallel with --tp T > 1 (it overlaps sequence "
                          "parallelism's all-gathers and reduce-scatters with the GEMMs beside them)")
    check_attention(attention)
    layout = Parallelism(tp=tp, pp=pp, dp=dp, placement=placement, cp=cp, ep=ep)
    _check_split(config, layout, seq_len=s, attention=attention, zero=zero, dp_overlap=dp_overlap)
    tp_stride = layout.strides[0]
    chosen = precision or spec.default_precision
    spec.peak(chosen)  # refuses a precision the card lacks before any work
    setting = Setting(device=spec, cluster=wiring, precision=chosen, microbatch_size=microbatch_size, seq_len=s,
                      tp=tp, sequence_parallel=sequence_parallel and tp > 1, attention=attention, tp_stride=tp_stride,
                      cp=cp, cp_stride=layout.cp_stride, ep=ep, ep_stride=layout.expert_group.stride,
                      tp_overlap=tp_overlap)
    b, h, t = microbatch_size, config.hidden_size, tp
    local = s // cp  # the tokens of each sequence this rank holds
    sent = b * local * h * BYTES_PER_VALUE / t

    kinds = [False, True] if config.is_moe and config.num_dense_layers else [config.is_moe]
    blocks = {moe: _block(config, setting, recompute=recompute, moe=moe, sent=sent) for moe in kinds}
    layers = [dict(blocks[config.is_moe_layer(index)], name=f"layer{index}") for index in range(config.num_layers)]
    experts = [routed_expert_parameters(config) / (t * ep) if config.is_moe_layer(index) else 0.0
               for index in range(config.num_layers)]
    if include_embeddings:
        embed_forward, embed_input, embed_weight = totals(embedding_ops(config, setting))
        embedding = _layer("embedding", forward=embed_forward, backward_input=embed_input, backward_weight=embed_weight,
                           sent=sent, stash=float(b * local * h if config.has_dropout else 0),
                           params=embedding_parameters(config) / t * BYTES_PER_VALUE)
        head_forward, head_input, head_weight = totals(head_ops(config, setting))
        # A tied output layer reuses the embedding's table: on one pipeline stage that is the same
        # table, with several the last stage keeps its own copy (kept equal by an all-reduce).
        head_weights = head_parameters(config) + (config.vocab_size * h if config.has_tied_embeddings and pp > 1
                                                  else 0)
        head = _layer("head", forward=head_forward, backward_input=head_input, backward_weight=head_weight, sent=0.0,
                      stash=4.0 * b * local * h, params=head_weights / t * BYTES_PER_VALUE)
        layers, experts = [embedding, *layers, head], [0.0, *experts, 0.0]
    if collectives is not None:
        collectives += _collective_seconds(config, setting, recompute=recompute, embeddings=include_embeddings)
    add_update(layers, experts, config, setting, layout, zero=zero, overlap=dp_overlap,
               has_embeddings=include_embeddings, layer_state=layer_state, communication=update_communication)
    parallel = f", tp={t}" + (" with sequence parallelism" if setting.sequence_parallel else "") \
        + (", its collectives overlapped" if tp_overlap else "") if t > 1 else ""
    parallel += "".join(f", {name}={degree}" for name, degree in (("cp", cp), ("ep", ep), ("zero", zero)) if degree > 1)
    return build(Profile, {
        "name": config.name,
        "layers": layers,
        "input_bytes": TOKEN_ID_BYTES * b * local if include_embeddings else None,
        "loss_bytes": 4.0 * b * local * config.vocab_size / t if include_embeddings else None,
        "microbatch_size": b,
        "dtype": chosen,
        "device": f"{spec.name} ({chosen}, matrix {spec.matmul.max_efficiency:g} of {spec.peak(chosen) / 1e12:g} "
                  f"TFLOP/s peak) in {wiring.name}",
        "source": f"pipesim.transformer_profile: {config.name}, s={s}, recompute={recompute}, attention={attention}"
                  f"{parallel}; {config.source}",
    })


def _block(config: TransformerConfig, setting: Setting, *, recompute: Recompute, moe: bool,
           sent: float) -> dict[str, Any]:
    """One transformer layer of the profile (dense, or a mixture of experts): its ops' times with
    the recomputation's re-run forward in I, its stash and what its I re-creates, its weights."""
    ops = layer_ops(config, setting, moe=moe)
    forward, input_grad, weight_grad = totals(ops)
    redo = {"none": 0.0, "selective": sum(op.forward_s for op in ops if op.name in ATTENTION_CORE),
            "full": forward}[recompute]
    stash, whole = (layer_activation_bytes(config, microbatch_size=setting.microbatch_size,
                                           seq_len=setting.seq_len // setting.cp, tp=setting.tp,
                                           sequence_parallel=setting.sequence_parallel, recompute=mode,
                                           attention=setting.attention, moe=moe) for mode in (recompute, "none"))
    block = _layer("layer", forward=forward, backward_input=input_grad + redo, backward_weight=weight_grad,
                   sent=sent, stash=stash, params=rank_layer_parameters(config, tp=setting.tp, ep=setting.ep, moe=moe)
                   * BYTES_PER_VALUE)
    if whole != stash:
        block["recomputed_bytes"] = whole - stash
    return block


def _collective_seconds(config: TransformerConfig, setting: Setting, *, recompute: Recompute,
                        embeddings: bool) -> list[float]:
    """Per profile layer, the seconds of its ops that are collectives (forward, I, W, and the
    forward again under full recomputation)."""
    def seconds(ops: list[OpCost], again: bool) -> float:
        chosen = [op for op in ops if op.kind == "collective"]
        forward, input_grad, weight_grad = totals(chosen)
        return forward * (2 if again else 1) + input_grad + weight_grad

    kinds = {moe: seconds(layer_ops(config, setting, moe=moe), recompute == "full") for moe in {False, config.is_moe}}
    blocks = [kinds[config.is_moe_layer(index)] for index in range(config.num_layers)]
    if not embeddings:
        return blocks
    return [seconds(embedding_ops(config, setting), False), *blocks, seconds(head_ops(config, setting), False)]


def rank_layer_parameters(config: TransformerConfig, *, tp: int, ep: int = 1, moe: bool = False) -> float:
    """One layer's parameters on one rank: its matrices over TP (MLA's down-projections and a
    mixture's router and shared-expert gate whole, the routed experts over TP x EP), its norms whole."""
    if not moe and not config.kv_lora_rank:
        return layer_linear_parameters(config) / tp + config.num_layer_norms * config.norm_parameters
    from pipesim.spec.experts import ffn_parameters, moe_shared_parameters  # noqa: PLC0415 - MoE and MLA only

    h = config.hidden_size
    whole = h * config.q_lora_rank + h * (config.kv_lora_rank + config.qk_rope_head_size) if config.kv_lora_rank else 0
    split = layer_linear_parameters(config) - whole
    if not moe:
        return split / tp + whole + layer_norm_parameters(config)
    router = h * config.num_experts + (h if config.has_shared_expert_gate else 0)
    split += moe_shared_parameters(config) - router - ffn_parameters(config, config.ffn_hidden_size)
    return split / tp + whole + router + routed_expert_parameters(config) / (tp * ep) + layer_norm_parameters(config)


def pipeline_hop_tiers(cluster: Cluster, parallelism: Parallelism) -> tuple[int, ...]:
    """The tier each pipeline hop crosses: r -> r + 1 for r = 0 .. P - 2, then P - 1 -> 0 (the
    interleaved schedules' wrap; none for P = 1). A hop's tier is the outermost that any GPU of
    rank r crosses to its peer on the other rank (a stage's message has arrived when every TP
    shard's part has), so a pipeline of ranks a few GPUs apart crosses NVLink inside a node and the
    network between nodes."""
    pp, stride = parallelism.pp, parallelism.strides[1]
    # The GPUs of pipeline rank r: r S + q S P + i (i < S, q < N / (S P)). Whether a pair crosses
    # a tier depends on the GPUs' places within the largest finite domain, so one period of each
    # index is enough (the domains are multiples of each other).
    period = max((tier.gpus for tier in cluster.tiers if tier.gpus), default=1)
    replicas = max(1, parallelism.num_gpus // (stride * pp))
    offsets = [q * stride * pp + i for q in range(min(replicas, period)) for i in range(min(stride, period))]

    def crossed(first: int, second: int) -> int:
        return max(_pair_tier(cluster, first * stride + offset, second * stride + offset) for offset in offsets)

    return tuple(crossed(rank, rank + 1) for rank in range(pp - 1)) + ((crossed(pp - 1, 0),) if pp > 1 else ())


def _pair_tier(cluster: Cluster, first: int, second: int) -> int:
    """The innermost tier whose domain holds both GPUs."""
    for index, tier in enumerate(cluster.tiers):
        if tier.gpus is None or first // tier.gpus == second // tier.gpus:
            return index
    return len(cluster.tiers) - 1


def pipeline_hop(cluster: Cluster, parallelism: Parallelism, tier: int,
                 *, sequence_parallel: bool = False) -> tuple[float, float]:
    """``(latency_s, bytes per second)`` of a pipeline message on ``tier``: its latency, and the rate
    a stage's sent bytes (its 1/t share when t > 1) reach the next stage, without sequence
    parallelism the TP all-gather on arrival folded in per byte sent: 1 / (1 / rate + (t - 1) / TP bus rate)."""
    rate, latency = cluster.tiers[tier].rate_bytes_per_s, cluster.tiers[tier].latency_s
    if parallelism.tp == 1 or sequence_parallel:
        return latency, rate
    bus = group_path(cluster, Group(parallelism.tp, parallelism.strides[0])).bus_bytes_per_s
    return latency, 1.0 / (1.0 / rate + (parallelism.tp - 1) / bus)


def pipeline_bandwidth_bytes_per_s(cluster: Cluster, parallelism: Parallelism,
                                   *, sequence_parallel: bool = False) -> float:
    """The rate of the pipeline's fastest hop (``pipeline_hop``): what a lower bound on the step may
    assume of every hop."""
    return max(pipeline_hop(cluster, parallelism, tier, sequence_parallel=sequence_parallel)[1]
               for tier in _hop_tiers(cluster, parallelism))


def pipeline_latency_s(cluster: Cluster, parallelism: Parallelism) -> float:
    """The latency of the pipeline's fastest hop."""
    return min(cluster.tiers[tier].latency_s for tier in _hop_tiers(cluster, parallelism))


def _hop_tiers(cluster: Cluster, parallelism: Parallelism) -> tuple[int, ...]:
    """The pipeline's hop tiers, or with one stage the tier a send one stride away would cross."""
    return pipeline_hop_tiers(cluster, parallelism) or (send_tier(cluster, parallelism.strides[1]),)


def pipeline_topology(cluster: Cluster, parallelism: Parallelism, *, memory_bytes: float,
                      sequence_parallel: bool = False) -> Topology:
    """The P pipeline ranks, each hop on the tier it crosses (``pipeline_hop_tiers``): the outermost
    hop's tier between any two ranks, and a link of their own for the hops on an inner tier."""
    tiers = _hop_tiers(cluster, parallelism)
    outer = max(tiers)
    latency, rate = pipeline_hop(cluster, parallelism, outer, sequence_parallel=sequence_parallel)
    topology = Topology.uniform(num_devices=parallelism.pp, memory_bytes=memory_bytes, bandwidth=rate, latency=latency)
    pp = parallelism.pp
    pairs = [(rank, rank + 1) for rank in range(pp - 1)] + ([(pp - 1, 0)] if pp > 2 else [])
    links = []
    for (src, dst), tier in zip(pairs, tiers, strict=False):
        if tier != outer:
            hop_latency, hop_rate = pipeline_hop(cluster, parallelism, tier, sequence_parallel=sequence_parallel)
            links.append(Link(src=src, dst=dst, bandwidth_bytes_per_s=hop_rate, latency_s=hop_latency))
    return topology.model_copy(update={"links": tuple(links)}) if links else topology


def _layer(name: str, *, forward: float, backward_input: float, backward_weight: float, sent: float, stash: float,
           params: float) -> dict[str, Any]:
    """One profile layer; recomputation is already in its times and stash, so the engine's selective
    recomputation leaves it alone."""
    return {"name": name, "forward_s": forward, "backward_s": backward_input + backward_weight,
            "backward_input_s": backward_input, "backward_weight_s": backward_weight, "activation_bytes": sent,
            "stash_bytes": stash, "param_bytes": params, "selective_recompute": False}


def _check(config: TransformerConfig, *, microbatch_size: int, seq_len: int, tp: int, recompute: str,
           zero: int) -> None:
    for field, value in (("microbatch_size", microbatch_size), ("seq_len", seq_len), ("tp", tp)):
        if value < 1:
            raise ConfigError(field, value, "must be >= 1")
    if recompute not in RECOMPUTE_MODES:
        raise ConfigError("recompute", recompute, f"must be one of {', '.join(RECOMPUTE_MODES)}")
    if config.num_kv_heads % tp and tp % config.num_kv_heads:
        raise ConfigError("tp", tp, f"must divide the KV heads ({config.num_kv_heads}) or be a multiple of them")
    if config.num_heads % tp:
        raise ConfigError("tp", tp, f"must divide the heads ({config.num_heads})")
    if zero not in ZERO_STAGES:
        raise ConfigError("zero", zero, "must be 0 (none), 1 (optimizer state), 2 (and gradients) or 3 (and weights: "
                          "FSDP) sharded over the data-parallel ranks")


def _check_split(config: TransformerConfig, layout: Parallelism, *, seq_len: int, attention: str, zero: int,
                 dp_overlap: bool) -> None:
    """Refuses a context- or expert-parallel degree that does not divide what it splits, and ZeRO
    settings that have nothing to shard."""
    cp, ep = layout.cp, layout.ep
    if seq_len % (2 * cp) and cp > 1:
        raise ConfigError("cp", cp, f"must split the sequence ({seq_len}) into 2 x cp = {2 * cp} equal chunks "
                          "(load-balanced causal attention)")
    if cp > 1 and attention != "flash":
        raise ConfigError("cp", cp, "needs --attention flash (the ring runs on the fused attention kernel)")
    if ep > 1 and not config.is_moe:
        raise ConfigError("ep", ep, f"needs a mixture of experts; {config.name} has a dense FFN")
    if config.is_moe and config.num_experts % ep:
        raise ConfigError("ep", ep, f"must divide the routed experts ({config.num_experts})")
    if zero >= 2 and dp_overlap:
        raise ConfigError("dp_overlap", True, f"applies to --zero 0 and 1; ZeRO-{zero} overlaps its per-layer "
                          "collectives with compute already")


def layer_op_costs(model: str | TransformerConfig, *, device: str | Device = "h100", cluster: str | Cluster | None = None,
                   microbatch_size: int = 1, seq_len: int | None = None, tp: int = 1, sequence_parallel: bool = False,
                   precision: str | None = None, attention: Attention = "flash",
                   moe: bool | None = None, tp_overlap: bool = False) -> list[OpCost]:
    """One transformer layer's ops with their times, for ``pipesim model`` and the tests (``moe``:
    a mixture-of-experts layer; default whether the model has them)."""
    config = preset(model) if isinstance(model, str) else model
    spec = resolve_device(device)
    wiring = default_cluster(spec) if cluster is None else load_cluster(cluster) if isinstance(cluster, str) else cluster
    setting = Setting(device=spec, cluster=wiring, precision=precision or spec.default_precision,
                      microbatch_size=microbatch_size, seq_len=seq_len or config.seq_len, tp=tp,
                      sequence_parallel=sequence_parallel and tp > 1, attention=attention,
                      tp_overlap=tp_overlap and tp_overlap_applies(sequence_parallel, tp))
    return layer_ops(config, setting, moe=config.is_moe if moe is None else moe)


def calibrated_efficiency(measured: Profile, model: str | TransformerConfig, *, device: str | Device = "h100",
                          microbatch_size: int = 1, seq_len: int | None = None) -> float:
    """The device's sustained matrix share of peak that makes the model's compute time equal a measured profile's.

    ``measured`` must have the same layers as ``transformer_profile(model, ...)`` (embedding,
    blocks, head) at the same microbatch and sequence, run without tensor parallelism. The
    memory-bound ops keep their times, so the share is found by bisection on the sum of every
    layer's forward and backward but the (memory-bound) embedding.

    Raises:
        ConfigError: a microbatch size or layer count that differs, or a measured total of zero.
    """
    if measured.microbatch_size != microbatch_size:
        raise ConfigError("microbatch_size", microbatch_size, f"must equal the calibration profile's "
                          f"({measured.microbatch_size}): its times were measured at that size")
    spec = resolve_device(device)

    def predicted(share: float) -> float:
        profile = transformer_profile(model, device=spec, microbatch_size=microbatch_size, seq_len=seq_len,
                                      efficiency=share)
        return sum(layer.forward_s + layer.backward_s for layer in profile.layers[1:])

    ideal = transformer_profile(model, device=spec, microbatch_size=microbatch_size, seq_len=seq_len, efficiency=1.0)
    if measured.num_layers != ideal.num_layers:
        raise ConfigError("calibrate", measured.name, f"has {measured.num_layers} layers; the model's profile has "
                          f"{ideal.num_layers} (embedding, blocks, head)")
    target = sum(layer.forward_s + layer.backward_s for layer in measured.layers[1:])
    if target <= 0:
        raise ConfigError("calibrate", measured.name, "must have a positive total forward + backward time")
    if predicted(1.0) >= target:
        return 1.0
    low, high = 1e-4, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if predicted(middle) > target else (low, middle)
    return (low + high) / 2


def model_summary(config: TransformerConfig, profile: Profile, *, tp: int, recompute: str,
                  seq_len: int) -> dict[str, Any]:
    """The ``pipesim model --json`` object: whole-model sizes (TP = 1) and this rank's profile
    totals; the layer figures are a mixture-of-experts layer's where the model has them, and its
    ``active_parameters_per_token`` is added."""
    from pipesim.spec.transformer import (
        active_parameters_per_token,
        forward_flops_per_token,
        layer_parameters,
        parameters,
    )

    blocks = [layer for layer in profile.layers if layer.name.startswith("layer")][config.num_dense_layers:]
    experts = {"active_parameters_per_token": active_parameters_per_token(config)} if config.is_moe else {}
    return {
        "model": config.name,
        "parameters": parameters(config),
        **experts,
        "published_parameters": config.published_parameters,
        "layers": config.num_layers,
        "layer_parameters": layer_parameters(config, moe=config.is_moe),
        "forward_flops_per_token": forward_flops_per_token(config, seq_len),
        "seq_len": seq_len,
        "microbatch_size": profile.microbatch_size,
        "tp": tp,
        "recompute": recompute,
        "device": profile.device,
        "layer_forward_s": blocks[0].forward_s,
        "layer_backward_s": blocks[0].backward_s,
        "layer_backward_input_s": blocks[0].backward_input_s,
        "layer_backward_weight_s": blocks[0].backward_weight_s,
        "layer_update_s": blocks[0].update_s or 0.0,
        "layer_stash_bytes": blocks[0].stashed_bytes,
        "layer_recomputed_bytes": blocks[0].recomputed_bytes or 0.0,
        "input_bytes": profile.input_bytes or 0.0,
        "loss_bytes": profile.loss_bytes or 0.0,
        "layer_param_bytes": blocks[0].param_bytes,
        "rank_param_bytes": sum(layer.param_bytes for layer in profile.layers),
        "source": config.source,
    }
