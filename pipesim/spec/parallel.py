"""Tensor and data parallelism around a pipeline, as transforms of a Profile, and batch arithmetic.

Megatron's placement: a pipeline stage's T tensor-parallel ranks share a node's NVLink; pipeline
and data-parallel peers sit on other nodes and talk over the NIC. Both degrees leave one
pipeline to simulate:

- tensor parallelism (``tensor_parallel_profile``) divides every layer's times, weights and
  stash by T and adds two ring all-reduces of the layer's output to its forward and two to its
  backward (the attention and MLP blocks' all-reduces of Megatron, Shoeybi et al. 2019);
- data parallelism (``data_parallel_profile``) adds to each layer's optimizer step the ring
  all-reduce of its gradients over the D replicas, once per minibatch, or, overlapped, starts
  each layer's all-reduce as soon as the last backward has produced its gradient
  (``overlapped_allreduce_tail_s``: what outlasts the backward is all the update waits for);
  ZeRO divides the optimizer state by D (``zero_optimizer_multiplier``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pipesim.errors import ConfigError
from pipesim.spec.profile import Profile
from pipesim.spec.validation import build


def ring_allreduce_s(num_bytes: float, degree: int, bandwidth_bytes_per_s: float) -> float:
    """Seconds of a ring all-reduce of ``num_bytes`` over ``degree`` ranks: ``2 (d-1)/d x bytes / bandwidth``; 0 for one."""
    if degree <= 1:
        return 0.0
    return 2 * (degree - 1) / degree * num_bytes / bandwidth_bytes_per_s


def _check_degree(field: str, degree: int) -> None:
    if degree < 1:
        raise ConfigError(field, degree, "must be >= 1")


def tensor_parallel_profile(profile: Profile, tp: int, bandwidth_bytes_per_s: float) -> Profile:
    """``profile`` on each of ``tp`` tensor-parallel ranks (the same profile when ``tp`` is 1).

    Raises:
        ConfigError: ``tp < 1``.
    """
    _check_degree("tp", tp)
    if tp == 1:
        return profile
    layers = []
    for layer in profile.layers:
        data = layer.model_dump()
        allreduces = 2 * ring_allreduce_s(layer.activation_bytes, tp, bandwidth_bytes_per_s)
        for key in ("forward_s", "backward_s", "backward_input_s", "backward_weight_s", "forward_std_s",
                    "backward_std_s", "param_bytes", "stash_bytes", "weight_stash_bytes", "recomputed_bytes",
                    "update_s"):
            if data[key] is not None:
                data[key] = data[key] / tp
        data["forward_s"] += allreduces
        data["backward_s"] += allreduces
        if data["backward_input_s"] is not None:
            data["backward_input_s"] += allreduces
        layers.append(data)
    # The loss's logits are sharded over the vocabulary (Megatron's vocab-parallel cross-entropy);
    # the model's input (token ids) is whole on every rank.
    loss = None if profile.loss_bytes is None else profile.loss_bytes / tp
    return build(Profile, {**profile.model_dump(by_alias=True), "layers": layers, "loss_bytes": loss,
                           "source": f"{profile.source}; tensor parallel over {tp}"})


def data_parallel_profile(profile: Profile, dp: int, bandwidth_bytes_per_s: float, *, overlap: bool = False) -> Profile:
    """``profile`` with each layer's gradient all-reduce over ``dp`` replicas (the same profile when ``dp`` is 1).

    Without ``overlap`` the all-reduce joins the layer's update (after the minibatch's last
    backward); with it, it becomes the layer's ``gradient_allreduce_s``, overlapped with the
    stage's last backward (``overlapped_allreduce_tail_s``).

    Raises:
        ConfigError: ``dp < 1``.
    """
    _check_degree("dp", dp)
    if dp == 1:
        return profile
    layers = []
    for layer in profile.layers:
        data = layer.model_dump()
        allreduce = ring_allreduce_s(layer.param_bytes, dp, bandwidth_bytes_per_s)
        if overlap:
            data["gradient_allreduce_s"] = (layer.gradient_allreduce_s or 0.0) + allreduce
        else:
            data["update_s"] = (layer.update_s or 0.0) + allreduce
        layers.append(data)
    return build(Profile, {**profile.model_dump(by_alias=True), "layers": layers,
                           "source": f"{profile.source}; data parallel over {dp}"
                                     + (", all-reduce overlapped with the last backward" if overlap else "")})


def overlapped_allreduce_tail_s(backward_s: Sequence[float], allreduce_s: Sequence[float]) -> float:
    """Seconds the gradient all-reduces of one stage outlast its last backward.

    The backward runs the stage's layers last to first (``backward_s`` and ``allreduce_s`` in
    layer order); a layer's all-reduce starts when its gradient is ready and the previous one has
    finished (one NIC, layer by layer, as DDP's buckets go), so the update waits only for the tail.
    """
    ready = finished = 0.0
    for backward, allreduce in zip(reversed(backward_s), reversed(allreduce_s), strict=True):
        ready += backward
        finished = max(finished, ready) + allreduce
    return max(0.0, finished - ready)


def overlapped_gather_head_s(forward_s: Sequence[float], gather_s: Sequence[float]) -> float:
    """Seconds the weight all-gathers after the optimizer step hold back the stage's next forward.

    The gathers run one after another in layer order from the step's end (one NIC, bucket by
    bucket, as Megatron-Core's ``--overlap-param-gather`` issues them), and a layer's forward starts
    once its own gather is done and the layer before it has run (``forward_s`` and ``gather_s`` in
    layer order): the forward's delay over running unhindered. Read backwards in time this is the
    tail's problem (a layer's gather starts after its forward, last layer first, as a reduction
    starts after its backward), with the same longest path: ``overlapped_allreduce_tail_s``.
    """
    return overlapped_allreduce_tail_s(forward_s, gather_s)


def zero_optimizer_multiplier(multiplier: float, dp: int, zero_stage: int) -> float:
    """Optimizer state per weight byte on one replica: sharded over ``dp`` by ZeRO stage 1 and up
    (Rajbhandari et al. 2020; a profile built with ZeRO-2 or 3 states its layers' state itself).

    Raises:
        ConfigError: a stage other than 0 to 3.
    """
    if zero_stage not in (0, 1, 2, 3):
        raise ConfigError("zero", zero_stage, "must be 0 (none), 1, 2 or 3 (optimizer state sharded over --dp)")
    return multiplier / dp if zero_stage >= 1 else multiplier


def microbatches_per_pipeline(global_batch: int, microbatch_size: int, dp: int) -> int:
    """M = global batch / (microbatch size x D).

    Raises:
        ConfigError: a count below 1 or a global batch that the product does not divide.
    """
    for field, value in (("global_batch", global_batch), ("microbatch_size", microbatch_size), ("dp", dp)):
        if value < 1:
            raise ConfigError(field, value, "must be >= 1")
    per_step = microbatch_size * dp
    if global_batch % per_step:
        raise ConfigError("global_batch", global_batch, f"must be a multiple of microbatch size x dp "
                          f"({microbatch_size} x {dp} = {per_step})")
    return global_batch // per_step


def divisors(number: int) -> list[int]:
    """The divisors of ``number`` (>= 1) in increasing order, found up to its square root: the
    degrees a count can be split into (GPUs into TP x PP x DP, a batch into microbatches)."""
    small = [value for value in range(1, math.isqrt(number) + 1) if number % value == 0]
    return small + [number // value for value in reversed(small) if value * value != number]
