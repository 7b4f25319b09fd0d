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
- Data parallelism of degree D: each layer's gradients are reduced over the DP group on the
  tier it spans (an all-reduce; with ZeRO-1 / the distributed optimizer a reduce-scatter of the
  gradients and an all-gather of the weights), after the minibatch's last backward or
  overlapped with it (``dp_overlap``: then the communication kernels take their tier's
  ``compute_share`` of the compute while they run). Gradients travel in fp32 under bf16
  (Megatron's rule) and in fp16 under fp16. The optimizer step (mixed-precision Adam,
  ``ADAM_BYTES_PER_PARAMETER`` bytes streamed per parameter, more under fp16, over D with ZeRO) is each layer's
  ``update_s``; a tied embedding's gradient is also all-reduced between the first and last stage.
- Stash: ``layer_activation_bytes``. The head keeps its norm's and the logit layer's inputs
  (2 b s h each); the fp32 logits (4 b s V / t) are ``loss_bytes``, the token ids (int64) the
  ``input_bytes``; the embedding keeps its dropout mask when the model has dropout.
- Sent between stages: b s h activations, a TP rank's 1/t share of them when t > 1 (sequence
  parallelism keeps them sharded; without it Megatron's scatter/gather sends 1/t and
  all-gathers on arrival, whose time ``pipeline_bandwidth_bytes_per_s`` folds into the link).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipesim.errors import ConfigError
from pipesim.spec.cluster import Cluster, load_cluster
from pipesim.spec.collectives import Group, allgather_s, allreduce_s, group_path, reduce_scatter_s, send_tier
from pipesim.spec.device import Device, load_device
from pipesim.spec.opcost import Attention, OpCost, Setting, check_attention, embedding_ops, head_ops, layer_ops, totals
from pipesim.spec.profile import Profile
from pipesim.spec.transformer import (
    RECOMPUTE_MODES,
    Recompute,
    TransformerConfig,
    embedding_parameters,
    head_parameters,
    layer_activation_bytes,
    layer_linear_parameters,
    preset,
)
from pipesim.spec.validation import build

BYTES_PER_VALUE = 2  # 16-bit weights and activations
TOKEN_ID_BYTES = 8  # a token id as torch.long, the dtype nn.Embedding takes
# Mixed-precision Adam: fp32 master weights, momentum and variance, 12 bytes per parameter, that
# is 6 x the 16-bit weight bytes (with 16-bit gradients, 16 bytes a parameter in all: ZeRO, Rajbhandari et al. 2020).
ADAM_STATE_MULTIPLIER = 6.0
# Bytes the optimizer step streams per parameter: the fp32 gradient read twice (its norm for
# clipping, then Adam), the fp32 master weight, momentum and variance each read and written,
# the 16-bit weight written back: 4 + 4 + 8 + 8 + 8 + 2. Under fp16 (loss scaling) the 16-bit
# gradients are first copied into fp32 (2 + 4) and unscaled with an overflow check (4 + 4).
ADAM_BYTES_PER_PARAMETER = 34.0
FP16_EXTRA_BYTES_PER_PARAMETER = 14.0
PLACEMENTS = ("tp-in-node", "pp-in-node")


