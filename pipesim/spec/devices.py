"""Accelerator presets: peak dense 16-bit FLOP/s, memory, bandwidths, and the sustained share assumed.

Figures are the vendors' datasheet numbers (dense, without structured sparsity), recalled, not
re-checked against the PDFs in this session:

- V100 SXM2 32 GB: 125 TFLOP/s fp16 tensor, 900 GB/s HBM2, NVLink 300 GB/s
  (NVIDIA Tesla V100 datasheet, 2018).
- A100 SXM 40 GB / 80 GB: 312 TFLOP/s bf16 dense, 1,555 / 2,039 GB/s HBM, NVLink 600 GB/s
  (NVIDIA A100 Tensor Core GPU datasheet, 2021).
- H100 SXM 80 GB: 989 TFLOP/s bf16 dense (1,979 with sparsity), 3.35 TB/s HBM3, NVLink 900 GB/s
  (NVIDIA H100 Tensor Core GPU datasheet, 2023).
- H200 SXM 141 GB: 989 TFLOP/s bf16 dense, 4.8 TB/s HBM3e, NVLink 900 GB/s (NVIDIA H200 datasheet, 2024).

Inter-node bandwidth is one NIC per GPU as in the DGX systems of each generation (V100 DGX-1:
100 Gbit/s EDR per two GPUs, taken as 50 Gbit/s each; A100 DGX: 200 Gbit/s HDR; H100/H200 DGX:
400 Gbit/s NDR), 8 GPUs a node. The sustained share of peak (``efficiency``) is an assumption:
0.5, close to the 52% of peak that Narayanan et al. (SC'21) report for their largest GPT runs on
A100; calibrate it on a measured profile (``pipesim.transformer.calibrated_efficiency``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from pipesim.errors import ConfigError
from pipesim.spec.presets import lookup

DEFAULT_EFFICIENCY = 0.5


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator model and the node it sits in.

    Attributes:
        name: preset key, e.g. ``"h100"``.
        peak_flops: peak dense 16-bit matrix FLOP/s.
        memory_bytes: device memory, bytes.
        memory_bandwidth_bytes_per_s: device memory bandwidth.
        intra_node_bandwidth_bytes_per_s: NVLink bandwidth per GPU (tensor parallel all-reduces).
        inter_node_bandwidth_bytes_per_s: NIC bandwidth per GPU (pipeline and data parallel traffic).
        gpus_per_node: GPUs sharing one NVLink domain.
        efficiency: sustained share of ``peak_flops`` on transformer layers (0 < e <= 1).
        source: where the figures come from.
        dtype: the 16-bit type its tensor cores run (float16 before A100, bfloat16 since).
    """

    name: str
    peak_flops: float
    memory_bytes: float
    memory_bandwidth_bytes_per_s: float
    intra_node_bandwidth_bytes_per_s: float
    inter_node_bandwidth_bytes_per_s: float
    gpus_per_node: int = 8
    efficiency: float = DEFAULT_EFFICIENCY
    source: str = ""
    dtype: str = "bfloat16"

    @property
    def sustained_flops(self) -> float:
        """FLOP/s the profile's times assume: ``peak_flops * efficiency``."""
        return self.peak_flops * self.efficiency

    def with_efficiency(self, efficiency: float) -> DeviceSpec:
        """The same device at another sustained share of peak.

        Raises:
            ConfigError: ``efficiency`` outside (0, 1].
        """
        if not 0 < efficiency <= 1:
            raise ConfigError("efficiency", efficiency, "must be in (0, 1]")
        return replace(self, efficiency=efficiency)


_GBIT = 1e9 / 8

