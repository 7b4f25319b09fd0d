"""Data parallelism's part of a layer: its gradient reduction, its optimizer step, and what ZeRO shards.

Per layer on one rank, with D = DP x CP ranks holding the same dense weights (``layout``) and
D / EP holding the same experts, Psi its parameters:

- ZeRO 0: gradients all-reduced after the minibatch's last backward (or overlapped with it:
  ``dp_overlap``), each rank holding 2 Psi of weights, 2 Psi of gradients and K Psi = 12 Psi of
  Adam state (fp32 master weights, momentum, variance): the ZeRO paper's 2 + 2 + 12 bytes per
  parameter (Rajbhandari et al., SC'20).
- ZeRO 1 (Megatron's distributed optimizer): the optimizer state and its step split over D,
  the gradients reduce-scattered and the updated weights all-gathered: 2 + 2 + 12 / D. With
  ``dp_overlap`` the reduce-scatter runs beside the last backward and the all-gather, which can
  only follow the optimizer step, beside the next step's first forward (Megatron-Core's
  ``--overlap-grad-reduce`` and ``--overlap-param-gather``).
- ZeRO 2: the gradients split too, so each microbatch's backward reduce-scatters each layer's
  gradients as they are produced (DeepSpeed's ZeRO-2 keeps no whole gradient to accumulate
  into), and the step's all-gather of the weights joins the update: 2 + (2 + 12) / D.
- ZeRO 3 / FSDP: the weights split too: each layer's weights are all-gathered before its
  forward and again before its backward (prefetched one layer ahead, so a layer's gather runs
  under the compute before it), its gradients reduce-scattered after its backward; nothing is
  left for the update but the sharded step: (2 + 2 + 12) / D, plus the whole weights of the two
  largest layers of a stage held at once (the one computing, the one prefetched).

A per-layer collective that runs beside compute takes its tier's ``compute_share`` of the SMs:
the layer then takes max(compute + share x comm, comm). Gradients travel in fp32 under bf16
(Megatron's rule) and in fp16 under fp16; gathered weights in 16 bits. The reduce bucket's own
memory is left out, as the ZeRO paper leaves it. Routed experts (``experts``: their parameters
on this rank) reduce over the expert data-parallel group and shard over D / EP.
"""

from __future__ import annotations

from typing import Any

from pipesim.spec.cluster import Cluster
from pipesim.spec.collectives import Group, allgather_s, allreduce_s, group_path, reduce_scatter_s
from pipesim.spec.layout import Parallelism
from pipesim.spec.opcost import Setting, overlapped_s
from pipesim.spec.transformer import TransformerConfig

BYTES_PER_VALUE = 2  # 16-bit weights and activations
# Mixed-precision Adam: fp32 master weights, momentum and variance, 12 bytes per parameter, that
# is 6 x the 16-bit weight bytes (with 16-bit gradients, 16 bytes a parameter in all: ZeRO, Rajbhandari et al. 2020).
ADAM_STATE_MULTIPLIER = 6.0
# Bytes the optimizer step streams per parameter: the fp32 gradient read twice (its norm for
# clipping, then Adam), the fp32 master weight, momentum and variance each read and written,
# the 16-bit weight written back: 4 + 4 + 8 + 8 + 8 + 2. Under fp16 (loss scaling) the 16-bit
# gradients are first copied into fp32 (2 + 4) and unscaled with an overflow check (4 + 4).
ADAM_BYTES_PER_PARAMETER = 34.0
FP16_EXTRA_BYTES_PER_PARAMETER = 14.0
ZERO_STAGES = (0, 1, 2, 3)


def holds_state_per_layer(config: TransformerConfig, layout: Parallelism, zero: int) -> bool:
    """Whether each layer states its gradient and optimizer bytes (``Layer.gradient_bytes``,
    ``optimizer_bytes``): ZeRO 2 and 3, and ZeRO 1 with experts sharded over another group than
    the dense weights; otherwise the plan's optimizer multiplier (``zero_optimizer_multiplier``) says it."""
    return zero >= 2 or (zero == 1 and config.is_moe and layout.ep > 1)


