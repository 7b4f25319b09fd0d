"""Profiling a model layer by layer, through the same stage code the runtime runs, into a Profile."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from pipesim.errors import ConfigError
from pipesim.harness.config import SOURCE_PREFIX, ModelSpec, TrainingOptions
from pipesim.harness.models import ModelBundle, build_model
from pipesim.harness.stage import StageExecutor
from pipesim.schedule.ir import WeightPolicy
from pipesim.spec.profile import Profile
from pipesim.spec.validation import build

@dataclass(frozen=True)
class LayerTimes:
    """Median and spread of one layer's op times, seconds."""

    forward_s: float
    backward_s: float
    update_s: float
    forward_std_s: float
    backward_std_s: float


def _timer(device: torch.device) -> Callable[[Callable[[], Any]], float]:
    """Seconds one call takes: perf_counter on CPU, CUDA events on GPU."""
    if device.type == "cuda":
        def cuda_time(call: Callable[[], Any]) -> float:
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            call()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end)) / 1e3
        return cuda_time

    def cpu_time(call: Callable[[], Any]) -> float:
        start = time.perf_counter()
        call()
        return time.perf_counter() - start
    return cpu_time


def time_layer(bundle: ModelBundle, index: int, microbatch_size: int, device: torch.device, *,
               warmup: int, repeats: int) -> LayerTimes:
    """Time F, B and U of layer ``index`` run as a one-layer stage, exactly as the runtime runs a stage.

    Each repeat runs F, then B with a random output gradient, then U; the first ``warmup``
    repeats are dropped; the rest give medians and standard deviations.
    """
    executor = StageExecutor(bundle, index, index + 1, WeightPolicy.FLUSH, TrainingOptions(learning_rate=1e-9))
    shape = bundle.input_shape if index == 0 else bundle.output_shapes[index - 1]
    generator = torch.Generator().manual_seed(index)
    inputs = torch.randn((microbatch_size, *shape), generator=generator).to(device)
    target = torch.randn((microbatch_size, *bundle.target_shape), generator=generator).to(device)
    target_or_none = target if executor.has_loss else None
    out_shape = (microbatch_size, *bundle.output_shapes[index])
    grad = None if executor.has_loss else torch.randn(out_shape, generator=generator).to(device)
    measure = _timer(device)
    forward, backward, update = [], [], []
    for repeat in range(warmup + repeats):
        x = inputs.clone()
        forward.append(measure(lambda r=repeat, x=x: executor.forward(r, 0, x, target_or_none)))  # type: ignore[misc]
        backward.append(measure(lambda r=repeat: executor.backward(r, grad)))  # type: ignore[misc]
        update.append(measure(lambda r=repeat: executor.update(r)))  # type: ignore[misc]
    forward, backward, update = forward[warmup:], backward[warmup:], update[warmup:]
    return LayerTimes(
        forward_s=statistics.median(forward), backward_s=statistics.median(backward),
        update_s=statistics.median(update),
        forward_std_s=statistics.pstdev(forward), backward_std_s=statistics.pstdev(backward),
    )


def stash_attribution(bundle: ModelBundle, microbatch_size: int, device: torch.device) -> list[float]:
    """Bytes each layer keeps for the backward, each storage counted once, by the first layer that saves it.

    This is what a stage keeps: the sum over its layers, as long as no tensor at a cut is kept
    on both sides of it (the built-in models are built so that none is).
    """
    owner: dict[int, int] = {}
    sizes = [0.0] * bundle.num_layers
    current = [0]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if isinstance(tensor, torch.nn.Parameter) or tensor.untyped_storage().data_ptr() in parameters:
            return tensor
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in owner:
            owner[storage.data_ptr()] = current[0]
            sizes[current[0]] += storage.nbytes()
        return tensor

    parameters = {p.untyped_storage().data_ptr() for layer in bundle.layers for p in layer.parameters()}
    x, target = bundle.microbatch(0, microbatch_size)
    x = x.to(device)
    bundle.layers[-1].target = target.to(device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        for index, layer in enumerate(bundle.layers):
            current[0] = index
            x = layer(x)
    return sizes


def profile_model(spec: ModelSpec, microbatch_size: int, *, device: str = "cpu", threads: int = 1,
                  warmup: int = 5, repeats: int = 20) -> Profile:
    """Measure every layer of ``spec``'s model (the loss layer included) and return a Profile.

    Times are medians over ``repeats`` after ``warmup``, with ``threads`` torch threads as in
    the runtime; sizes are exact. The model's spec is kept in the profile's ``source`` so that
    ``pipesim run`` can rebuild the same model.

    Raises:
        ConfigError: bad counts, an unknown device, or a model that cannot be built.
    """
    if warmup < 0 or repeats < 1:
        raise ConfigError("repeats", repeats, "must be >= 1 (and warmup >= 0)")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", device, "CUDA is not available here")
    if device not in ("cpu", "cuda"):
        raise ConfigError("device", device, "must be cpu or cuda")
    torch.set_num_threads(threads)
    target_device = torch.device(device)
    bundle = build_model(spec, microbatch_size)
    for layer in bundle.layers:
        layer.to(target_device)
    stash = stash_attribution(bundle, microbatch_size, target_device)
    element = torch.tensor([], dtype=bundle.dtype).element_size()
    layers = []
    for index, name in enumerate(bundle.names):
        times = time_layer(bundle, index, microbatch_size, target_device, warmup=warmup, repeats=repeats)
        is_loss = index == bundle.num_layers - 1  # the loss is one number per microbatch
        output_elements = 1 if is_loss else microbatch_size * _numel(bundle.output_shapes[index])
        layers.append({
            "name": name,
            "forward_s": times.forward_s,
            "backward_s": times.backward_s,
            "update_s": times.update_s,
            "forward_std_s": times.forward_std_s,
            "backward_std_s": times.backward_std_s,
            "activation_bytes": float(output_elements * element),
            "stash_bytes": stash[index],
            "param_bytes": float(sum(p.numel() * p.element_size() for p in bundle.layers[index].parameters())),
        })
    return build(Profile, {
        "name": spec.name,
        "layers": layers,
        "microbatch_size": microbatch_size,
        "dtype": str(bundle.dtype).removeprefix("torch."),
        "device": f"{device} ({threads} torch thread{'s' if threads > 1 else ''})",
        "source": SOURCE_PREFIX + json.dumps(spec.to_dict(), sort_keys=True),
    })


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count