DEVICES: dict[str, DeviceSpec] = {
    "v100": DeviceSpec(name="v100", peak_flops=125e12, memory_bytes=32e9, memory_bandwidth_bytes_per_s=900e9,
                       intra_node_bandwidth_bytes_per_s=300e9, inter_node_bandwidth_bytes_per_s=50 * _GBIT,
                       source="NVIDIA Tesla V100 datasheet (SXM2 32 GB), recalled", dtype="float16"),
    "a100-40gb": DeviceSpec(name="a100-40gb", peak_flops=312e12, memory_bytes=40e9,
                            memory_bandwidth_bytes_per_s=1555e9, intra_node_bandwidth_bytes_per_s=600e9,
                            inter_node_bandwidth_bytes_per_s=200 * _GBIT,
                            source="NVIDIA A100 datasheet (SXM 40 GB), recalled"),
    "a100-80gb": DeviceSpec(name="a100-80gb", peak_flops=312e12, memory_bytes=80e9,
                            memory_bandwidth_bytes_per_s=2039e9, intra_node_bandwidth_bytes_per_s=600e9,
                            inter_node_bandwidth_bytes_per_s=200 * _GBIT,
                            source="NVIDIA A100 datasheet (SXM 80 GB), recalled"),
    "h100": DeviceSpec(name="h100", peak_flops=989e12, memory_bytes=80e9, memory_bandwidth_bytes_per_s=3.35e12,
                       intra_node_bandwidth_bytes_per_s=900e9, inter_node_bandwidth_bytes_per_s=400 * _GBIT,
                       source="NVIDIA H100 datasheet (SXM 80 GB), recalled"),
    "h200": DeviceSpec(name="h200", peak_flops=989e12, memory_bytes=141e9, memory_bandwidth_bytes_per_s=4.8e12,
                       intra_node_bandwidth_bytes_per_s=900e9, inter_node_bandwidth_bytes_per_s=400 * _GBIT,
                       source="NVIDIA H200 datasheet (SXM 141 GB), recalled"),
}


def device_preset(name: str) -> DeviceSpec:
    """The preset called ``name`` (case-insensitive).

    Raises:
        ConfigError: an unknown name; the message lists the known ones.
    """
    return lookup(DEVICES, "device", name)


Placement = Literal["tp-in-node", "pp-in-node"]
PLACEMENTS: tuple[Placement, ...] = ("tp-in-node", "pp-in-node")


@dataclass(frozen=True)
class PlacedLinks:
    """Which link each kind of traffic takes under a placement of TP, PP and DP on nodes.

    Attributes:
        placement: ``tp-in-node`` (Megatron's: a stage's TP ranks share a node's NVLink; pipeline
            and data-parallel peers are on other nodes) or ``pp-in-node`` (a pipeline's stages
            share a node's NVLink; TP groups span nodes over the NIC).
        tensor_parallel_bytes_per_s, pipeline_bytes_per_s, data_parallel_bytes_per_s: per GPU.
        device: the device as a transformer profile sees it: its NVLink field is the TP link.
    """

    placement: Placement
    tensor_parallel_bytes_per_s: float
    pipeline_bytes_per_s: float
    data_parallel_bytes_per_s: float
    device: DeviceSpec


def placed_links(spec: DeviceSpec, placement: str, *, tp: int, pp: int | None = None) -> PlacedLinks:
    """The links of ``placement`` on nodes of ``spec.gpus_per_node`` GPUs (data parallelism always
    crosses nodes).

    Raises:
        ConfigError: an unknown placement, TP wider than a node under ``tp-in-node``, or a
            pipeline (``pp``, when known) longer than a node under ``pp-in-node``.
    """
    nvlink, nic = spec.intra_node_bandwidth_bytes_per_s, spec.inter_node_bandwidth_bytes_per_s
    per_node = spec.gpus_per_node
    if placement == "tp-in-node":
        if tp > per_node:
            raise ConfigError("tp", tp, f"must be <= the GPUs in a {spec.name} node ({per_node}) with "
                              "--placement tp-in-node; pp-in-node lets TP span nodes")
        return PlacedLinks("tp-in-node", nvlink, nic, nic, spec)
    if placement == "pp-in-node":
        if pp is not None and pp > per_node:
            raise ConfigError("pp", pp, f"must be <= the GPUs in a {spec.name} node ({per_node}) with "
                              "--placement pp-in-node")
        # TP over the NIC may be as wide as it likes: the profile's node-size check is the TP group's.
        return PlacedLinks("pp-in-node", nic, nvlink, nic,
                           replace(spec, intra_node_bandwidth_bytes_per_s=nic, gpus_per_node=max(per_node, tp)))
    raise ConfigError("placement", placement, f"must be one of {', '.join(PLACEMENTS)}")
