"""Measuring a GPU for a device file: GEMMs over shapes, attention, memory copies, launch cost.

``measure_device`` times, with CUDA events, what the op cost model prices (pipesim.spec.opcost):
matrix products of the shapes a transformer runs (and batched ones, as unfused attention runs
them), FlashAttention-style attention by sequence length and head size, memory-bound copies by
bytes moved, and the fixed cost of one kernel. It also runs one large product for several
seconds, so that the file can say how much of its fitted rate the card sustains once it is hot.
The result is a plain JSON-ready dict of measurements; ``pipesim.spec.calibration`` fits a
device's efficiency curves to it. Runs on CPU too (a smoke test of the code path: its numbers
describe nothing).

    python -m pipesim.harness.rank.device_calibration --out raw.json [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as functional

# (m, n, k) of the products a transformer layer runs (tokens x hidden x hidden/t ...), plus a square
# ladder: enough variety in every dimension for a fit of the wave and tile model.
_SIZES = (256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
_LADDER = tuple((size, size, size) for size in _SIZES)
_TRANSFORMER = tuple(
    shape
    for tokens in (2048, 4096, 8192, 16384)
    for hidden, inner in ((2048, 8192), (4096, 16384), (5120, 13824), (8192, 28672), (2304, 9216))
    for shape in ((tokens, 3 * hidden, hidden), (tokens, hidden, hidden), (tokens, inner, hidden),
                  (tokens, hidden, inner), (hidden, inner, tokens))
)
_THIN = tuple((m, n, k) for m in (2048, 8192) for n in (64, 128, 256, 768) for k in (1024, 4096, 16384)) + tuple(
    (m, n, k) for m in (2048, 8192) for n in (4096, 16384) for k in (32, 64, 96, 128, 256, 512))
_BATCHED = tuple((batch, s, d) for s in (1024, 2048, 4096) for d in (64, 96, 128) for batch in (32,))
_ATTENTION = tuple((s, d) for s in (512, 1024, 2048, 4096, 8192, 16384) for d in (64, 128))
_COPY_BYTES = tuple(2 ** power for power in range(14, 33, 2))


class Timer:
    """Mean seconds per call of a function: CUDA events on a GPU, perf_counter on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __call__(self, function: Callable[[], Any], *, warmup: int = 3, min_seconds: float = 0.02,
                 max_calls: int = 200) -> float:
        for _ in range(warmup):
            function()
        self.sync()
        probe = self._time(function, 1)
        calls = int(min(max_calls, max(3, min_seconds / max(probe, 1e-7))))
        return self._time(function, calls)

    def _time(self, function: Callable[[], Any], calls: int) -> float:
        if self.device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            for _ in range(calls):
                function()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end)) / 1e3 / calls
        began = time.perf_counter()
        for _ in range(calls):
            function()
        return (time.perf_counter() - began) / calls


def _gemms(timer: Timer, shapes: Iterable[tuple[int, int, int]], dtype: torch.dtype) -> list[dict[str, Any]]:
    """``F.linear(x, w)``: x (m, k), w (n, k), as a layer's forward runs it."""
    rows = []
    for m, n, k in shapes:
        x = torch.randn(m, k, device=timer.device, dtype=dtype)
        w = torch.randn(n, k, device=timer.device, dtype=dtype)
        seconds = timer(lambda: functional.linear(x, w))
        rows.append({"m": m, "n": n, "k": k, "seconds": seconds})
        del x, w
    return rows


def _batched(timer: Timer, dtype: torch.dtype) -> list[dict[str, Any]]:
    """Unfused attention's two products per head: scores = Q K^T (s x d x s), out = P V (s x s x d)."""
    rows = []
    for batch, s, d in _BATCHED:
        q = torch.randn(batch, s, d, device=timer.device, dtype=dtype)
        k = torch.randn(batch, s, d, device=timer.device, dtype=dtype)
        p = torch.randn(batch, s, s, device=timer.device, dtype=dtype)
        rows.append({"batch": batch, "m": s, "n": s, "k": d,
                     "seconds": timer(lambda: torch.bmm(q, k.transpose(1, 2)))})
        rows.append({"batch": batch, "m": s, "n": d, "k": s, "seconds": timer(lambda: torch.bmm(p, q))})
        del q, k, p
    return rows


