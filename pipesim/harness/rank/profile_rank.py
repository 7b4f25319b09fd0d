"""One profiling process: its model's layer times and sizes, measured in a rank's process set-up.

Run as ``main(REQUEST_JSON)`` in processes forked like the run's ranks (see launch.spawn), so
that layers are timed with the runtime's code, threads and allocator, while the machine is as
busy as during a run. Writes ``times{RANK}.json`` to PIPESIM_RUN_DIR.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from pipesim.errors import PipesimError
from pipesim.harness.config import ModelSpec
from pipesim.harness.rank.models import ModelBundle, build_model
from pipesim.harness.rank.process import configure_process
from pipesim.harness.rank.timing import LayerTimes, time_layers
from pipesim.spec.files import write_text_atomic


def stash_attribution(bundle: ModelBundle, microbatch_size: int, device: torch.device) -> list[float]:
    """Bytes each layer keeps for the backward, each storage counted once, by the first layer that saves it.

    This is what a stage keeps: the sum over its layers, as long as no tensor at a cut is kept
    on both sides of it (the built-in models are built so that none is).
    """
    owner: dict[int, int] = {}
    sizes = [0.0] * bundle.num_layers
    current = [0]
    parameters = {p.untyped_storage().data_ptr() for layer in bundle.layers for p in layer.parameters()}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() in parameters:
            return tensor
        if storage.data_ptr() not in owner:
            owner[storage.data_ptr()] = current[0]
            sizes[current[0]] += storage.nbytes()
        return tensor

    x, target = bundle.microbatch(0, microbatch_size)
    x = x.to(device)
    bundle.layers[-1].target = target.to(device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        for index, layer in enumerate(bundle.layers):
            current[0] = index
            x = layer(x)
    return sizes


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def _rows(times: list[LayerTimes]) -> list[list[float]]:
    return [[t.forward_s, t.backward_s, t.update_s, t.forward_std_s, t.backward_std_s, t.cpu_share,
             t.backward_input_s, t.backward_weight_s] for t in times]


def measure(spec: ModelSpec, microbatch_size: int, *, warmup: int, repeats: int, statistic: str, device: str,
            threads: int, calibrate: bool, clock: str = "wall") -> dict[str, Any]:
    """Everything the profiler needs from one process, as plain data.

    Returns:
        ``names, dtype, activation_bytes, stash_bytes, param_bytes`` per layer; ``layers``: per
        layer ``[forward, backward, update, forward_std, backward_std, cpu_share, backward_input,
        backward_weight]`` (seconds; the last two: a split backward's I and W);
        ``executor``: the stage executor's fixed cost per F, B, U, I and W, timed on a layer that
        does nothing to one number; with ``calibrate``, ``null_elements`` and ``null_layers``: the
        null model the calibration run uses (messages as large as the largest activation) and
        its layers' times, so that the run's spans can be taken apart.
    """
    configure_process(threads)
    target = torch.device(device)
    bundle = build_model(spec, microbatch_size)
    for layer in bundle.layers:
        layer.to(target)
    element = torch.tensor([], dtype=bundle.dtype).element_size()
    last = bundle.num_layers - 1  # the loss: one number per microbatch
    result: dict[str, Any] = {
        "names": bundle.names,
        "dtype": str(bundle.dtype).removeprefix("torch."),
        "activation_bytes": [float(element * (1 if index == last else microbatch_size * _numel(shape)))
                             for index, shape in enumerate(bundle.output_shapes)],
        "stash_bytes": stash_attribution(bundle, microbatch_size, target),
        "param_bytes": [float(sum(p.numel() * p.element_size() for p in layer.parameters()))
                        for layer in bundle.layers],
    }
    null = build_model(ModelSpec("null", depth=2, width=1), 1)
    (executor,) = time_layers(null, 1, target, warmup=20, repeats=200, statistic=statistic, indices=[1],
                               clock=clock)
    result["executor"] = [executor.forward_s, executor.backward_s, executor.update_s, executor.backward_input_s,
                          executor.backward_weight_s]
    result["layers"] = _rows(time_layers(bundle, microbatch_size, target, warmup=warmup, repeats=repeats,
                                         statistic=statistic, clock=clock))
    if calibrate:
        elements = max(_numel(shape) for shape in bundle.output_shapes[:-1])
        stand_in = build_model(ModelSpec("null", depth=2, width=elements), microbatch_size)
        result["null_elements"] = elements
        result["null_layers"] = _rows(time_layers(stand_in, microbatch_size, target, warmup=5, repeats=50,
                                                  statistic=statistic, clock=clock))
    return result


def main(argv: list[str]) -> int:
    """Measure as the request (JSON) says; write ``times{RANK}.json``. A bad model is one line, status 2."""
    request = json.loads(argv[0])
    try:
        result = measure(ModelSpec.from_dict(request.pop("spec")), **request)
    except PipesimError as error:
        print(f"{error}", file=sys.stderr)
        return 2
    folder = Path(os.environ["PIPESIM_RUN_DIR"])
    write_text_atomic(folder / f"times{os.environ.get('RANK', '0')}.json", json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