def add_update(layers: list[dict[str, Any]], experts: list[float], config: TransformerConfig, setting: Setting,
               layout: Parallelism, *, zero: int, overlap: bool, has_embeddings: bool,
               layer_state: bool = False, communication: list[float] | None = None) -> None:
    """Each layer's optimizer step and gradient reduction, and ZeRO-2/3's per-layer collectives
    and sharded memory (module docstring), in place; ``experts[i]``: layer i's routed-expert
    parameters on this rank (0 for none); ``layer_state``: state every layer's gradient and
    optimizer bytes even where the plan's multiplier could (``holds_state_per_layer``);
    ``communication``, when given, receives each layer's seconds of its ``update_s`` that are
    data-parallel (and tied-embedding) communication rather than the optimizer's own step."""
    device, cluster = setting.device, setting.cluster
    grad_bytes = 4.0 if setting.precision == "bf16" else 2.0
    step_bytes = ADAM_BYTES_PER_PARAMETER + (FP16_EXTRA_BYTES_PER_PARAMETER if setting.precision == "fp16" else 0.0)
    group, expert_group = layout.data_group, layout.expert_data_group
    share = cluster.tiers[group_path(cluster, group).tier_index].compute_share if group.size > 1 else 0.0
    dense_shard, expert_shard = (group.size, expert_group.size) if zero >= 1 else (1, 1)
    per_layer = layer_state or holds_state_per_layer(config, layout, zero)
    for layer, expert in zip(layers, experts, strict=True):
        parameters = layer["param_bytes"] / BYTES_PER_VALUE
        split = expert > 0 and layout.ep > 1  # the experts reduce and shard over their own group
        dense = parameters - expert if split else parameters
        mine = dense / dense_shard + (expert / expert_shard if split else 0.0)  # what this rank steps and keeps
        if split:
            step = device.launch_s + device.stream_s(mine * step_bytes, "optimizer")
        else:
            step = device.launch_s + device.stream_s(parameters * step_bytes / dense_shard, "optimizer")
        parts = [(group, dense), (expert_group, expert if split else 0.0)]
        optimizer = step
        if zero >= 2:
            _shard(layer, parts, zero=zero, grad_bytes=grad_bytes, share=share, cluster=cluster)
            if zero == 2:
                step += _gather_s(cluster, parts)
        elif group.size > 1 or (split and expert_group.size > 1):
            reduce = sum(_reduce_s(cluster, members, count, zero=zero, grad_bytes=grad_bytes)
                         for members, count in parts if count)
            if overlap and zero == 1:  # the scatter beside the backward, the gather beside the next forward
                layer["gradient_allreduce_s"] = _scatter_s(cluster, parts, grad_bytes)
                layer["param_gather_s"] = _gather_s(cluster, parts)
                step += share * reduce
            elif overlap:
                layer["gradient_allreduce_s"] = reduce
                step += share * reduce
            else:
                step += reduce
        if communication is not None:
            communication.append(step - optimizer)
        if per_layer:
            layer["gradient_bytes"] = (mine if zero >= 2 else parameters) * BYTES_PER_VALUE
            layer["optimizer_bytes"] = ADAM_STATE_MULTIPLIER * mine * BYTES_PER_VALUE
        if zero == 3:
            layer["gathered_bytes"], layer["param_bytes"] = layer["param_bytes"], mine * BYTES_PER_VALUE
        layer["update_s"] = step
    if has_embeddings and config.has_tied_embeddings and layout.pp > 1:
        # The first stage's embedding and the last stage's output layer share one matrix: its
        # gradient is all-reduced between them (two GPUs, the pipeline's length apart).
        table = config.vocab_size * config.hidden_size / layout.tp * grad_bytes
        sync = allreduce_s(cluster, Group(2, layout.strides[1] * (layout.pp - 1)), table)
        layers[0]["update_s"] += sync
        layers[-1]["update_s"] += sync
        if communication is not None:
            communication[0] += sync
            communication[-1] += sync


def _reduce_s(cluster: Cluster, group: Group, parameters: float, *, zero: int, grad_bytes: float) -> float:
    """The gradient reduction of ``parameters`` over ``group`` once per step: an all-reduce, or
    with ZeRO-1 a reduce-scatter of the gradients and an all-gather of the updated weights."""
    if zero >= 1:
        return reduce_scatter_s(cluster, group, parameters * grad_bytes) \
            + allgather_s(cluster, group, parameters * BYTES_PER_VALUE)
    return allreduce_s(cluster, group, parameters * grad_bytes)


def _scatter_s(cluster: Cluster, parts: list[tuple[Group, float]], grad_bytes: float) -> float:
    """The reduce-scatter of each part's gradients over its group."""
    return sum(reduce_scatter_s(cluster, members, count * grad_bytes) for members, count in parts)


def _gather_s(cluster: Cluster, parts: list[tuple[Group, float]]) -> float:
    """The all-gather of each part's 16-bit weights over its group."""
    return sum(allgather_s(cluster, members, count * BYTES_PER_VALUE) for members, count in parts)


def _shard(layer: dict[str, Any], parts: list[tuple[Group, float]], *, zero: int, grad_bytes: float, share: float,
           cluster: Cluster) -> None:
    """ZeRO-2/3's collectives of one microbatch in the layer's own times: the gradients'
    reduce-scatter beside the weight gradient (W), and under ZeRO-3 the weights' all-gather beside
    the forward and again beside the input gradient (I)."""
    scatter = _scatter_s(cluster, parts, grad_bytes)
    layer["backward_weight_s"] = overlapped_s(layer["backward_weight_s"], scatter, share)
    if zero == 3:
        gather = _gather_s(cluster, parts)
        layer["forward_s"] = overlapped_s(layer["forward_s"], gather, share)
        layer["backward_input_s"] = overlapped_s(layer["backward_input_s"], gather, share)
    layer["backward_s"] = layer["backward_input_s"] + layer["backward_weight_s"]
