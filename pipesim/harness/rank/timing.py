"""Timing one layer as a one-layer stage, exactly as the runtime runs a stage (F, then B, then U)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from pipesim.harness.config import TrainingOptions, summarize
from pipesim.harness.rank.models import ModelBundle
from pipesim.harness.rank.process import without_gc
from pipesim.harness.rank.stage import StageExecutor
from pipesim.schedule.ir import WeightPolicy


@dataclass(frozen=True)
class LayerTimes:
    """One layer's op times (mean or median) and their spread, seconds, and the share of those ops'
    wall time the process had a CPU for (below 1 when the OS ran others in the middle of them)."""

    forward_s: float
    backward_s: float
    update_s: float
    forward_std_s: float
    backward_std_s: float
    cpu_share: float = 1.0


def timer(device: torch.device, clock: str = "wall") -> Callable[[Callable[[], Any]], float]:
    """Seconds one call takes: CUDA events on GPU; on CPU ``perf_counter`` (``clock="wall"``) or the
    thread's CPU time (``clock="cpu"``: what the op costs, without time lost to other processes)."""
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

    read = time.thread_time if clock == "cpu" else time.perf_counter

    def host_time(call: Callable[[], Any]) -> float:
        start = read()
        call()
        return read() - start
    return host_time


def time_layers(bundle: ModelBundle, microbatch_size: int, device: torch.device, *, warmup: int, repeats: int,
                statistic: str = "mean", indices: list[int] | None = None, clock: str = "wall") -> list[LayerTimes]:
    """Time F, B and U of each layer run as a one-layer stage, exactly as the runtime runs a stage.

    A repeat runs every layer's F in order, then every B (with a random output gradient) in
    reverse, then every U, as a training step touches them: between two uses of a layer the
    others pass through the caches, as in a pipeline stage, and all layers see the same
    conditions (a machine whose load changes over time biases no layer). The first ``warmup``
    repeats are dropped; the rest are summarized by ``statistic``: the mean keeps the time the
    OS gave to other processes in the middle of an op, which a real run pays too; the median
    drops it.
    """
    chosen = list(range(bundle.num_layers)) if indices is None else indices
    measure = timer(device, clock)
    setups: list[tuple[StageExecutor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]] = []
    for index in chosen:
        executor = StageExecutor(bundle, index, index + 1, WeightPolicy.FLUSH, TrainingOptions(learning_rate=1e-9))
        shape = bundle.input_shape if index == 0 else bundle.output_shapes[index - 1]
        generator = torch.Generator().manual_seed(index)
        inputs = torch.randn((microbatch_size, *shape), generator=generator).to(device)
        target = torch.randn((microbatch_size, *bundle.target_shape), generator=generator).to(device)
        out_shape = (microbatch_size, *bundle.output_shapes[index])
        grad = None if executor.has_loss else torch.randn(out_shape, generator=generator).to(device)
        setups.append((executor, inputs, target if executor.has_loss else None, grad))
    samples: list[tuple[list[float], list[float], list[float]]] = [([], [], []) for _ in chosen]
    cpu_s = wall_s = 0.0
    with without_gc():
        for repeat in range(warmup + repeats):
            if repeat == warmup:
                cpu_s, wall_s = -time.thread_time(), -time.perf_counter()
            for (stage, inputs, loss_target, _), (forward, _, _) in zip(setups, samples, strict=True):
                x = inputs.clone()
                forward.append(measure(lambda: stage.forward(repeat, 0, x, loss_target)))  # noqa: B023 - called at once
            for (stage, _, _, output_grad), (_, backward, _) in reversed(list(zip(setups, samples, strict=True))):
                backward.append(measure(lambda: stage.backward(repeat, output_grad)))  # noqa: B023
            for (stage, _, _, _), (_, _, update) in zip(setups, samples, strict=True):
                update.append(measure(lambda: stage.update(repeat)))  # noqa: B023
    cpu_s += time.thread_time()
    wall_s += time.perf_counter()
    share = min(1.0, cpu_s / wall_s) if wall_s > 0 and device.type == "cpu" else 1.0
    results = []
    for forward, backward, update in samples:
        forward, backward, update = forward[warmup:], backward[warmup:], update[warmup:]
        results.append(LayerTimes(
            forward_s=summarize(forward, statistic), backward_s=summarize(backward, statistic),
            update_s=summarize(update, statistic),
            forward_std_s=statistics.pstdev(forward), backward_std_s=statistics.pstdev(backward), cpu_share=share,
        ))
    return results
