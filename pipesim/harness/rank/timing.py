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
    """One layer's op times (mean or median) and their spread, seconds, the share of those ops'
    wall time the process had a CPU for (below 1 when the OS ran others in the middle of them),
    and the two steps of its split backward: I (input gradients) and W (weight gradients)."""

    forward_s: float
    backward_s: float
    update_s: float
    forward_std_s: float
    backward_std_s: float
    cpu_share: float = 1.0
    backward_input_s: float = 0.0
    backward_weight_s: float = 0.0


def timer(device: torch.device, clock: str = "wall") -> tuple[Callable[[Callable[[], Any]], Any],
                                                              Callable[[Any], float]]:
    """How a call is timed: ``(measure, seconds)``; ``measure(call)`` runs it and returns a reading,
    ``seconds(reading)`` its duration.

    On CPU a reading is the seconds, by ``perf_counter`` (``clock="wall"``) or the thread's CPU
    time (``clock="cpu"``: what the op costs, without time lost to other processes). On GPU it is
    a pair of CUDA events, read once the device has run them: the host issues the next op while
    the device runs this one, as in a run, so that no op is timed from a device left idle by a
    synchronize (which would add a kernel launch's latency to every op).
    """
    if device.type == "cuda":
        def record(call: Callable[[], Any]) -> Any:
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            call()
            end.record()
            return start, end

        def elapsed(reading: Any) -> float:
            start, end = reading
            end.synchronize()
            return float(start.elapsed_time(end)) / 1e3
        return record, elapsed

    read = time.thread_time if clock == "cpu" else time.perf_counter

    def host_time(call: Callable[[], Any]) -> float:
        start = read()
        call()
        return read() - start
    return host_time, float


def time_layers(bundle: ModelBundle, microbatch_size: int, device: torch.device, *, warmup: int, repeats: int,
                statistic: str = "mean", indices: list[int] | None = None, clock: str = "wall") -> list[LayerTimes]:
    """Time F, B and U of each layer run as a one-layer stage, exactly as the runtime runs a stage,
    and the I and W of its split backward.

    A repeat runs every layer's F in order, then every B (with a random output gradient) in
    reverse, then every U, as a training step touches them: between two uses of a layer the
    others pass through the caches, as in a pipeline stage, and all layers see the same
    conditions (a machine whose load changes over time biases no layer). Then, on the same
    executors, every F again (untimed, keeping the module outputs a split backward needs), every
    I in reverse and every W in reverse, as a split-backward schedule runs them. The first
    ``warmup`` repeats are dropped; the rest are summarized by ``statistic``: the mean keeps the
    time the OS gave to other processes in the middle of an op, which a real run pays too; the
    median drops it.
    """
    chosen = list(range(bundle.num_layers)) if indices is None else indices
    measure, seconds = timer(device, clock)
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
    # Per layer: F, B, U, I, W samples.
    samples: list[tuple[list[Any], ...]] = [([], [], [], [], []) for _ in chosen]
    cpu_s = wall_s = 0.0
    with without_gc():
        for repeat in range(warmup + repeats):
            if repeat == warmup:
                cpu_s, wall_s = -time.thread_time(), -time.perf_counter()
            for (stage, inputs, loss_target, _), times in zip(setups, samples, strict=True):
                x = inputs.clone()
                times[0].append(measure(lambda: stage.forward(repeat, 0, x, loss_target)))  # noqa: B023 - called at once
            for (stage, _, _, output_grad), times in reversed(list(zip(setups, samples, strict=True))):
                times[1].append(measure(lambda: stage.backward(repeat, output_grad)))  # noqa: B023
            for (stage, _, _, _), times in zip(setups, samples, strict=True):
                times[2].append(measure(lambda: stage.update(repeat)))  # noqa: B023
            for stage, inputs, loss_target, _ in setups:
                stage.split_backward = True
                stage.forward(repeat, 0, inputs.clone(), loss_target)
                stage.split_backward = False
            for (stage, _, _, output_grad), times in reversed(list(zip(setups, samples, strict=True))):
                times[3].append(measure(lambda: stage.backward_input(repeat, output_grad)))  # noqa: B023
            for (stage, _, _, _), times in reversed(list(zip(setups, samples, strict=True))):
                times[4].append(measure(lambda: stage.backward_weight(repeat)))  # noqa: B023
    cpu_s += time.thread_time()
    wall_s += time.perf_counter()
    share = min(1.0, cpu_s / wall_s) if wall_s > 0 and device.type == "cpu" else 1.0
    results = []
    for times in samples:
        forward, backward, update, backward_input, backward_weight = ([seconds(r) for r in kind[warmup:]]
                                                                      for kind in times)
        results.append(LayerTimes(
            forward_s=summarize(forward, statistic), backward_s=summarize(backward, statistic),
            update_s=summarize(update, statistic),
            forward_std_s=statistics.pstdev(forward), backward_std_s=statistics.pstdev(backward), cpu_share=share,
            backward_input_s=summarize(backward_input, statistic),
            backward_weight_s=summarize(backward_weight, statistic),
        ))
    return results
