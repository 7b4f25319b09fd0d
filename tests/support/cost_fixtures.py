"""A device and a two-node cluster with round numbers, for the cost model's hand-computed tests."""

from __future__ import annotations

from pipesim.spec.cluster import Cluster, Tier
from pipesim.spec.device import Device

GB = 1e9


def round_device() -> Device:
    """100 TFLOP/s, one 100 x 100 tile at half of peak, 1 TB/s (0.8 of it), 1 us a launch; fused
    attention at 0.6 (forward) and 0.4 (backward) of peak at any sequence and head size."""
    return Device.model_validate({
        "name": "toy", "memory_bytes": 80e9, "peak_flops": {"bf16": 100e12}, "vector_flops": 10e12,
        "memory_bandwidth_bytes_per_s": 1e12, "num_sms": 10, "launch_s": 1e-6, "sustained_share": 1.0,
        "matmul": {"max_efficiency": 0.5, "k_overhead": 50, "tiles": [{"m": 100, "n": 100, "efficiency": 1.0}]},
        "memory": {"max_efficiency": 0.8, "half_bytes": 0},
        "attention": {"forward_max_efficiency": 0.6, "backward_max_efficiency": 0.4, "forward_seq_half": 0,
                      "backward_seq_half": 0, "head_dim_half": 0},
    })


def two_nodes(compute_share: float = 0.0) -> Cluster:
    """Two nodes of 8 GPUs: NVLink at 300 GB/s a GPU (0.8 of it in collectives, 1 us a hop),
    InfiniBand at 25 GB/s a GPU (0.9 of it, 5 us a hop)."""
    return Cluster(name="two-nodes", tiers=(
        Tier(name="nvlink", gpus=8, bandwidth_bytes_per_s=300 * GB, latency_s=1e-6, bus_efficiency=0.8,
             compute_share=compute_share),
        Tier(name="ib", gpus=None, bandwidth_bytes_per_s=25 * GB, latency_s=5e-6, bus_efficiency=0.9,
             compute_share=compute_share)))


def ideal_device() -> Device:
    """round_device with every product at exactly 2 m n k FLOPs over the peak (1 x 1 tiles on one SM,
    no k overhead), memory and launches free; fused attention still at 0.6 and 0.4 of the peak."""
    return Device.model_validate({**round_device().model_dump(by_alias=True), "num_sms": 1, "launch_s": 0.0,
                                  "memory_bandwidth_bytes_per_s": 1e30,
                                  "matmul": {"max_efficiency": 1.0, "k_overhead": 0,
                                             "tiles": [{"m": 1, "n": 1, "efficiency": 1.0}]}})


def free_links() -> Cluster:
    """Two tiers of 8 GPUs a node whose collectives and sends take no time (1e30 B/s, no latency)."""
    return Cluster(name="free", tiers=(Tier(name="nvlink", gpus=8, bandwidth_bytes_per_s=1e30, latency_s=0.0),
                                       Tier(name="ib", gpus=None, bandwidth_bytes_per_s=1e30, latency_s=0.0)))
