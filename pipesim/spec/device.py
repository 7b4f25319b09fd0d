"""Device: one GPU kind as data (peak rates, memory, efficiency curves), read from a device file.

A device file (``pipesim.device/1``) holds what the op cost model (``pipesim.spec.opcost``) needs
of a card, each number with its source in ``sources`` (a datasheet, a paper, or a measurement
with its date and machine). The shipped files live in ``pipesim/data/devices/``; ``--device
NAME`` reads one of them, ``--device FILE`` a user's. ``pipesim device calibrate`` writes a
measured one.

The curves:

- matmul: a product of (m x k) by (k x n) runs as tiles of tm x tn outputs spread over the
  card's ``num_sms`` multiprocessors in waves; a tile costs ``2 tm tn (k + k_overhead)`` FLOPs
  of time at ``max_efficiency x tile efficiency`` of its multiprocessor's share of the peak.
  The library picks the tile that finishes first, so ragged edges and a last partial wave cost
  what they cost on the card, and a short k (attention's head size) pays its fixed overhead.
- memory: a kernel that streams ``bytes`` reaches ``max_efficiency`` of the datasheet
  bandwidth, less for small transfers: ``bytes / (bytes + half_bytes)`` of it. Norms and
  softmax reach less than a copy; ``kind_efficiency`` gives their share relative to a copy.
- attention: a fused (FlashAttention-style) kernel at ``max_efficiency`` of the matrix peak for
  heads of 128 and long sequences, scaled by ``s / (s + seq_half)`` for sequence s and by
  ``d / (d + head_dim_half)`` relative to d = 128 for head size d, forward and backward apart.
- ``launch_s``: the fixed cost of one kernel on the card.
- ``sustained_share``: the share of the burst rate the card holds once hot under matrix load
  (its clock falls to stay within its power limit); it scales matmul and attention.
"""

from __future__ import annotations

import math
from functools import cached_property
from typing import Any, Literal

from pydantic import Field, model_validator

from pipesim.errors import ConfigError
from pipesim.spec.shipped import shipped_names, shipped_text
from pipesim.spec.validation import Float, FrozenModel, Int

DEVICE_SCHEMA = "pipesim.device/1"
Precision = Literal["fp32", "tf32", "fp16", "bf16", "fp8"]
PRECISIONS: tuple[Precision, ...] = ("bf16", "fp16", "fp8", "tf32", "fp32")
REFERENCE_HEAD_DIM = 128  # the head size an attention curve's max_efficiency is quoted at
MEMORY_KINDS = ("copy", "elementwise", "norm", "softmax", "dropout", "optimizer")


class Tile(FrozenModel):
    """One output tile shape a matrix library runs, and its rate relative to the best tile."""

    m: Int = Field(gt=0)
    n: Int = Field(gt=0)
    efficiency: Float = Field(gt=0, le=1)


class MatmulCurve(FrozenModel):
    """Matrix products: the sustained share of peak, the tiles, and the per-tile overhead in k."""

    max_efficiency: Float = Field(gt=0, le=1)
    k_overhead: Float = Field(ge=0)
    tiles: tuple[Tile, ...] = Field(min_length=1)


