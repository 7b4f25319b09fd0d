"""A whole training step of small transformers on one GPU, against the op cost model's prediction.

``--measure`` (on the GPU, torch needed) builds each model of ``MODELS`` in bf16 (a GPT with
LayerNorm, GELU and biases; a Llama-style one with RMSNorm, SwiGLU and grouped KV heads; a
Megatron-2021-style GPT whose attention is unfused, with dropout; the whole 1.7B GPT of the
Megatron-Core hold-out), times forward + backward and
the optimizer step with CUDA events, and sums the kernels of one step by kind with
torch.profiler. ``--predict FILE`` (anywhere, no torch) prices the same steps with
``pipesim.spec.opcost`` on a device file and prints predicted against measured, per model and per
kind of kernel, into benchmarks/RESULTS.md with ``--write``.

    python benchmarks/bench_device_step.py --measure --out step.json [--seconds 20] [--models 1.7b]  # GPU
    python benchmarks/bench_device_step.py --predict step.json[,more.json] --device h200 [--write]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

# name: (config fields as pipesim's TransformerConfig takes them, microbatch b, sequence s, attention)
MODELS: dict[str, tuple[dict[str, Any], int, int, str]] = {
    "gpt 4x2048 flash": ({"num_layers": 4, "hidden_size": 2048, "ffn_hidden_size": 8192, "num_heads": 16,
                          "num_kv_heads": 16, "vocab_size": 50304, "seq_len": 2048, "has_bias": True,
                          "norm": "layernorm", "has_dropout": False, "is_gated_ffn": False}, 4, 2048, "flash"),
    "llama 4x4096 gqa flash": ({"num_layers": 4, "hidden_size": 4096, "ffn_hidden_size": 14336, "num_heads": 32,
                                "num_kv_heads": 8, "vocab_size": 128256, "seq_len": 4096, "has_bias": False,
                                "norm": "rmsnorm", "has_dropout": False, "is_gated_ffn": True}, 2, 4096, "flash"),
    "gpt 4x2304 unfused dropout": ({"num_layers": 4, "hidden_size": 2304, "ffn_hidden_size": 9216, "num_heads": 24,
                                    "num_kv_heads": 24, "vocab_size": 51200, "seq_len": 2048, "has_bias": True,
                                    "norm": "layernorm", "has_dropout": True, "is_gated_ffn": False},
                                   8, 2048, "unfused"),
    # the hold-out's smallest Megatron-Core row (benchmarks/data/mcore_r08_h100_weak_scaling.json), whole
    "gpt 24x2048 1.7b flash": ({"num_layers": 24, "hidden_size": 2048, "ffn_hidden_size": 8192, "num_heads": 16,
                                "num_kv_heads": 16, "vocab_size": 131072, "seq_len": 4096, "has_bias": True,
                                "norm": "layernorm", "has_dropout": False, "is_gated_ffn": False}, 2, 4096, "flash"),
}


def _build(config: dict[str, Any], attention: str) -> Any:
    import torch
    import torch.nn.functional as functional
    from torch import nn

    h, heads, kv_heads = config["hidden_size"], config["num_heads"], config["num_kv_heads"]
    d = h // heads
    bias, dropout = config["has_bias"], 0.1 if config["has_dropout"] else 0.0

    def norm() -> nn.Module:
        return nn.LayerNorm(h) if config["norm"] == "layernorm" else nn.RMSNorm(h)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = norm(), norm()
            self.qkv = nn.Linear(h, h + 2 * kv_heads * d, bias=bias)
            self.proj = nn.Linear(h, h, bias=bias)
            inner = config["ffn_hidden_size"]
            self.fc1 = nn.Linear(h, (2 if config["is_gated_ffn"] else 1) * inner, bias=bias)
            self.fc2 = nn.Linear(inner, h, bias=bias)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).split([h, kv_heads * d, kv_heads * d], dim=-1)
            q = q.view(b, s, heads, d).transpose(1, 2)
            k = k.view(b, s, kv_heads, d).transpose(1, 2)
            v = v.view(b, s, kv_heads, d).transpose(1, 2)
            if attention == "flash":
                out = functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv_heads != heads)
            else:
                scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
                mask = torch.ones(s, s, device=x.device, dtype=torch.bool).triu(1)
                probs = functional.dropout(scores.masked_fill(mask, float("-inf")).softmax(-1), dropout, True)
                out = torch.matmul(probs, v)
            x = x + functional.dropout(self.proj(out.transpose(1, 2).reshape(b, s, h)), dropout, True)
            y = self.fc1(self.norm2(x))
            if config["is_gated_ffn"]:
                gate, up = y.chunk(2, dim=-1)
                y = functional.silu(gate) * up
            else:
                y = functional.gelu(y)
            return x + functional.dropout(self.fc2(y), dropout, True)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = nn.Embedding(config["vocab_size"], h)
            self.blocks = nn.ModuleList(Block() for _ in range(config["num_layers"]))
            self.norm = norm()
            self.head = nn.Linear(h, config["vocab_size"], bias=False)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            x = self.embedding(tokens)
            for block in self.blocks:
                x = block(x)
            logits = self.head(self.norm(x))
            return functional.cross_entropy(logits.float().view(-1, logits.shape[-1]), tokens.view(-1))

    return Model()


def _kind(name: str) -> str:
    lowered = name.lower()
    for kind, marks in (("attention", ("flash", "fmha", "sdpa", "attention", "cudnn")),  # cuDNN's are wgmma too
                        ("gemm", ("gemm", "cutlass", "sm90_xmma", "sm80_xmma", "cublas", "nvjet", "wgmma")),
                        ("nccl", ("nccl",)), ("optimizer", ("adam", "multi_tensor"))):
        if any(mark in lowered for mark in marks):
            return kind
    return "elementwise"


def measure(out: str, steps: int, seconds: float, names: list[str] | None = None) -> None:
    """Time every model of ``MODELS`` (or those ``names`` picks) on the GPU and write ``out``."""
    import torch

    device = torch.device("cuda")
    results: dict[str, Any] = {"gpu": torch.cuda.get_device_name(device), "torch": torch.__version__,
                               "date": time.strftime("%Y-%m-%d"), "models": {}}
    for name, (config, b, s, attention) in MODELS.items():
        if names is not None and name not in names:
            continue
        torch.manual_seed(0)
        model = _build(config, attention).to(device=device, dtype=torch.bfloat16)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        tokens = torch.randint(0, config["vocab_size"], (b, s), device=device)
        events = [[torch.cuda.Event(enable_timing=True) for _ in range(3)] for _ in range(steps + 3)]
        for index in range(steps + 3):
            start, middle, end = events[index]
            start.record()
            model(tokens).backward()
            middle.record()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            end.record()
        torch.cuda.synchronize()
        timed = events[3:]
        forward_backward = sorted(start.elapsed_time(middle) / 1e3 for start, middle, _ in timed)
        update = sorted(middle.elapsed_time(end) / 1e3 for _, middle, end in timed)
        hot: list[float] = []
        clocks: list[float] = []
        began = time.perf_counter()
        while time.perf_counter() - began < seconds:  # the card hot, as a long training run keeps it
            start, middle = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            model(tokens).backward()
            middle.record()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            middle.synchronize()
            hot.append(start.elapsed_time(middle) / 1e3)
            try:
                clocks.append(float(torch.cuda.clock_rate()))
            except Exception:  # noqa: BLE001 - the clock is a nice-to-have (needs NVML)
                pass
        tail = sorted(hot[2 * len(hot) // 3:]) or [float("nan")]
        kinds: dict[str, float] = {}
        kernels: dict[str, list[float]] = {}
        try:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profiler:
                model(tokens).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                torch.cuda.synchronize()
            for event in profiler.events():
                if event.device_type == torch.autograd.DeviceType.CUDA:
                    kernel_s = event.device_time_total / 1e6
                    kinds[_kind(event.name)] = kinds.get(_kind(event.name), 0.0) + kernel_s
                    kernels.setdefault(event.name[:160], [0, 0.0])
                    kernels[event.name[:160]][0] += 1
                    kernels[event.name[:160]][1] += kernel_s
        except (RuntimeError, AttributeError) as error:  # the timings above stand without the breakdown
            kinds = {"error": str(error)[:200]}  # type: ignore[dict-item]
        results["models"][name] = {
            "config": config, "microbatch_size": b, "seq_len": s, "attention": attention,
            "parameters": sum(p.numel() for p in model.parameters()),
            "forward_backward_s": forward_backward[len(forward_backward) // 2],
            "hot_forward_backward_s": tail[len(tail) // 2], "hot_seconds": seconds, "hot_steps": len(hot),
            "sm_clock_mhz_last_third": clocks[2 * len(clocks) // 3:],
            "optimizer_s": update[len(update) // 2],
            "kernel_seconds_by_kind": kinds,
            "top_kernels": sorted(([k, v[0], v[1]] for k, v in kernels.items()), key=lambda row: -row[2])[:60],
        }
        print(f"{name}: forward+backward {results['models'][name]['forward_backward_s'] * 1e3:.2f} ms "
              f"({results['models'][name]['hot_forward_backward_s'] * 1e3:.2f} ms hot), "
              f"optimizer {results['models'][name]['optimizer_s'] * 1e3:.2f} ms, by kind "
              + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in sorted(kinds.items())), flush=True)
        del model, optimizer
        torch.cuda.empty_cache()
    Path(out).write_text(json.dumps(results, indent=1), encoding="utf-8")


# The optimizer the benchmark steps with: torch's fused AdamW on bf16 weights, its state in bf16 too:
# reads weight, gradient, m and v (2 bytes each), writes weight, m and v.
FUSED_ADAMW_BYTES_PER_PARAMETER = 14


def predict(entry: dict[str, Any], device_name: str) -> dict[str, float]:
    """pipesim's forward + backward and optimizer seconds for one measured model (one microbatch, one GPU)."""
    from pipesim.spec.device import load_device
    from pipesim.spec.transformer import TransformerConfig
    from pipesim.spec.transformer_profile import transformer_profile

    config = TransformerConfig(name="step", **entry["config"])
    device = load_device(device_name)
    profile = transformer_profile(config, device=device, microbatch_size=entry["microbatch_size"],
                                  seq_len=entry["seq_len"], attention=entry["attention"], precision="bf16")
    forward_backward = sum(layer.forward_s + layer.backward_s for layer in profile.layers)
    rate = device.memory_bandwidth_bytes_per_s * device.memory.max_efficiency * \
        device.memory.kind_efficiency.get("optimizer", 1.0)
    return {"forward_backward_s": forward_backward,
            "optimizer_s": entry["parameters"] * FUSED_ADAMW_BYTES_PER_PARAMETER / rate}


