"""The experts' GEMMs of a mixture-of-experts layer on one GPU, against the op cost model's prices.

pipesim prices a rank's E / EP local experts as one batched product of (T k EP / E) tokens each
(``pipesim.spec.moe_ops``, ``Device.matmul_s(batch=...)``): forward, input gradient and weight
gradient of FC1 and FC2. ``--measure`` (on the GPU, torch needed) times exactly those shapes as
``torch.bmm`` in bf16 with CUDA events; ``--predict FILE`` (anywhere, no torch) prices them on a
device file and prints predicted against measured, with ``--write`` into benchmarks/RESULTS.md.

    python benchmarks/bench_expert_gemms.py --measure --out experts.json    # on the GPU, about a minute
    python benchmarks/bench_expert_gemms.py --predict experts.json --device h200 [--write]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path
from typing import Any

TOKENS = 4096  # a rank's tokens in a microbatch (b = 1, s = 4096)
# model: (h, expert FFN size f, routed experts E, top-k, the EP degrees to try); FC1 is gated (2f wide)
MODELS: dict[str, tuple[int, int, int, int, tuple[int, ...]]] = {
    "mixtral-8x7b": (4096, 14336, 8, 2, (1, 8)),
    "qwen1.5-moe-a2.7b": (2048, 1408, 60, 4, (1, 4, 60)),
    "deepseek-v3": (7168, 2048, 256, 8, (8, 64, 256)),
}


def shapes() -> list[dict[str, Any]]:
    """Every product pipesim prices for the experts: (batch, m, n, k) of FC1 and FC2, forward, dX and dW."""
    rows = []
    for model, (h, f, experts, top_k, degrees) in MODELS.items():
        for ep in degrees:
            batch, tokens = experts // ep, TOKENS * top_k * ep // experts
            for gemm, (n, k) in (("fc1", (2 * f, h)), ("fc2", (h, f))):
                for pass_, (m1, n1, k1) in (("forward", (tokens, n, k)), ("input-grad", (tokens, k, n)),
                                            ("weight-grad", (k, n, tokens))):
                    rows.append({"model": model, "ep": ep, "gemm": gemm, "pass": pass_, "batch": batch, "m": m1,
                                 "n": n1, "k": k1})
    return rows


def measure(seconds_per_shape: float) -> list[dict[str, Any]]:
    import torch

    device = torch.device("cuda")
    rows = []
    for row in shapes():
        a = torch.randn(row["batch"], row["m"], row["k"], device=device, dtype=torch.bfloat16)
        b = torch.randn(row["batch"], row["k"], row["n"], device=device, dtype=torch.bfloat16)
        for _ in range(3):
            torch.bmm(a, b)
        torch.cuda.synchronize()
        times: list[float] = []
        while sum(times) < seconds_per_shape or len(times) < 5:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.bmm(a, b)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        rows.append({**row, "measured_s": statistics.median(times)})
        print(f"{row['model']} ep={row['ep']} {row['gemm']} {row['pass']}: {rows[-1]['measured_s'] * 1e3:.3f} ms",
              flush=True)
    return rows


def predict(measured: dict[str, Any], device_name: str) -> str:
    from pipesim.spec.device import load_device

    device = load_device(device_name)
    lines = [f"## Expert GEMMs (`benchmarks/bench_expert_gemms.py`, the parallelism issue)", "",
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; measured {measured['when']} on "
             f"{measured['gpu']} (torch.bmm, bf16, median of CUDA-event timings); predicted with `{device_name}`.", "",
             "| model | EP | GEMM | pass | batch x (m, n, k) | measured ms | predicted ms | error |",
             "|---|---|---|---|---|---|---|---|"]
    errors = []
    for row in measured["rows"]:
        predicted = device.matmul_s(row["m"], row["n"], row["k"], precision="bf16", batch=row["batch"])
        errors.append(predicted / row["measured_s"] - 1)
        lines.append(f"| {row['model']} | {row['ep']} | {row['gemm']} | {row['pass']} | {row['batch']} x ({row['m']}, "
                     f"{row['n']}, {row['k']}) | {row['measured_s'] * 1e3:.3f} | {predicted * 1e3:.3f} | "
                     f"{errors[-1]:+.1%} |")
    absolute = [abs(error) for error in errors]
    lines += ["", f"{len(errors)} products: median |error| {statistics.median(absolute):.1%}, worst "
              f"{max(errors, key=abs):+.1%}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", action="store_true", help="time the products on this machine's GPU")
    parser.add_argument("--out", type=Path, default=Path("experts.json"), help="where --measure writes")
    parser.add_argument("--seconds", type=float, default=0.3, help="timing per product")
    parser.add_argument("--predict", type=Path, help="a file --measure wrote")
    parser.add_argument("--device", default="h200", help="the device file to price them on")
    parser.add_argument("--write", action="store_true", help="write the table into benchmarks/RESULTS.md")
    args = parser.parse_args(argv)
    if args.measure:
        import torch

        rows = measure(args.seconds)
        args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                        "when": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
                                        "rows": rows}, indent=1) + "\n")
        print(f"wrote {args.out}")
        return 0
    if args.predict is None:
        parser.error("give --measure (on the GPU) or --predict FILE")
    text = predict(json.loads(args.predict.read_text()), args.device)
    print(text)
    if args.write:
        from results_file import write_section

        write_section("expert-gemms", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