def _attention(timer: Timer, dtype: torch.dtype, tokens: int,
               shapes: Iterable[tuple[int, int]] = _ATTENTION) -> list[dict[str, Any]]:
    """Causal ``scaled_dot_product_attention`` forward and forward + backward, heads of size d."""
    rows = []
    heads = 16
    for s, d in shapes:
        batch = max(1, tokens // s)
        shape = (batch, heads, s, d)
        q, k, v = (torch.randn(shape, device=timer.device, dtype=dtype, requires_grad=True) for _ in range(3))
        grad = torch.randn(shape, device=timer.device, dtype=dtype)

        def forward() -> torch.Tensor:
            return functional.scaled_dot_product_attention(q, k, v, is_causal=True)

        def both() -> None:
            forward().backward(grad)  # type: ignore[no-untyped-call]

        with torch.no_grad():
            forward_s = timer(forward, max_calls=50)
        total_s = timer(both, max_calls=50)
        rows.append({"batch": batch, "heads": heads, "s": s, "d": d, "forward_seconds": forward_s,
                     "backward_seconds": max(0.0, total_s - forward_s)})
        del q, k, v, grad
    return rows


def _copies(timer: Timer, max_bytes: int) -> list[dict[str, Any]]:
    """``dst.copy_(src)``: bytes moved = read + written."""
    rows = []
    for size in (size for size in _COPY_BYTES if size <= max_bytes):
        src = torch.empty(size // 2, device=timer.device, dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        rows.append({"bytes": 2 * size, "seconds": timer(lambda: dst.copy_(src))})
        del src, dst
    return rows


def _elementwise(timer: Timer, dtype: torch.dtype, tokens: int) -> list[dict[str, Any]]:
    """Norms, GELU, softmax and an add over (tokens, h) activations, with the bytes each reads and writes."""
    rows = []
    for hidden in (2048, 8192):
        x = torch.randn(tokens, hidden, device=timer.device, dtype=dtype)
        y = torch.randn_like(x)
        weight = torch.ones(hidden, device=timer.device, dtype=dtype)
        size = x.numel() * x.element_size()
        cases: dict[str, tuple[Callable[[], Any], int]] = {
            "layer_norm": (lambda: functional.layer_norm(x, (hidden,), weight, weight), 2 * size),
            "rms_norm": (lambda: functional.rms_norm(x, (hidden,), weight), 2 * size),
            "gelu": (lambda: functional.gelu(x), 2 * size),
            "silu_mul": (lambda: functional.silu(x) * y, 4 * size),
            "softmax": (lambda: torch.softmax(x, dim=-1), 2 * size),
            "add": (lambda: x + y, 3 * size),
        }
        for name, (function, moved) in cases.items():  # noqa: B023 - each case runs before the next is built
            rows.append({"op": name, "tokens": tokens, "hidden": hidden, "bytes": moved, "seconds": timer(function)})
        del x, y
    return rows


def _sustained(timer: Timer, dtype: torch.dtype, size: int, seconds: float) -> dict[str, Any]:
    """One product of ``size``^3 repeated for ``seconds``: its rate in the first and the last second."""
    a = torch.randn(size, size, device=timer.device, dtype=dtype)
    b = torch.randn(size, size, device=timer.device, dtype=dtype)
    flops = 2.0 * size ** 3
    timer.sync()
    burst = timer(lambda: a @ b, warmup=2, min_seconds=0.05)
    rates = []
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        rates.append(flops / timer(lambda: a @ b, warmup=0, min_seconds=0.25, max_calls=10_000))
    return {"m": size, "n": size, "k": size, "burst_flops_per_s": flops / burst,
            "sustained_flops_per_s": sum(rates[-4:]) / len(rates[-4:]), "rates_flops_per_s": rates}


def _launch(timer: Timer) -> dict[str, float]:
    """A one-element add: its time back to back on the stream is the fixed cost of one kernel."""
    x = torch.zeros(1, device=timer.device)
    return {"kernel_seconds": timer(lambda: x.add_(1.0), warmup=20, min_seconds=0.02, max_calls=5000)}


def cuda_available() -> bool:
    """Whether torch sees a CUDA GPU here."""
    return bool(torch.cuda.is_available())


def cuda_device_count() -> int:
    """How many CUDA GPUs torch sees here."""
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def machine(device: torch.device) -> dict[str, Any]:
    """What the measurements ran on: the card, driver-facing versions, host and date."""
    info: dict[str, Any] = {"date": datetime.date.today().isoformat(), "host": platform.node(),
                            "torch": torch.__version__, "device_type": device.type}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        free, total = torch.cuda.mem_get_info(device)
        info.update(gpu=props.name, multiprocessors=props.multi_processor_count, memory_total_bytes=total,
                    memory_free_bytes=free, cuda=torch.version.cuda,
                    cudnn=torch.backends.cudnn.version()  # type: ignore[no-untyped-call]
                    if torch.backends.cudnn.is_available() else None)  # type: ignore[no-untyped-call]
    else:
        info.update(gpu=None, multiprocessors=0, memory_total_bytes=0)
    return info


def measure_device(*, device: str = "cuda", quick: bool = False, sustained_s: float = 8.0,
                   progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Every measurement of the module docstring, as a JSON-ready dict.

    ``quick`` keeps the shapes small (the CPU smoke test); on a GPU it should be False.
    """
    target = torch.device(device)
    timer = Timer(target)
    dtype = torch.bfloat16
    torch.manual_seed(0)
    small = (128, 256, 512)
    gemm_shapes = [(m, n, k) for m in small for n in small for k in small] if quick else \
        sorted(set(_LADDER + _TRANSFORMER + _THIN))
    result: dict[str, Any] = {"schema": "pipesim.device-measurements/1", "machine": machine(target),
                              "dtype": "bf16"}
    progress(f"launch cost on {result['machine']['gpu'] or 'cpu'}")
    result["launch"] = _launch(timer)
    progress("memory copies")
    result["copy"] = _copies(timer, 2 ** 26 if quick else 2 ** 32)
    progress(f"{len(gemm_shapes)} matrix products")
    result["gemm"] = _gemms(timer, gemm_shapes, dtype)
    if not quick:
        progress("batched products (unfused attention)")
        result["bmm"] = _batched(timer, dtype)
    progress("attention")
    result["attention"] = _attention(timer, dtype, 256, ((64, 32), (128, 32))) if quick else \
        _attention(timer, dtype, 32768)
    progress("norms and element-wise ops")
    result["elementwise"] = _elementwise(timer, dtype, 64 if quick else 16384)
    progress(f"a {sustained_s:g} s sustained product")
    result["sustained"] = _sustained(timer, dtype, 256 if quick else 8192, 0.5 if quick else sustained_s)
    if not quick and target.type == "cuda" and hasattr(torch, "float8_e4m3fn"):
        result["fp8_gemm"] = _fp8(timer)
    return result


def _fp8(timer: Timer) -> list[dict[str, Any]]:
    """``torch._scaled_mm`` in float8_e4m3fn where the card has it (an error row where it has not)."""
    rows: list[dict[str, Any]] = []
    try:
        for size in (4096, 8192, 16384):
            a = torch.randn(size, size, device=timer.device).to(torch.float8_e4m3fn)
            b = torch.randn(size, size, device=timer.device).to(torch.float8_e4m3fn).t()
            scale = torch.ones((), device=timer.device)
            seconds = timer(lambda: torch._scaled_mm(a, b, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16))
            rows.append({"m": size, "n": size, "k": size, "seconds": seconds})
    except (RuntimeError, TypeError) as error:  # no fp8 tensor cores, or another torch signature
        rows.append({"error": str(error).splitlines()[0][:200]})
    return rows


def main(argv: list[str] | None = None) -> None:
    """``python -m pipesim.harness.rank.device_calibration --out FILE [--quick] [--device cpu]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sustained-s", type=float, default=8.0)
    args = parser.parse_args(argv)
    began = time.perf_counter()
    result = measure_device(device=args.device, quick=args.quick, sustained_s=args.sustained_s,
                            progress=lambda text: print(f"[{time.perf_counter() - began:6.1f} s] {text}", flush=True))
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)
    print(f"wrote {args.out} after {time.perf_counter() - began:.1f} s", flush=True)


if __name__ == "__main__":
    main()
