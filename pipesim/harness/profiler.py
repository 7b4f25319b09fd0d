"""Profiling a model layer by layer, through the same stage code the runtime runs, into a Profile."""

from __future__ import annotations

import json

import torch

from pipesim.errors import ConfigError
from pipesim.harness.config import SOURCE_PREFIX, ModelSpec
from pipesim.harness.models import ModelBundle, build_model
from pipesim.harness.overheads import executor_costs, net_of, runtime_costs
from pipesim.harness.process import configure_process
from pipesim.harness.timing import time_layer
from pipesim.spec.profile import Profile
from pipesim.spec.validation import build

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
                  warmup: int = 5, repeats: int = 20, calibrate: bool = True) -> Profile:
    """Measure every layer of ``spec``'s model (the loss layer included) and return a Profile.

    Times are medians over ``repeats`` after ``warmup``, with ``threads`` torch threads as in
    the runtime, less the stage executor's fixed cost per op (see pipesim.harness.overheads);
    sizes are exact. With ``calibrate``, a two-rank run of null layers measures the runtime's
    cost per op, kept as the profile's per-op overheads. The model's spec is kept in the
    profile's ``source`` so that ``pipesim run`` can rebuild the same model.

    Raises:
        ConfigError: bad counts, an unknown device, or a model that cannot be built.
    """
    if warmup < 0 or repeats < 1:
        raise ConfigError("repeats", repeats, "must be >= 1 (and warmup >= 0)")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", device, "CUDA is not available here")
    if device not in ("cpu", "cuda"):
        raise ConfigError("device", device, "must be cpu or cuda")
    configure_process(threads)
    target_device = torch.device(device)
    bundle = build_model(spec, microbatch_size)
    for layer in bundle.layers:
        layer.to(target_device)
    stash = stash_attribution(bundle, microbatch_size, target_device)
    element = torch.tensor([], dtype=bundle.dtype).element_size()
    executor = executor_costs(target_device)
    layers = []
    for index, name in enumerate(bundle.names):
        measured = time_layer(bundle, index, microbatch_size, target_device, warmup=warmup, repeats=repeats)
        times = net_of(measured, executor)
        is_loss = index == bundle.num_layers - 1  # the loss is one number per microbatch
        output_elements = 1 if is_loss else microbatch_size * _numel(bundle.output_shapes[index])
        layers.append({
            "name": name,
            "forward_s": times.forward_s,
            "backward_s": times.backward_s,
            "update_s": times.update_s,
            "forward_std_s": measured.forward_std_s,
            "backward_std_s": measured.backward_std_s,
            "activation_bytes": float(output_elements * element),
            "stash_bytes": stash[index],
            "param_bytes": float(sum(p.numel() * p.element_size() for p in bundle.layers[index].parameters())),
        })
    overheads: dict[str, float] = {}
    if calibrate:
        largest = max(_numel(shape) for shape in bundle.output_shapes[:-1])
        costs = runtime_costs(largest, microbatch_size, executor, threads=threads, device=device)
        overheads = {"forward_overhead_s": costs.forward_s, "backward_overhead_s": costs.backward_s,
                     "update_overhead_s": costs.update_s}
    return build(Profile, {
        **overheads,
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
