"""A GPT-like synthetic transformer profile from stated sizes and standard formulas, and its V100 cluster.

Per transformer layer, with hidden size h, sequence length s, microbatch b, a heads, fp16:

- forward flops      = 24 b s h^2 + 4 b s^2 h   (the four h x h projections, the two 4h MLP
                       matmuls, and attention scores and values; the forward third of the
                       72 b s h^2 (1 + s / 6h) per layer of Narayanan et al., SC'21, recalled)
- backward flops     = 2 x forward flops
- time               = flops / device_flops (an assumed sustained rate, not a peak)
- parameters         = 12 h^2 + 13 h  -> x 2 bytes (fp16 weights)
- activation sent    = b s h x 2 bytes (the layer output, also its gradient on the way back)
- activation stashed = s b h (34 + 5 a s / h) bytes (Korthikanti et al., 2022, recalled: no
                       tensor or sequence parallelism, no recomputation)
- optimizer state    = mixed-precision Adam: fp32 master weights, momentum and variance,
                       12 bytes per parameter = 6 x the fp16 weight bytes (OPTIMIZER_MULTIPLIER);
                       gradients are fp16, one weight's worth (the engine's gradient buffer).

Embedding and language-model head are left out: every layer is identical, so stage balance
is exact whenever the depth divides the number of layers. The microbatch is one sequence of
1,024 tokens, so that per-device memory lands in the 16-32 GB range of the GPUs the papers used,
where the schedules' memory differences decide what fits.

The cluster (``v100_cluster``) is modelled on AWS p3.16xlarge servers, as PipeDream-2BW used
(recalled): 8 V100 16 GB per server joined by NVLink (50 GB/s a pair assumed), servers joined
at 25 Gbit/s; 5 us latency everywhere (assumed).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import pipesim
# The studies pass even cuts explicitly: simulate's default balancing can leave identical layers
# unevenly split through floating-point ties (32 layers on 16 stages came out as ..., 3, 1).
from pipesim.spec.partition import even_partition as even_partition

OPTIMIZER_MULTIPLIER = 6.0
V100_MEMORY_BYTES = 16e9


@dataclass(frozen=True)
class TransformerSizes:
    """The sizes of the synthetic model (defaults: a 1.6-billion-parameter GPT-like stack)."""

    layers: int = 32
    hidden: int = 2048
    heads: int = 16
    sequence: int = 1024
    microbatch: int = 1
    bytes_per_element: int = 2
    device_flops: float = 40e12  # sustained fp16 rate assumed for a V100 (peak 125e12)


def layer_costs(sizes: TransformerSizes) -> dict[str, float]:
    """One layer's forward flops, times (s) and sizes (bytes) per microbatch."""
    h, s, b, a = sizes.hidden, sizes.sequence, sizes.microbatch, sizes.heads
    forward_flops = 24 * b * s * h**2 + 4 * b * s**2 * h
    return {
        "forward_flops": float(forward_flops),
        "forward_s": forward_flops / sizes.device_flops,
        "backward_s": 2 * forward_flops / sizes.device_flops,
        "param_bytes": float((12 * h**2 + 13 * h) * sizes.bytes_per_element),
        "activation_bytes": float(b * s * h * sizes.bytes_per_element),
        "stash_bytes": float(s * b * h * (34 + 5 * a * s / h)),
    }


def gpt_profile(sizes: TransformerSizes | None = None) -> pipesim.Profile:
    """The profile of ``sizes.layers`` identical transformer layers."""
    sizes = sizes or TransformerSizes()
    costs = layer_costs(sizes)
    profile = pipesim.uniform_profile(
        num_layers=sizes.layers,
        forward_s=costs["forward_s"],
        backward_s=costs["backward_s"],
        activation_bytes=costs["activation_bytes"],
        param_bytes=costs["param_bytes"],
        stash_bytes=costs["stash_bytes"],
        microbatch_size=sizes.microbatch,
        name=f"gpt-like-h{sizes.hidden}-L{sizes.layers}",
    )
    return profile.model_copy(update={"dtype": "float16", "device": f"synthetic, {sizes.device_flops / 1e12:g} TFLOP/s",
                                      "source": f"analysis/gpt_profile.py {asdict(sizes)}"})


def v100_cluster(num_devices: int) -> pipesim.Topology:
    """``num_devices`` V100s (16 GB), 8 a server on NVLink, servers joined at 25 Gbit/s."""
    return pipesim.Topology.hierarchical(num_devices=num_devices, devices_per_server=8, intra_bandwidth="50GB/s",
                                         inter_bandwidth="25Gbit/s", latency="5us", memory_bytes=V100_MEMORY_BYTES)


if __name__ == "__main__":
    for key, value in layer_costs(TransformerSizes()).items():
        print(f"{key:18s} {value:.6g}")
