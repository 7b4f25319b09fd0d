"""The GPU path on one card: layer profiles timed by CUDA events, and whether a whole stage's step
is the sum of its layers' ops. Well under a minute on an H100: per model one profiling process that
starts CUDA, and 23 whole-model steps (about 0.27 s each for the transformer).

pipesim prices a stage as the sum of its layers' profiled F, B and U plus the runtime's fixed
cost per op. On a GPU that sum can miss what timing one layer at a time cannot see (launch gaps
that a longer stream of kernels hides, caches shared across layers). For each model this times
the layers as ``pipesim profile --device cuda`` does (one process, CUDA events), then runs the
whole model as one stage for ``m`` microbatches (every F, every B, one U), timed by CUDA events,
and reports the measured step against the profile's sum. It also reports a split backward's
I + W against the fused B. ``--device cpu`` runs the same comparison on this host's CPU. It prints
the machine, a legend of the columns, then one table row per model as it is measured.

    python benchmarks/bench_gpu.py [--device cuda] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipesim.harness.config import ModelSpec, TrainingOptions  # noqa: E402
from pipesim.harness.profiler import Timing, _measure  # noqa: E402
from pipesim.harness.rank.models import build_model  # noqa: E402
from pipesim.harness.rank.stage import StageExecutor  # noqa: E402
from pipesim.schedule.ir import WeightPolicy  # noqa: E402

MODELS = {  # name: (spec, microbatch size)
    "mlp 8x4096": (ModelSpec("mlp", depth=8, width=4096), 64),
    "transformer 4x1024, 512 tokens": (ModelSpec("transformer", depth=4, width=1024, seq_len=512, heads=16), 8),
    "mlp 8x512 (launch bound)": (ModelSpec("mlp", depth=8, width=512), 8),
}


# What each column of the table means (printed above it).
LEGEND = (
    "Columns: profile: sum F, ms / sum B, ms: the model's layers timed one at a time as `pipesim profile` does, "
    "net of the stage executor's fixed cost per op; I + W / B: a split backward's two ops over the fused B; "
    "executor F + B, ms: that fixed cost, paid once per op of a stage; predicted step, ms: m x (sum F + sum B + "
    "executor F + B) + sum U + executor U, the whole model as one stage; measured step, ms: that stage run for "
    "real (m forwards, m backwards in reverse, one update), median (min-max) of the timed repeats; error: "
    "predicted / measured - 1.",
)


def profile_sum(spec: ModelSpec, microbatch_size: int, device: str, m: int, repeats: int,
                statistic: str = "mean") -> dict[str, float]:
    """The one-stage step the profile predicts: m * (sum F + sum B + the executor's F and B) + sum U + its U.

    Layer times as measured (each includes the executor's fixed cost once); the profile keeps
    them net of it and the runtime pays it once per op of a stage.
    """
    timing = Timing(warmup=5, repeats=repeats, statistic=statistic, processes=1, device=device)
    part = _measure(spec, microbatch_size, timing, calibrate=False)[0]
    fixed = part["executor"]
    rows = part["layers"]
    net = [[row[k] - fixed[k] for k in range(3)] + [row[6] - fixed[3], row[7] - fixed[4]] for row in rows]
    forward, backward, update, backward_input, backward_weight = (sum(r[k] for r in net) for k in range(5))
    return {"step_s": m * (forward + backward + fixed[0] + fixed[1]) + update + fixed[2],
            "forward_s": forward, "backward_s": backward, "split_s": backward_input + backward_weight,
            "fixed_f_s": fixed[0], "fixed_b_s": fixed[1]}


def measured_step(spec: ModelSpec, microbatch_size: int, device: str, m: int, repeats: int) -> list[float]:
    """The whole model as one stage: m forwards, m backwards and an update, timed end to end."""
    target = torch.device(device)
    bundle = build_model(spec, microbatch_size)
    for layer in bundle.layers:
        layer.to(target)
    executor = StageExecutor(bundle, 0, bundle.num_layers, WeightPolicy.FLUSH, TrainingOptions(learning_rate=1e-9),
                             num_microbatches=m)
    generator = torch.Generator().manual_seed(0)
    inputs = [torch.randn((microbatch_size, *bundle.input_shape), generator=generator).to(target) for _ in range(m)]
    targets = [torch.randn((microbatch_size, *bundle.target_shape), generator=generator).to(target) for _ in range(m)]
    update = [0]

    def step() -> None:
        for j in range(m):
            executor.forward(j, 0, inputs[j].clone(), targets[j])
        for j in reversed(range(m)):
            executor.backward(j, None)
        executor.update(update[0])
        update[0] += 1

    def measure(call: Callable[[], None]) -> float:
        if target.type == "cpu":
            start = time.perf_counter()
            call()
            return time.perf_counter() - start
        events = [torch.cuda.Event(enable_timing=True) for _ in range(2)]  # type: ignore[no-untyped-call]
        events[0].record()
        call()
        events[1].record()
        events[1].synchronize()
        return float(events[0].elapsed_time(events[1])) / 1e3

    times = [measure(step) for _ in range(3 + repeats)]
    return times[3:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--statistic", choices=["mean", "median"], default="mean", help="of the layer timings")
    parser.add_argument("--out", type=Path, help="also write the markdown table here")
    parser.add_argument("--label", default="", help="names the pipesim tree measured, in the table's header")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_gpu: torch sees no CUDA GPU here; use --device cpu", file=sys.stderr)
        return 2
    started = time.perf_counter()
    card = torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or "cpu"
    lines = [f"{args.label + ': ' if args.label else ''}{datetime.date.today()}, {card}, torch {torch.__version__}, "
             f"m={args.microbatches}, "
             f"{args.repeats} timed repeats (layers: {args.statistic}; whole step: median and spread)", "",
             *LEGEND, "",
             "| model, microbatch | profile: sum F, ms | sum B, ms | I + W / B | executor F + B, ms "
             "| predicted step, ms | measured step, ms (min-max) | error |",
             "|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for name, (spec, size) in MODELS.items():
        predicted = profile_sum(spec, size, args.device, args.microbatches, args.repeats, args.statistic)
        runs = measured_step(spec, size, args.device, args.microbatches, args.repeats)
        median = statistics.median(runs)
        error = predicted["step_s"] / median - 1
        lines.append(f"| {name}, {size} | {predicted['forward_s'] * 1e3:.3f} | {predicted['backward_s'] * 1e3:.3f} "
                     f"| {predicted['split_s'] / predicted['backward_s']:.2f} "
                     f"| {(predicted['fixed_f_s'] + predicted['fixed_b_s']) * 1e3:.3f} "
                     f"| {predicted['step_s'] * 1e3:.2f} | {median * 1e3:.2f} ({min(runs) * 1e3:.2f}-"
                     f"{max(runs) * 1e3:.2f}) | {error:+.1%} |")
        print(lines[-1], flush=True)
    lines += ["", f"Took {time.perf_counter() - started:.0f} s."]
    print("\n".join(lines[-2:]), flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