def predict_report(measured: dict[str, Any], device_name: str) -> str:
    """A markdown table: measured and predicted step parts per model, with the ratio."""
    lines = [f"## A training step on one GPU against the op cost model (`bench_device_step.py`)", "",
             f"Measured {measured['date']} on the lent {measured['gpu']} (torch {measured['torch']}, bf16, eager, "
             f"one microbatch, no recomputation; cool: median of the timed steps after 3 warm-up steps, hot: median "
             f"of the last third of steps run back to back for the seconds given); predicted with the shipped "
             f"`{device_name}` device file (its sustained share is for a hot card).", "",
             "| model | part | measured ms | predicted ms | predicted / measured |", "|---|---|---|---|---|"]
    for name, entry in measured["models"].items():
        predicted = predict(entry, device_name)
        parts = [("forward + backward, cool", "forward_backward_s", "forward_backward_s"),
                 ("optimizer", "optimizer_s", "optimizer_s")]
        if "hot_forward_backward_s" in entry:
            parts.insert(1, ("forward + backward, hot", "hot_forward_backward_s", "forward_backward_s"))
        for label, key, part in parts:
            lines.append(f"| {name} | {label} | {entry[key] * 1e3:.2f} | {predicted[part] * 1e3:.2f} | "
                         f"{predicted[part] / entry[key]:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", action="store_true")
    parser.add_argument("--out", default="step.json")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=20.0, help="steps run back to back afterwards, the card hot")
    parser.add_argument("--models", default="", help="comma-separated words; the models whose name holds one "
                                                     "(default every model)")
    parser.add_argument("--predict", default=None)
    parser.add_argument("--device", default="h200")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    words = [word.strip() for word in args.models.split(",") if word.strip()]
    names = [name for name in MODELS if any(word in name for word in words)] if words else None
    if names is not None and not names:
        parser.error(f"--models {args.models!r} picks none of: {', '.join(MODELS)}")
    if args.measure:
        measure(args.out, args.steps, args.seconds, names)
        return 0
    if args.predict:
        files = [json.loads(Path(name).read_text(encoding="utf-8")) for name in args.predict.split(",")]
        measured = {**files[0], "models": {k: v for f in files for k, v in f["models"].items()}}
        text = predict_report(measured, args.device)
        print(text)
        if args.write:
            from results_file import write_section

            write_section("device-step", text)
        return 0
    parser.error("give --measure or --predict FILE")
    return 2


if __name__ == "__main__":
    sys.exit(main())
