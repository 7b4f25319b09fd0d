"""Fitting a device's efficiency curves to measurements (``pipesim device calibrate``), without torch.

``fit_device(measurements, base)`` takes what ``pipesim.harness.rank.device_calibration`` measured on
a card and the card's datasheet file (``base``: peaks, bandwidth, memory, SMs) and returns the
base with its curves replaced by the fitted ones, the raw measurements kept under ``measured``:

- launch and memory: a straight line through the copies' seconds against bytes (those long
  enough to be bound by the card, not by the host's dispatch): its intercept is the launch cost,
  its slope the copy rate. Norms, softmax and element-wise ops get their rate relative to a copy.
- matmul: the tile set (from ``TILE_SETS``), the per-tile overhead in k and the share of peak that
  minimise the squared log error over the products measured (the same tiles' relative rates for
  every shape; points the host's dispatch bounds are left out); the sustained share is the rate of
  one product repeated for seconds over what that curve predicts for it (``sustained_share``).
- attention: forward and backward shares and the two ramps, by least squares on a grid.

``fit_collectives(measurements, base)`` does the same for a cluster from NCCL's all-reduce,
reduce-scatter and all-gather across a node's GPUs (``pipesim.harness.linkbench.measure_collectives``):
the in-node tier's per-hop latency and bus rate by least squares on pipesim's own ring formulas
(``pipesim.spec.collectives``), the other tiers the base's.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from pipesim.errors import ConfigError
from pipesim.spec.cluster import Cluster
from pipesim.spec.device import Device

# A measurement shorter than this is taken to be bound by the host's dispatch, not the card.
MIN_SECONDS = 40e-6
# Candidate tile sets: (m, n, relative rate); the first rate of each set is the reference 1.
TILE_SETS: dict[str, tuple[tuple[int, int, float], ...]] = {
    f"large+{small}@{rate}": ((256, 128, 1.0), (128, 256, 1.0), (192, 192, 1.0), (128, 128, rate),
                              *(((64, 128, rate * small_rate), (128, 64, rate * small_rate)) if small else ()))
    for rate in (0.8, 0.9, 1.0) for small, small_rate in ((0, 0.0), (1, 0.6), (1, 0.8))
}
K_OVERHEADS = (0.0, 16.0, 32.0, 48.0, 64.0, 96.0, 128.0, 192.0, 256.0)
KIND_OPS = {"norm": ("layer_norm", "rms_norm"), "softmax": ("softmax",), "elementwise": ("gelu", "silu_mul", "add")}


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of ys against xs."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    slope, intercept = np.polyfit(x, y, 1)
    return float(intercept), float(slope)


def fit_memory(copies: list[dict[str, Any]], bandwidth: float) -> tuple[float, float]:
    """(launch seconds, copy share of ``bandwidth``) from the copy measurements."""
    points = [row for row in copies if row["seconds"] >= 2 * MIN_SECONDS]
    if len(points) < 2:
        raise ConfigError("copy", len(points), "needs at least two copies longer than 80 us to fit the memory rate")
    intercept, slope = fit_line([row["bytes"] for row in points], [row["seconds"] for row in points])
    if slope <= 0:  # times that do not grow with the bytes (a noisy host): the best rate seen, no intercept
        return 0.0, min(1.0, max(row["bytes"] / row["seconds"] for row in points) / bandwidth)
    return max(0.0, intercept), min(1.0, 1.0 / slope / bandwidth)


def _matmul_arrays(rows: list[dict[str, Any]]) -> tuple[np.ndarray, ...]:
    m = np.array([row["m"] for row in rows], dtype=float)
    n = np.array([row["n"] for row in rows], dtype=float)
    k = np.array([row["k"] for row in rows], dtype=float)
    batch = np.array([row.get("batch", 1) for row in rows], dtype=float)
    seconds = np.array([row["seconds"] for row in rows], dtype=float)
    return m, n, k, batch, seconds


def _compute_seconds(m: np.ndarray, n: np.ndarray, k: np.ndarray, batch: np.ndarray, tiles: tuple[tuple[int, int, float], ...],
                     k_overhead: float, per_sm_peak: float, num_sms: int) -> np.ndarray:
    """The tile-wave time of each product at a sustained share of 1 (``Device.matmul_s``'s compute part)."""
    best = np.full(m.shape, np.inf)
    for tile_m, tile_n, share in tiles:
        count = np.ceil(m / tile_m) * np.ceil(n / tile_n) * batch
        waves = np.ceil(count / num_sms)
        best = np.minimum(best, waves * 2.0 * tile_m * tile_n * (k + k_overhead) / (per_sm_peak * share))
    return best


def fit_matmul(rows: list[dict[str, Any]], *, peak: float, num_sms: int, launch_s: float,
               copy_rate: float) -> tuple[dict[str, Any], float]:
    """The matmul curve (as a device file's ``matmul``) and its RMS log error over ``rows``."""
    usable = [row for row in rows if row["seconds"] >= MIN_SECONDS]
    if len(usable) < 5:
        raise ConfigError("gemm", len(usable), "needs at least five products longer than 40 us to fit")
    m, n, k, batch, seconds = _matmul_arrays(usable)
    memory = batch * 2.0 * (m * k + k * n + m * n) / copy_rate
    target = np.log(seconds)
    best: tuple[float, str, float, float] = (math.inf, "", 0.0, 0.0)
    for (name, tiles), overhead in itertools.product(TILE_SETS.items(), K_OVERHEADS):
        compute = _compute_seconds(m, n, k, batch, tiles, overhead, peak / num_sms, num_sms)
        for share in np.arange(0.01, 1.0001, 0.005):
            predicted = launch_s + np.maximum(compute / share, memory)
            error = float(np.mean((np.log(predicted) - target) ** 2))
            if error < best[0]:
                best = (error, name, overhead, float(share))
    error, name, overhead, share = best
    curve = {"max_efficiency": float(f"{share:.4g}"), "k_overhead": overhead,
             "tiles": [{"m": tm, "n": tn, "efficiency": rate} for tm, tn, rate in TILE_SETS[name]]}
    return curve, math.sqrt(error)


def fit_attention(rows: list[dict[str, Any]], *, peak: float, launch_s: float) -> tuple[dict[str, float], float]:
    """The attention curve and its RMS log error: each direction's share and sequence ramp, one head ramp."""
    s = np.array([row["s"] for row in rows], dtype=float)
    d = np.array([row["d"] for row in rows], dtype=float)
    flops = 2.0 * np.array([row["batch"] * row["heads"] for row in rows], dtype=float) * s * s * d
    best: tuple[float, dict[str, float]] = (math.inf, {})
    for head_half in (0.0, 16.0, 32.0, 48.0, 64.0, 96.0, 128.0, 192.0):
        head = (1 + head_half / 128.0) * d / (d + head_half)
        total, curve = 0.0, {"head_dim_half": head_half}
        for direction, key, multiplier in (("forward", "forward_seconds", 1.0), ("backward", "backward_seconds", 2.5)):
            measured = np.array([row[key] for row in rows], dtype=float)
            direction_best = (math.inf, 0.0, 0.0)
            for seq_half in (0.0, 128.0, 256.0, 384.0, 512.0, 768.0, 1024.0, 1536.0, 2048.0, 3072.0):
                ideal = multiplier * flops / (peak * head * s / (s + seq_half))
                share = min(1.0, float(np.exp(np.mean(np.log(ideal) - np.log(np.maximum(measured - launch_s, 1e-9))))))
                error = float(np.mean((np.log(launch_s + ideal / share) - np.log(measured)) ** 2))
                if error < direction_best[0]:
                    direction_best = (error, share, seq_half)
            total += direction_best[0]
            curve[f"{direction}_max_efficiency"] = float(f"{direction_best[1]:.4g}")
            curve[f"{direction}_seq_half"] = direction_best[2]
        if total < best[0]:
            best = (total, curve)
    return best[1], math.sqrt(best[0] / 2)


def fit_kinds(rows: list[dict[str, Any]], *, launch_s: float, copy_rate: float) -> dict[str, float]:
    """Each memory kind's rate relative to a copy (mean over the measured sizes)."""
    shares: dict[str, float] = {}
    for kind, names in KIND_OPS.items():
        ratios = [row["bytes"] / max(row["seconds"] - launch_s, 1e-9) / copy_rate for row in rows
                  if row["op"] in names and row["seconds"] >= MIN_SECONDS]
        if ratios:
            shares[kind] = float(f"{min(1.0, float(np.mean(ratios))):.3g}")
    return shares


def fit_device(measurements: dict[str, Any], base: Device, *, name: str | None = None) -> tuple[Device, dict[str, float]]:
    """``base`` with the curves fitted to ``measurements``, and each fit's RMS log error.

    Raises:
        ConfigError: measurements of another schema, or too few usable points for a fit.
    """
    if measurements.get("schema") != "pipesim.device-measurements/1":
        raise ConfigError("measurements", measurements.get("schema"), "must be pipesim.device-measurements/1 "
                          "(what pipesim device calibrate measures)")
    precision = "bf16" if measurements.get("dtype", "bf16") == "bf16" else "fp16"
    peak = base.peak(precision)
    launch, copy_share = fit_memory(measurements["copy"], base.memory_bandwidth_bytes_per_s)
    copy_rate = copy_share * base.memory_bandwidth_bytes_per_s
    products = measurements["gemm"] + measurements.get("bmm", [])
    matmul, matmul_error = fit_matmul(products, peak=peak, num_sms=base.num_sms, launch_s=launch, copy_rate=copy_rate)
    attention, attention_error = fit_attention(measurements["attention"], peak=peak, launch_s=launch)
    kinds = {**base.memory.kind_efficiency, **fit_kinds(measurements.get("elementwise", []), launch_s=launch,
                                                        copy_rate=copy_rate)}
    machine = measurements.get("machine", {})
    when = f"measured on {machine.get('gpu')} ({machine.get('host')}), {machine.get('date')}, torch {machine.get('torch')}"
    sources = dict(base.sources)
    for field in ("launch_s", "memory", "matmul", "attention"):
        sources[field] = f"pipesim device calibrate: {when}"
    fitted = base.model_copy(update={
        "name": name or base.name,
        "launch_s": round(launch, 9),
        "sustained_share": 1.0,
        "memory": base.memory.model_copy(update={"max_efficiency": float(f"{copy_share:.4g}"), "half_bytes": 0.0,
                                                 "kind_efficiency": kinds}),
        "matmul": base.matmul.model_validate(matmul),
        "attention": base.attention.model_validate(attention),
        "sources": sources,
        "measured": {"machine": machine, "fit_rms_log_error": {"matmul": round(matmul_error, 4),
                                                               "attention": round(attention_error, 4)}},
    })
    sustained = measurements.get("sustained", {})
    share = sustained_share(fitted, sustained, precision) if sustained else base.sustained_share
    if sustained:
        sources["sustained_share"] = f"pipesim device calibrate: a {sustained.get('m', 0)}^3 product repeated for " \
            f"seconds, its rate once hot over the fitted curve's rate for that product; {when}"
    fitted = fitted.model_copy(update={"sustained_share": share, "sources": sources})
    return Device.model_validate(fitted.model_dump(by_alias=True)), {"matmul": matmul_error,
                                                                     "attention": attention_error}


def sustained_share(curve: Device, sustained: dict[str, Any], precision: str) -> float:
    """The hot rate of the repeated product over what ``curve`` (at a share of 1) predicts for it.

    The sweep's products ran for milliseconds each, some on a card already warm, so the curve
    fitted to them sits between the first burst and the hot rate: dividing by the burst would count
    the fall in clocks twice. Over the curve's own rate, the hot product is predicted at the rate
    measured.
    """
    size = float(sustained["m"]), float(sustained.get("n", sustained["m"])), float(sustained.get("k", sustained["m"]))
    burst = curve.model_copy(update={"sustained_share": 1.0})
    predicted = 2.0 * size[0] * size[1] * size[2] / burst.matmul_s(*size, precision=precision)
    return float(f"{min(1.0, sustained['sustained_flops_per_s'] / predicted):.4g}")


COLLECTIVES = {"all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.0}  # ring hops, as collectives.py


def fit_latency_and_rate(latency_terms: np.ndarray, byte_terms: np.ndarray,
                         seconds: np.ndarray) -> tuple[float, float]:
    """(latency a >= 0, inverse rate u) of ``seconds = a x latency_terms + u x byte_terms`` by least
    squares on relative error: an alpha-beta fit (a link's ping-pong has one latency a message, a
    ring collective one a hop)."""
    weights = 1.0 / seconds
    design = np.stack([latency_terms, byte_terms], axis=1) * weights[:, None]
    (latency, inverse), *_ = np.linalg.lstsq(design, seconds * weights, rcond=None)
    if latency < 0:
        latency = 0.0
        inverse = float(np.sum(byte_terms * seconds * weights**2) / np.sum(byte_terms**2 * weights**2))
    return float(latency), float(inverse)


def fit_collectives(measurements: dict[str, Any], base: Cluster) -> tuple[Cluster, float]:
    """``base`` with its in-node tier fitted to collectives across one node's GPUs, and the fit's
    RMS log error.

    Each row is a ring of n ranks: hops (n - 1) a + hops (n - 1) / n S / B, two hops an all-reduce,
    one a reduce-scatter or all-gather, S the whole buffer; a and B by least squares on relative
    error (a >= 0). B becomes the tier's bus efficiency over its datasheet rate, or the rate itself
    at efficiency 1 where it is faster (a reduction in the switch).

    Raises:
        ConfigError: measurements of another schema, more ranks than a node holds, or fewer than
            two usable rows.
    """
    if measurements.get("schema") != "pipesim.collective-measurements/1":
        raise ConfigError("measurements", measurements.get("schema"), "must be pipesim.collective-measurements/1 "
                          "(the NCCL collectives pipesim device calibrate measures on two or more GPUs)")
    n = int(measurements.get("world_size") or 0)
    tier = base.tiers[0]
    if not 2 <= n <= (tier.gpus or n):
        raise ConfigError("world_size", n, f"must be 2 to {tier.gpus} (the GPUs of one {base.name} node)")
    rows = [(hops, float(row["bytes"]), float(row["seconds"])) for name, hops in COLLECTIVES.items()
            for row in measurements.get(name, []) if row.get("seconds", 0) > 0]
    if len(rows) < 2:
        raise ConfigError("collectives", len(rows), "needs at least two timed collectives to fit the in-node tier")
    latency_terms = np.array([hops * (n - 1) for hops, _, _ in rows])
    byte_terms = np.array([hops * (n - 1) / n * size for hops, size, _ in rows])
    seconds = np.array([time for _, _, time in rows])
    latency, inverse = fit_latency_and_rate(latency_terms, byte_terms, seconds)
    bus = 1.0 / inverse if inverse > 0 else tier.bandwidth_bytes_per_s
    predicted = latency * latency_terms + byte_terms / bus
    error = float(np.sqrt(np.mean(np.log(predicted / seconds) ** 2)))
    machine = measurements.get("machine", {})
    when = f"measured ({measurements.get('backend')}, {n} GPUs of {machine.get('gpu')} on {machine.get('host')}, " \
        f"{machine.get('date')}) by pipesim device calibrate: all-reduce, reduce-scatter and all-gather fitted"
    rate, efficiency = (tier.bandwidth_bytes_per_s, bus / tier.bandwidth_bytes_per_s) \
        if bus <= tier.bandwidth_bytes_per_s else (bus, 1.0)
    fitted_tier = tier.model_copy(update={"bandwidth_bytes_per_s": float(f"{rate:.4g}"),
                                          "bus_efficiency": float(f"{efficiency:.4g}"),
                                          "latency_s": float(f"{latency:.4g}")})
    sources = {**base.sources, "tiers[0].bus_efficiency": when, "tiers[0].latency_s": when}
    if rate != tier.bandwidth_bytes_per_s:
        sources["tiers[0].bandwidth_bytes_per_s"] = f"{when}: the bus rate over the datasheet link's, kept as the rate"
    fitted = base.model_copy(update={"tiers": (fitted_tier, *base.tiers[1:]), "sources": sources})
    return Cluster.model_validate(fitted.model_dump(by_alias=True)), error
