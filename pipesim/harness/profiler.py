"""Profiling a model layer by layer, through the same stage code the runtime runs, into a Profile."""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from pipesim.errors import ConfigError
from pipesim.harness.config import SOURCE_PREFIX, ModelSpec
from pipesim.harness.models import ModelBundle, build_model
from pipesim.harness.overheads import OpCosts, executor_costs, net_of, runtime_costs
from pipesim.harness.process import configure_process
from pipesim.harness.timing import STATISTICS, LayerTimes, time_layers
from pipesim.spec.files import write_text_atomic
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


@dataclass(frozen=True)
class Timing:
    """How layers are timed: repeats, the statistic, and how many processes time them at once."""

    warmup: int = 5
    repeats: int = 20
    statistic: str = "mean"
    processes: int = 2
    threads: int = 1
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.repeats < 1:
            raise ConfigError("repeats", self.repeats, "must be >= 1 (and warmup >= 0)")
        if self.statistic not in STATISTICS:
            raise ConfigError("statistic", self.statistic, f"must be one of {', '.join(STATISTICS)}")
        if self.processes < 1:
            raise ConfigError("processes", self.processes, "must be >= 1")
        if self.device not in ("cpu", "cuda"):
            raise ConfigError("device", self.device, "must be cpu or cuda")


def measure_here(spec: ModelSpec, microbatch_size: int, timing: Timing) -> tuple[list[LayerTimes], OpCosts]:
    """Every layer's times and the executor's fixed costs, timed in this process."""
    configure_process(timing.threads)
    device = torch.device(timing.device)
    bundle = build_model(spec, microbatch_size)
    for layer in bundle.layers:
        layer.to(device)
    executor = executor_costs(device, statistic=timing.statistic)
    times = time_layers(bundle, microbatch_size, device, warmup=timing.warmup, repeats=timing.repeats,
                        statistic=timing.statistic)
    return times, executor


def measure_concurrently(spec: ModelSpec, microbatch_size: int, timing: Timing) -> tuple[list[LayerTimes], OpCosts]:
    """``measure_here`` in ``timing.processes`` processes at once (as many as the run's ranks, so that
    the layers are timed while the machine is as busy as during a run), averaged over them."""
    from pipesim.harness.launch import spawn, wait_all

    request = json.dumps({"spec": spec.to_dict(), "microbatch_size": microbatch_size, "timing": asdict(timing)})
    with tempfile.TemporaryDirectory(prefix="pipesim-profile-") as name:
        folder = Path(name)
        processes = spawn("pipesim.harness.profiler", [request], timing.processes, folder, timing.threads)
        wait_all(processes, folder, "profiling", timeout_s=3600)
        parts = [json.loads((folder / f"times{rank}.json").read_text(encoding="utf-8"))
                 for rank in range(timing.processes)]
    layers = [LayerTimes(*(statistics.fmean(part["layers"][index][k] for part in parts) for k in range(6)))
              for index in range(len(parts[0]["layers"]))]
    executor = OpCosts(*(statistics.fmean(part["executor"][k] for part in parts) for k in range(3)))
    return layers, executor


def main(argv: list[str]) -> int:
    """A profiling process (spawned by ``measure_concurrently``): time, then write ``times{RANK}.json``."""
    request = json.loads(argv[0])
    times, executor = measure_here(ModelSpec.from_dict(request["spec"]), int(request["microbatch_size"]),
                                   Timing(**request["timing"]))
    result = {"layers": [[t.forward_s, t.backward_s, t.update_s, t.forward_std_s, t.backward_std_s, t.cpu_share]
                         for t in times],
              "executor": [executor.forward_s, executor.backward_s, executor.update_s]}
    write_text_atomic(Path(os.environ["PIPESIM_RUN_DIR"]) / f"times{os.environ.get('RANK', '0')}.json",
                      json.dumps(result) + "\n")
    return 0


