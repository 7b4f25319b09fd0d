"""Timing one layer as a one-layer stage, exactly as the runtime runs a stage (F, then B, then U)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from pipesim.harness.config import TrainingOptions
from pipesim.harness.models import ModelBundle
from pipesim.harness.stage import StageExecutor
from pipesim.schedule.ir import WeightPolicy


@dataclass(frozen=True)
class LayerTimes:
    """Median and spread of one layer's op times, seconds."""

    forward_s: float
    backward_s: float
    update_s: float
    forward_std_s: float
    backward_std_s: float


def timer(device: torch.device) -> Callable[[Callable[[], Any]], float]:
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
    measure = timer(device)
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
