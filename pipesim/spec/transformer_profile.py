"""A Profile of a transformer from its config and a device: the per-layer costs the engines run on.

Layers: ``embedding``, one per transformer layer, ``head`` (final norm, logits and loss), so a
pipeline's first and last stages carry their real extra weight and time.

- Times: FLOPs over the device's sustained rate (peak x efficiency). A layer's forward is its
  matmuls plus attention; its backward for inputs (I) repeats the matmuls and doubles the
  attention (no weights there), its backward for weights (W) repeats the matmuls. The embedding
  lookup is memory-bound: it reads and writes b s h 16-bit values at the device's memory
  bandwidth, forward and (as the weight gradient) backward.
- Tensor parallelism of degree t divides FLOPs by t and adds, per layer, two ring all-reduces of
  the b s h activation in the forward and two in I, ``2 (t-1)/t x bytes`` over NVLink (with
  sequence parallelism: all-gathers and reduce-scatters of the same total volume). Norm weights
  stay whole on every rank; everything else is divided by t.
- Stash: ``layer_activation_bytes`` (Korthikanti et al.). The head keeps its norm's and the
  logit layer's inputs (2 b s h each); the fp32 logits (4 b s V / t) for the loss are the
  profile's ``loss_bytes``, and the token ids (int64, 8 b s bytes, as torch feeds an embedding)
  its ``input_bytes``; the embedding keeps its dropout mask (b s h bytes) when the model has dropout.
- Recomputation is part of the profile: selective re-runs attention in I, full re-runs the whole
  forward in I, one layer at a time (Megatron's per-layer checkpoints); the stash is what
  remains, and what a layer's I re-creates and holds while it runs is its ``recomputed_bytes``
  (the stash without recomputation minus the stash with it).
- Sent between stages: b s h 16-bit values (divided by t with sequence parallelism).
"""

from __future__ import annotations

from typing import Any

from pipesim.errors import ConfigError
from pipesim.spec.devices import DeviceSpec, device_preset
from pipesim.spec.parallel import ring_allreduce_s
from pipesim.spec.profile import Profile
from pipesim.spec.transformer import (
    RECOMPUTE_MODES,
    Recompute,
    TransformerConfig,
    embedding_parameters,
    head_forward_flops,
    head_parameters,
    layer_activation_bytes,
    layer_forward_flops,
    layer_linear_parameters,
    preset,
)
from pipesim.spec.validation import build

BYTES_PER_VALUE = 2  # 16-bit weights and activations (the device's dtype)
TOKEN_ID_BYTES = 8  # a token id as torch.long, the dtype nn.Embedding takes
# Mixed-precision Adam: fp32 master weights, momentum and variance, 12 bytes per parameter, that
# is 6 x the 16-bit weight bytes (with 16-bit gradients, 16 bytes a parameter in all: ZeRO, Rajbhandari et al. 2020).
ADAM_STATE_MULTIPLIER = 6.0


def transformer_profile(
    model: str | TransformerConfig,
    *,
    device: str | DeviceSpec = "h100",
    microbatch_size: int = 1,
    seq_len: int | None = None,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: Recompute = "none",
    efficiency: float | None = None,
    include_embeddings: bool = True,
) -> Profile:
    """The per-layer profile of ``model`` (a preset name or a config) on one rank of ``device``.

    Args:
        model: a preset key (``gpt3-175b``, ``llama3-70b``, ...) or a TransformerConfig.
        device: a device preset key or a DeviceSpec; ``efficiency`` overrides its sustained share.
        microbatch_size, seq_len: b and s (s defaults to the model's).
        tp, sequence_parallel: tensor-parallel degree (inside a node) and Megatron's sequence parallelism.
        recompute: ``none``, ``selective`` (attention) or ``full``.
        include_embeddings: False leaves out the embedding and head layers (a bare stack).

    Raises:
        ConfigError: a bad count, an unknown preset, device or recompute mode, or ``tp`` not
            dividing the heads or exceeding a node.
    """
    config = preset(model) if isinstance(model, str) else model
    spec = device_preset(device) if isinstance(device, str) else device
    if efficiency is not None:
        spec = spec.with_efficiency(efficiency)
    s = seq_len if seq_len is not None else config.seq_len
    _check(config, spec, microbatch_size=microbatch_size, seq_len=s, tp=tp, recompute=recompute)
    b, h, t = microbatch_size, config.hidden_size, tp
    rate = spec.sustained_flops
    sent = b * s * h * BYTES_PER_VALUE / (t if sequence_parallel else 1)
    allreduce = ring_allreduce_s(b * s * h * BYTES_PER_VALUE, t, spec.intra_node_bandwidth_bytes_per_s)

    matmul, attention = layer_forward_flops(config, tokens=b * s, seq_len=s)
    forward = (matmul + attention) / t / rate + 2 * allreduce
    redo = {"none": 0.0, "selective": attention / t / rate, "full": forward}[recompute]
    stash, whole = (layer_activation_bytes(config, microbatch_size=b, seq_len=s, tp=t,
                                           sequence_parallel=sequence_parallel, recompute=mode)
                    for mode in (recompute, "none"))
    block = _layer("layer", forward=forward, backward_input=(matmul + 2 * attention) / t / rate + 2 * allreduce + redo,
                   backward_weight=matmul / t / rate, sent=sent, stash=stash,
                   params=(layer_linear_parameters(config) / t + 2 * config.norm_parameters) * BYTES_PER_VALUE)
    if whole != stash:
        block["recomputed_bytes"] = whole - stash
    layers = [dict(block, name=f"layer{index}") for index in range(config.num_layers)]
    if include_embeddings:
        lookup = 2 * b * s * h * BYTES_PER_VALUE / spec.memory_bandwidth_bytes_per_s
        embedding = _layer("embedding", forward=lookup + allreduce / 2, backward_input=0.0, backward_weight=lookup,
                           sent=sent, stash=float(b * s * h if config.has_dropout else 0),
                           params=embedding_parameters(config) / t * BYTES_PER_VALUE)
        logits = head_forward_flops(config, tokens=b * s) / t / rate
        head_weights = head_parameters(config) + (config.vocab_size * h if config.has_tied_embeddings else 0)
        head = _layer("head", forward=logits, backward_input=logits + allreduce / 2, backward_weight=logits, sent=0.0,
                      stash=4.0 * b * s * h, params=head_weights / t * BYTES_PER_VALUE)
        layers = [embedding, *layers, head]
    parallel = f", tp={t}" + (" with sequence parallelism" if sequence_parallel else "") if t > 1 else ""
    return build(Profile, {
        "name": config.name,
        "layers": layers,
        "input_bytes": TOKEN_ID_BYTES * b * s if include_embeddings else None,
        "loss_bytes": 4.0 * b * s * config.vocab_size / t if include_embeddings else None,
        "microbatch_size": b,
        "dtype": spec.dtype,
        "device": f"{spec.name} at {spec.efficiency:g} of {spec.peak_flops / 1e12:g} TFLOP/s peak",
        "source": f"pipesim.transformer_profile: {config.name}, s={s}, recompute={recompute}{parallel}; "
                  f"{config.source}; {spec.source}",
    })