@dataclass(frozen=True)
class Measurement:
    """A profile and how much of the machine its timings had.

    Attributes:
        profile: the Profile.
        cpu_share: the smallest share of their wall time the timing processes had a CPU for,
            over the layer timings and the calibration run (1 on an idle machine).
    """

    profile: Profile
    cpu_share: float


def profile_model(spec: ModelSpec, microbatch_size: int, *, timing: Timing | None = None,
                  calibrate: bool = True) -> Profile:
    """``measure_profile(...).profile``: the Profile alone."""
    return measure_profile(spec, microbatch_size, timing=timing, calibrate=calibrate).profile


def measure_profile(spec: ModelSpec, microbatch_size: int, *, timing: Timing | None = None,
                    calibrate: bool = True) -> Measurement:
    """Measure every layer of ``spec``'s model (the loss layer included) and return a Profile.

    Each layer runs as a one-layer stage, with the runtime's code, torch threads and allocator
    settings; its times are the ``timing.statistic`` over repeats after warm-up, in
    ``timing.processes`` processes timing at once, less the stage executor's fixed cost per op
    (see pipesim.harness.overheads). Sizes are exact. With ``calibrate``, a two-rank run of null
    layers measures the runtime's cost per op, kept as the profile's per-op overheads. The
    model's spec is kept in the profile's ``source`` so that ``pipesim run`` can rebuild it.

    Raises:
        ConfigError: bad counts, an unknown device, or a model that cannot be built.
    """
    timing = timing or Timing()
    if timing.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", timing.device, "CUDA is not available here")
    configure_process(timing.threads)
    device = torch.device(timing.device)
    bundle = build_model(spec, microbatch_size)
    for layer in bundle.layers:
        layer.to(device)
    stash = stash_attribution(bundle, microbatch_size, device)
    element = torch.tensor([], dtype=bundle.dtype).element_size()
    if timing.processes > 1:
        measured, executor = measure_concurrently(spec, microbatch_size, timing)
    else:
        measured, executor = measure_here(spec, microbatch_size, timing)
    layers = []
    for index, name in enumerate(bundle.names):
        times = net_of(measured[index], executor)
        is_loss = index == bundle.num_layers - 1  # the loss is one number per microbatch
        output_elements = 1 if is_loss else microbatch_size * _numel(bundle.output_shapes[index])
        layers.append({
            "name": name,
            "forward_s": times.forward_s,
            "backward_s": times.backward_s,
            "update_s": times.update_s,
            "forward_std_s": measured[index].forward_std_s,
            "backward_std_s": measured[index].backward_std_s,
            "activation_bytes": float(output_elements * element),
            "stash_bytes": stash[index],
            "param_bytes": float(sum(p.numel() * p.element_size() for p in bundle.layers[index].parameters())),
        })
    overheads: dict[str, float] = {}
    share = min(times.cpu_share for times in measured)
    if calibrate:
        largest = max(_numel(shape) for shape in bundle.output_shapes[:-1])
        costs, calibration_share = runtime_costs(largest, microbatch_size, executor, timing.statistic,
                                                 threads=timing.threads, device=timing.device)
        share = min(share, calibration_share)
        overheads = {"forward_overhead_s": costs.forward_s, "backward_overhead_s": costs.backward_s,
                     "update_overhead_s": costs.update_s}
    threads = timing.threads
    profile = build(Profile, {
        **overheads,
        "name": spec.name,
        "layers": layers,
        "microbatch_size": microbatch_size,
        "dtype": str(bundle.dtype).removeprefix("torch."),
        "device": f"{timing.device} ({threads} torch thread{'s' if threads > 1 else ''}, {timing.statistic} of "
                  f"{timing.repeats} in {timing.processes} process{'es' if timing.processes > 1 else ''})",
        "source": SOURCE_PREFIX + json.dumps(spec.to_dict(), sort_keys=True),
    })
    return Measurement(profile=profile, cpu_share=share)


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
