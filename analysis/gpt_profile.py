"""A GPT-like synthetic transformer (``pipesim.transformer_profile`` on a bare stack) and its V100 cluster.

The layers are pipesim's transformer layers (pipesim/spec/transformer.py, which cites the
formulas): 12h^2 + 13h fp16 parameters, b s h output bytes and s b h (34 + 5 a s / h) stashed
bytes (Korthikanti et al., 2022), their times from the op cost model on the shipped V100 device
file (fp16, attention unfused as the papers' runs had it: pipesim/spec/opcost.py).
Optimizer state: mixed-precision Adam, 6 x the fp16 weight bytes (OPTIMIZER_MULTIPLIER).

Embedding and language-model head are left out (``include_embeddings=False``): every layer is
identical, so stage balance is exact whenever the depth divides the number of layers. The
microbatch is one sequence of 1,024 tokens, so that per-device memory lands in the 16-32 GB range
of the GPUs the papers used, where the schedules' memory differences decide what fits.

The cluster (``v100_cluster``) is modelled on AWS p3.16xlarge servers, as PipeDream-2BW used
(recalled): 8 V100 16 GB per server joined by NVLink (50 GB/s a pair assumed), servers joined
at 25 Gbit/s; 5 us latency everywhere (assumed).
"""

from __future__ import annotations

from dataclasses import dataclass

import pipesim
# The studies pass even cuts explicitly: simulate's default balancing can leave identical layers
# unevenly split through floating-point ties (32 layers on 16 stages came out as ..., 3, 1).
from pipesim.spec.partition import even_partition as even_partition
from pipesim.spec.transformer import TransformerConfig
from pipesim.spec.transformer_profile import ADAM_STATE_MULTIPLIER

OPTIMIZER_MULTIPLIER = ADAM_STATE_MULTIPLIER
V100_MEMORY_BYTES = 16e9


@dataclass(frozen=True)
class TransformerSizes:
    """The sizes of the synthetic model (defaults: a 1.6-billion-parameter GPT-like stack)."""

    layers: int = 32
    hidden: int = 2048
    heads: int = 16
    sequence: int = 1024
    microbatch: int = 1


def gpt_profile(sizes: TransformerSizes | None = None) -> pipesim.Profile:
    """The profile of ``sizes.layers`` identical transformer layers."""
    sizes = sizes or TransformerSizes()
    config = TransformerConfig(name=f"gpt-like-h{sizes.hidden}-L{sizes.layers}", num_layers=sizes.layers,
                               hidden_size=sizes.hidden, ffn_hidden_size=4 * sizes.hidden, num_heads=sizes.heads,
                               num_kv_heads=sizes.heads, vocab_size=0, seq_len=sizes.sequence, has_bias=True)
    device = pipesim.load_device("v100").model_copy(update={"memory_bytes": V100_MEMORY_BYTES})
    return pipesim.transformer_profile(config, device=device, microbatch_size=sizes.microbatch,
                                       include_embeddings=False, attention="unfused")


def v100_cluster(num_devices: int) -> pipesim.Topology:
    """``num_devices`` V100s (16 GB), 8 a server on NVLink, servers joined at 25 Gbit/s."""
    return pipesim.Topology.hierarchical(num_devices=num_devices, devices_per_server=8, intra_bandwidth="50GB/s",
                                         inter_bandwidth="25Gbit/s", latency="5us", memory_bytes=V100_MEMORY_BYTES)