def _layer(name: str, *, forward: float, backward_input: float, backward_weight: float, sent: float, stash: float,
           params: float) -> dict[str, Any]:
    """One profile layer; recomputation is already in its times and stash, so the engine's selective
    recomputation leaves it alone."""
    return {"name": name, "forward_s": forward, "backward_s": backward_input + backward_weight,
            "backward_input_s": backward_input, "backward_weight_s": backward_weight, "activation_bytes": sent,
            "stash_bytes": stash, "param_bytes": params, "selective_recompute": False}


def _check(config: TransformerConfig, spec: DeviceSpec, *, microbatch_size: int, seq_len: int, tp: int,
           recompute: str) -> None:
    for field, value in (("microbatch_size", microbatch_size), ("seq_len", seq_len), ("tp", tp)):
        if value < 1:
            raise ConfigError(field, value, "must be >= 1")
    if recompute not in RECOMPUTE_MODES:
        raise ConfigError("recompute", recompute, f"must be one of {', '.join(RECOMPUTE_MODES)}")
    if config.num_kv_heads % tp and tp % config.num_kv_heads:
        raise ConfigError("tp", tp, f"must divide the KV heads ({config.num_kv_heads}) or be a multiple of them")
    if config.num_heads % tp:
        raise ConfigError("tp", tp, f"must divide the heads ({config.num_heads})")
    if tp > spec.gpus_per_node:
        raise ConfigError("tp", tp, f"must be <= the GPUs in a {spec.name} node ({spec.gpus_per_node}): "
                          "tensor parallelism stays on NVLink")


def calibrated_efficiency(measured: Profile, model: str | TransformerConfig, *, device: str | DeviceSpec = "h100",
                          microbatch_size: int = 1, seq_len: int | None = None) -> float:
    """The sustained share of peak that makes the model's compute time equal a measured profile's.

    ``measured`` must have the same layers as ``transformer_profile(model, ...)`` (embedding,
    blocks, head) at the same microbatch and sequence, run without tensor parallelism: the
    efficiency is the predicted forward + backward time at full peak over the measured one, over
    every layer but the (memory-bound) embedding.

    Raises:
        ConfigError: a microbatch size or layer count that differs, or a measured total of zero.
    """
    if measured.microbatch_size != microbatch_size:
        raise ConfigError("microbatch_size", microbatch_size, f"must equal the calibration profile's "
                          f"({measured.microbatch_size}): its times were measured at that size")
    ideal = transformer_profile(model, device=device, microbatch_size=microbatch_size, seq_len=seq_len,
                                efficiency=1.0)
    if measured.num_layers != ideal.num_layers:
        raise ConfigError("calibrate", measured.name, f"has {measured.num_layers} layers; the model's profile has "
                          f"{ideal.num_layers} (embedding, blocks, head)")
    # The embedding lookup is bound by memory bandwidth, not FLOP/s: it stays out of the ratio.
    measured_s = sum(layer.forward_s + layer.backward_s for layer in measured.layers[1:])
    if measured_s <= 0:
        raise ConfigError("calibrate", measured.name, "must have a positive total forward + backward time")
    ideal_s = sum(layer.forward_s + layer.backward_s for layer in ideal.layers[1:])
    return min(1.0, ideal_s / measured_s)


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
        "layer_stash_bytes": blocks[0].stashed_bytes,
        "layer_recomputed_bytes": blocks[0].recomputed_bytes or 0.0,
        "input_bytes": profile.input_bytes or 0.0,
        "loss_bytes": profile.loss_bytes or 0.0,
        "layer_param_bytes": blocks[0].param_bytes,
        "rank_param_bytes": sum(layer.param_bytes for layer in profile.layers),
        "source": config.source,
    }