class MemoryCurve(FrozenModel):
    """Memory-bound kernels: a copy's share of the datasheet bandwidth, its ramp, other kinds' shares."""

    max_efficiency: Float = Field(gt=0, le=1)
    half_bytes: Float = Field(ge=0)
    kind_efficiency: dict[str, Float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _kinds(self) -> MemoryCurve:
        for kind, share in self.kind_efficiency.items():
            if kind not in MEMORY_KINDS:
                raise ConfigError(f"kind_efficiency.{kind}", share, f"must be one of {', '.join(MEMORY_KINDS)}")
            if not 0 < share <= 1:
                raise ConfigError(f"kind_efficiency.{kind}", share, "must be in (0, 1]")
        return self


class AttentionCurve(FrozenModel):
    """Fused attention: forward and backward shares of the matrix peak, and their ramps."""

    forward_max_efficiency: Float = Field(gt=0, le=1)
    backward_max_efficiency: Float = Field(gt=0, le=1)
    forward_seq_half: Float = Field(ge=0)
    backward_seq_half: Float = Field(ge=0)
    head_dim_half: Float = Field(ge=0)


class Device(FrozenModel):
    """One GPU kind.

    Attributes:
        schema_: ``"pipesim.device/1"`` (``"schema"`` in JSON).
        name: short key, e.g. ``"h100"``.
        description: the product, e.g. ``"NVIDIA H100 SXM5 80 GB"``.
        memory_bytes: memory as the driver reports it (nvidia-smi's total), bytes.
        peak_flops: dense matrix FLOP/s by precision (bf16, fp16, fp8, tf32, fp32), datasheet.
        vector_flops: non-matrix fp32 FLOP/s (element-wise math), datasheet.
        memory_bandwidth_bytes_per_s: datasheet memory bandwidth.
        num_sms: multiprocessors the matrix tiles spread over.
        launch_s: fixed cost of one kernel on the card, seconds.
        sustained_share: share of the matrix curve's rate the card holds under sustained load (hot).
        matmul, memory, attention: the efficiency curves (module docstring).
        default_cluster: the shipped cluster this card usually sits in (its DGX/HGX system).
        sources: where each number comes from, by field name.
        measured: for a calibrated file, when and on what it was measured (and the raw figures).
    """

    schema_: str = Field(default=DEVICE_SCHEMA, alias="schema")
    name: str = Field(min_length=1)
    description: str = ""
    memory_bytes: Float = Field(gt=0)
    peak_flops: dict[str, Float]
    vector_flops: Float = Field(gt=0)
    memory_bandwidth_bytes_per_s: Float = Field(gt=0)
    num_sms: Int = Field(gt=0)
    launch_s: Float = Field(ge=0)
    sustained_share: Float = Field(default=1.0, gt=0, le=1)
    matmul: MatmulCurve
    memory: MemoryCurve
    attention: AttentionCurve
    default_cluster: str | None = None
    sources: dict[str, str] = Field(default_factory=dict)
    measured: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check(self) -> Device:
        if self.schema_ != DEVICE_SCHEMA:
            raise ConfigError("schema", self.schema_, f"must be {DEVICE_SCHEMA!r}")
        if not self.peak_flops:
            raise ConfigError("peak_flops", self.peak_flops, "must give at least one precision's peak")
        for precision, rate in self.peak_flops.items():
            if precision not in PRECISIONS:
                raise ConfigError(f"peak_flops.{precision}", rate, f"must be one of {', '.join(PRECISIONS)}")
            if not rate > 0:
                raise ConfigError(f"peak_flops.{precision}", rate, "must be > 0")
        return self

    @property
    def default_precision(self) -> Precision:
        """bf16 where the card has it, else fp16 (V100)."""
        return "bf16" if "bf16" in self.peak_flops else "fp16"

    def peak(self, precision: str) -> float:
        """Dense matrix FLOP/s at ``precision``.

        Raises:
            ConfigError: a precision the card has no peak for.
        """
        if precision not in self.peak_flops:
            raise ConfigError("precision", precision, f"is not a precision {self.name} runs matrices in "
                              f"(it has {', '.join(self.peak_flops)})")
        return self.peak_flops[precision]

    @cached_property
    def _tiles(self) -> tuple[tuple[int, int, float], ...]:
        return tuple((tile.m, tile.n, tile.efficiency) for tile in self.matmul.tiles)

    def matmul_s(self, m: float, n: float, k: float, *, precision: str, batch: float = 1.0,
                 element_bytes: float = 2.0) -> float:
        """Seconds of ``batch`` products of (m x k) by (k x n): the slower of the tile-wave compute
        time and the bytes of A, B and C over the memory rate, plus one launch."""
        if m <= 0 or n <= 0 or k <= 0 or batch <= 0:
            return 0.0
        per_sm = self.peak(precision) * self.matmul.max_efficiency * self.sustained_share / self.num_sms
        best = math.inf
        for tile_m, tile_n, share in self._tiles:
            tiles = math.ceil(m / tile_m) * math.ceil(n / tile_n) * batch
            waves = math.ceil(tiles / self.num_sms)
            best = min(best, waves * 2.0 * tile_m * tile_n * (k + self.matmul.k_overhead) / (per_sm * share))
        moved = batch * element_bytes * (m * k + k * n + m * n)
        return self.launch_s + max(best, self.stream_s(moved))

    def matmul_efficiency(self, m: float, n: float, k: float, *, precision: str, batch: float = 1.0) -> float:
        """FLOPs of the product over its predicted seconds, as a share of the precision's peak."""
        seconds = self.matmul_s(m, n, k, precision=precision, batch=batch)
        return 2.0 * batch * m * n * k / seconds / self.peak(precision) if seconds > 0 else 0.0

    def stream_s(self, num_bytes: float, kind: str = "copy") -> float:
        """Seconds to stream ``num_bytes`` through memory by a kernel of ``kind`` (no launch)."""
        if num_bytes <= 0:
            return 0.0
        curve = self.memory
        share = curve.max_efficiency * curve.kind_efficiency.get(kind, 1.0)
        return (num_bytes + curve.half_bytes) / (self.memory_bandwidth_bytes_per_s * share)

    def attention_efficiency(self, seq_len: float, head_dim: float, *, backward: bool) -> float:
        """Share of the matrix peak a fused attention kernel reaches at sequence ``seq_len`` and head size."""
        curve = self.attention
        top, half = (curve.backward_max_efficiency, curve.backward_seq_half) if backward else \
            (curve.forward_max_efficiency, curve.forward_seq_half)
        head = (1 + curve.head_dim_half / REFERENCE_HEAD_DIM) * head_dim / (head_dim + curve.head_dim_half)
        return self.sustained_share * top * seq_len / (seq_len + half) * head


def shipped_devices() -> tuple[str, ...]:
    """The names of the device files shipped in the package."""
    return shipped_names("devices")


def load_device(name_or_path: str) -> Device:
    """A shipped device by name (case-insensitive), or a device file by path.

    Raises:
        ConfigError: neither a shipped name nor a readable, valid device file.
    """
    from pipesim.spec.files import load_device_file  # noqa: PLC0415 - files imports this module

    shipped = shipped_text("devices", name_or_path)
    if shipped is not None:
        return load_device_file(text=shipped[0], source=shipped[1])
    if name_or_path.strip().lower().endswith(".json") or "/" in name_or_path:
        return load_device_file(path=name_or_path)
    raise ConfigError("device", name_or_path, f"must be a device file or one of {', '.join(shipped_devices())}")