@dataclass(frozen=True)
class Parallelism:
    """Degrees and placement: TP x PP x DP GPUs numbered TP fastest (tp-in-node, Megatron's order)
    or PP fastest (pp-in-node: a pipeline's stages share a node)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    placement: str = "tp-in-node"

    def __post_init__(self) -> None:
        for field in ("tp", "pp", "dp"):
            if getattr(self, field) < 1:
                raise ConfigError(field, getattr(self, field), "must be >= 1")
        if self.placement not in PLACEMENTS:
            raise ConfigError("placement", self.placement, f"must be one of {', '.join(PLACEMENTS)}")

    @property
    def strides(self) -> tuple[int, int, int]:
        """GPUs between neighbours of (TP, PP, DP)."""
        if self.placement == "tp-in-node":
            return 1, self.tp * self.dp, self.tp
        return self.pp, 1, self.pp * self.tp


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
) -> Profile:
    """The per-layer profile of ``model`` on one rank of ``device`` in ``cluster``.

    Args:
        model: a preset key (``gpt3-175b``, ``llama3-70b``, ...) or a TransformerConfig.
        device, cluster: a shipped name or a loaded file; the cluster defaults to the device's.
        microbatch_size, seq_len: b and s (s defaults to the model's).
        tp, sequence_parallel: tensor-parallel degree and Megatron's sequence parallelism.
        recompute: ``none``, ``selective`` (attention core) or ``full``.
        precision: matrix precision (bf16, fp16, fp8; default the device's 16-bit type).
        attention: ``flash`` (fused) or ``unfused`` (batched products, softmax, dropout).
        efficiency: replaces the device's sustained matrix share of peak (a what-if).
        include_embeddings: False leaves out the embedding and head layers (a bare stack).
        pp, dp, zero, dp_overlap, placement: the pipeline depth (for placement), data
            parallelism, ZeRO stage (0 or 1), overlap of the gradient reduction, and placement.

    Raises:
        ConfigError: a bad count, an unknown preset, device, cluster, precision or mode, or
            ``tp`` not dividing the heads.
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
    check_attention(attention)
    layout = Parallelism(tp=tp, pp=pp, dp=dp, placement=placement)
    tp_stride, pp_stride, dp_stride = layout.strides
    chosen = precision or spec.default_precision
    spec.peak(chosen)  # refuses a precision the card lacks before any work
    setting = Setting(device=spec, cluster=wiring, precision=chosen, microbatch_size=microbatch_size, seq_len=s,
                      tp=tp, sequence_parallel=sequence_parallel and tp > 1, attention=attention, tp_stride=tp_stride)
    b, h, t = microbatch_size, config.hidden_size, tp
    sent = b * s * h * BYTES_PER_VALUE / t

    ops = layer_ops(config, setting)
    forward, input_grad, weight_grad = totals(ops)
    core = [op for op in ops if op.name in ("scores", "softmax", "attention-dropout", "context", "attention")]
    redo = {"none": 0.0, "selective": sum(op.forward_s for op in core), "full": forward}[recompute]
    stash, whole = (layer_activation_bytes(config, microbatch_size=b, seq_len=s, tp=t,
                                           sequence_parallel=setting.sequence_parallel, recompute=mode,
                                           attention=attention) for mode in (recompute, "none"))
    block = _layer("layer", forward=forward, backward_input=input_grad + redo, backward_weight=weight_grad,
                   sent=sent, stash=stash,
                   params=(layer_linear_parameters(config) / t + config.num_layer_norms * config.norm_parameters)
                   * BYTES_PER_VALUE)
    if whole != stash:
        block["recomputed_bytes"] = whole - stash
    layers = [dict(block, name=f"layer{index}") for index in range(config.num_layers)]
    if include_embeddings:
        embed_forward, embed_input, embed_weight = totals(embedding_ops(config, setting))
        embedding = _layer("embedding", forward=embed_forward, backward_input=embed_input, backward_weight=embed_weight,
                           sent=sent, stash=float(b * s * h if config.has_dropout else 0),
                           params=embedding_parameters(config) / t * BYTES_PER_VALUE)
        head_forward, head_input, head_weight = totals(head_ops(config, setting))
        head_weights = head_parameters(config) + (config.vocab_size * h if config.has_tied_embeddings else 0)
        head = _layer("head", forward=head_forward, backward_input=head_input, backward_weight=head_weight, sent=0.0,
                      stash=4.0 * b * s * h, params=head_weights / t * BYTES_PER_VALUE)
        layers = [embedding, *layers, head]
    _add_update(layers, config, setting, layout, zero=zero, overlap=dp_overlap,
                strides=(dp_stride, pp_stride), has_embeddings=include_embeddings)
    parallel = f", tp={t}" + (" with sequence parallelism" if setting.sequence_parallel else "") if t > 1 else ""
    return build(Profile, {
        "name": config.name,
        "layers": layers,
        "input_bytes": TOKEN_ID_BYTES * b * s if include_embeddings else None,
        "loss_bytes": 4.0 * b * s * config.vocab_size / t if include_embeddings else None,
        "microbatch_size": b,
        "dtype": chosen,
        "device": f"{spec.name} ({chosen}, matrix {spec.matmul.max_efficiency:g} of {spec.peak(chosen) / 1e12:g} "
                  f"TFLOP/s peak) in {wiring.name}",
        "source": f"pipesim.transformer_profile: {config.name}, s={s}, recompute={recompute}, attention={attention}"
                  f"{parallel}; {config.source}",
    })


def pipeline_bandwidth_bytes_per_s(cluster: Cluster, parallelism: Parallelism,
                                   *, sequence_parallel: bool = False) -> float:
    """The rate a stage's sent bytes (its 1/t share when t > 1) reach the next stage: the pipeline
    tier's rate, and without sequence parallelism the TP all-gather on arrival folded in per byte
    sent: 1 / (1 / rate + (t - 1) / TP bus rate)."""
    tp_stride, pp_stride, _ = parallelism.strides
    rate = cluster.tiers[send_tier(cluster, pp_stride)].rate_bytes_per_s
    if parallelism.tp == 1 or sequence_parallel:
        return rate
    bus = group_path(cluster, Group(parallelism.tp, tp_stride)).bus_bytes_per_s
    return 1.0 / (1.0 / rate + (parallelism.tp - 1) / bus)


def pipeline_latency_s(cluster: Cluster, parallelism: Parallelism) -> float:
    """One pipeline message's fixed cost: its tier's latency."""
    return cluster.tiers[send_tier(cluster, parallelism.strides[1])].latency_s


def _add_update(layers: list[dict[str, Any]], config: TransformerConfig, setting: Setting, layout: Parallelism, *,
                zero: int, overlap: bool, strides: tuple[int, int], has_embeddings: bool) -> None:
    """Each layer's optimizer step and gradient reduction (module docstring), in place."""
    dp_stride, pp_stride = strides
    device, cluster = setting.device, setting.cluster
    grad_bytes = 4.0 if setting.precision == "bf16" else 2.0
    step_bytes = ADAM_BYTES_PER_PARAMETER + (FP16_EXTRA_BYTES_PER_PARAMETER if setting.precision == "fp16" else 0.0)
    group = Group(layout.dp, dp_stride)
    share = cluster.tiers[group_path(cluster, group).tier_index].compute_share if layout.dp > 1 else 0.0
    for layer in layers:
        parameters = layer["param_bytes"] / BYTES_PER_VALUE
        shard = layout.dp if zero >= 1 else 1
        step = device.launch_s + device.stream_s(parameters * step_bytes / shard, "optimizer")
        if layout.dp > 1:
            if zero >= 1:
                reduce = reduce_scatter_s(cluster, group, parameters * grad_bytes) \
                    + allgather_s(cluster, group, parameters * BYTES_PER_VALUE)
            else:
                reduce = allreduce_s(cluster, group, parameters * grad_bytes)
            if overlap:
                layer["gradient_allreduce_s"] = reduce
                step += share * reduce
            else:
                step += reduce
        layer["update_s"] = step
    if has_embeddings and config.has_tied_embeddings and layout.pp > 1:
        # The first stage's embedding and the last stage's output layer share one matrix: its
        # gradient is all-reduced between them (two GPUs, the pipeline's length apart).
        table = config.vocab_size * config.hidden_size / layout.tp * grad_bytes
        sync = allreduce_s(cluster, Group(2, pp_stride * (layout.pp - 1)), table)
        layers[0]["update_s"] += sync
        layers[-1]["update_s"] += sync


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
    if zero not in (0, 1):
        raise ConfigError("zero", zero, "must be 0 (none) or 1 (optimizer state sharded over --dp)")


def layer_op_costs(model: str | TransformerConfig, *, device: str | Device = "h100", cluster: str | Cluster | None = None,
                   microbatch_size: int = 1, seq_len: int | None = None, tp: int = 1, sequence_parallel: bool = False,
                   precision: str | None = None, attention: Attention = "flash") -> list[OpCost]:
    """One transformer layer's ops with their times, for ``pipesim model`` and the tests."""
    config = preset(model) if isinstance(model, str) else model
    spec = resolve_device(device)
    wiring = default_cluster(spec) if cluster is None else load_cluster(cluster) if isinstance(cluster, str) else cluster
    setting = Setting(device=spec, cluster=wiring, precision=precision or spec.default_precision,
                      microbatch_size=microbatch_size, seq_len=seq_len or config.seq_len, tp=tp,
                      sequence_parallel=sequence_parallel and tp > 1, attention=attention)
    return layer_ops(config, setting)


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
    """The ``pipesim model --json`` object: whole-model sizes (TP = 1) and this rank's profile totals."""
    from pipesim.spec.transformer import forward_flops_per_token, layer_parameters, parameters

    blocks = [layer for layer in profile.layers if layer.name.startswith("layer")]
    return {
        "model": config.name,
        "parameters": parameters(config),
        "published_parameters": config.published_parameters,
        "layers": config.num_layers,
        "layer_parameters": layer_parameters(config),
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
