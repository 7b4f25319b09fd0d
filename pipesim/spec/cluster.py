"""Cluster: how GPUs are wired, as tiers of links, read from a cluster file (``pipesim.cluster/1``).

Tier 0 is the fastest and smallest domain (NVLink or NVSwitch inside a node of ``gpus`` GPUs),
each later tier a larger domain (a rack's NVLink switch, the cluster's InfiniBand fabric; the last
tier's ``gpus`` may be null: the whole cluster). Every number is per GPU and per direction: a tier's
``bandwidth_bytes_per_s`` is what one GPU can send on it while it also receives as much, and
``bus_efficiency`` the share of it a large collective reaches (the bus bandwidth nccl-tests
reports over the link's rate). Every GPU has its own link on every tier (rail-optimized
nodes, as the DGX and HGX systems are built). The shipped files live in
``pipesim/data/clusters/``; ``--cluster FILE`` reads a user's, and ``cluster_from_flags`` builds a
two-tier one from ``--gpus-per-node``, ``--intra-node-bandwidth``, ``--inter-node-bandwidth`` and
``--inter-node-latency``.
"""

from __future__ import annotations


from pydantic import Field, model_validator

from pipesim.errors import ConfigError
from pipesim.spec.shipped import shipped_names, shipped_text
from pipesim.spec.validation import Float, FrozenModel, Int

CLUSTER_SCHEMA = "pipesim.cluster/1"


class Tier(FrozenModel):
    """One level of links.

    Attributes:
        name: e.g. ``"nvlink"``, ``"infiniband"``.
        gpus: GPUs in one domain of this tier (a node's 8); None on the last tier: every GPU.
        bandwidth_bytes_per_s: per GPU, per direction.
        latency_s: one message's fixed cost on this tier (the alpha of alpha-beta), seconds.
        bus_efficiency: share of the bandwidth a large ring collective reaches.
        compute_share: share of the GPU's compute a collective on this tier takes while it runs
            beside compute (the SMs the communication kernels occupy).
    """

    name: str = Field(min_length=1)
    gpus: Int | None = Field(default=None, gt=0)
    bandwidth_bytes_per_s: Float = Field(gt=0)
    latency_s: Float = Field(ge=0)
    bus_efficiency: Float = Field(default=1.0, gt=0, le=1)
    compute_share: Float = Field(default=0.0, ge=0, lt=1)

    @property
    def rate_bytes_per_s(self) -> float:
        """What a large transfer reaches on this tier: bandwidth x bus efficiency."""
        return self.bandwidth_bytes_per_s * self.bus_efficiency


class Cluster(FrozenModel):
    """Tiers of links, innermost first.

    Attributes:
        schema_: ``"pipesim.cluster/1"`` (``"schema"`` in JSON).
        name, description: a key and the machine it describes.
        tiers: innermost first; each domain's GPU count a multiple of the one before it.
        sources: where each number comes from.
    """

    schema_: str = Field(default=CLUSTER_SCHEMA, alias="schema")
    name: str = Field(min_length=1)
    description: str = ""
    tiers: tuple[Tier, ...] = Field(min_length=1)
    sources: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _nested(self) -> Cluster:
        if self.schema_ != CLUSTER_SCHEMA:
            raise ConfigError("schema", self.schema_, f"must be {CLUSTER_SCHEMA!r}")
        previous = 1
        for index, tier in enumerate(self.tiers):
            if tier.gpus is None:
                if index != len(self.tiers) - 1:
                    raise ConfigError(f"tiers[{index}].gpus", None, "may be null on the last tier only")
                continue
            if tier.gpus % previous:
                raise ConfigError(f"tiers[{index}].gpus", tier.gpus, f"must be a multiple of the tier "
                                  f"inside it ({previous})")
            previous = tier.gpus
        return self

    @property
    def gpus_per_node(self) -> int:
        """GPUs in one domain of the innermost tier."""
        return self.tiers[0].gpus or 1

    def domain(self, index: int) -> float:
        """GPUs in one domain of tier ``index`` (infinite for the last tier's null)."""
        gpus = self.tiers[index].gpus
        return float("inf") if gpus is None else float(gpus)

    def tier_of_span(self, span: int) -> int:
        """The innermost tier whose domain holds ``span`` consecutive GPUs."""
        for index in range(len(self.tiers)):
            if span <= self.domain(index):
                return index
        return len(self.tiers) - 1


def cluster_from_flags(*, gpus_per_node: int, intra_node_bandwidth_bytes_per_s: float,
                       inter_node_bandwidth_bytes_per_s: float, inter_node_latency_s: float,
                       intra_node_latency_s: float = 0.0, base: Cluster | None = None) -> Cluster:
    """A two-tier cluster from the common flags; efficiencies and shares from ``base``'s tiers where given."""
    inner = base.tiers[0] if base is not None else None
    outer = base.tiers[-1] if base is not None and len(base.tiers) > 1 else None
    tiers = (
        Tier(name="intra-node", gpus=gpus_per_node, bandwidth_bytes_per_s=intra_node_bandwidth_bytes_per_s,
             latency_s=intra_node_latency_s if inner is None else inner.latency_s,
             bus_efficiency=1.0 if inner is None else inner.bus_efficiency,
             compute_share=0.0 if inner is None else inner.compute_share),
        Tier(name="inter-node", gpus=None, bandwidth_bytes_per_s=inter_node_bandwidth_bytes_per_s,
             latency_s=inter_node_latency_s, bus_efficiency=1.0 if outer is None else outer.bus_efficiency,
             compute_share=0.0 if outer is None else outer.compute_share),
    )
    return Cluster(name="flags", description="from --gpus-per-node and the link flags", tiers=tiers)


def shipped_clusters() -> tuple[str, ...]:
    """The names of the cluster files shipped in the package."""
    return shipped_names("clusters")


def load_cluster(name_or_path: str) -> Cluster:
    """A shipped cluster by name (case-insensitive), or a cluster file by path.

    Raises:
        ConfigError: neither a shipped name nor a readable, valid cluster file.
    """
    from pipesim.spec.files import load_cluster_file  # noqa: PLC0415 - files imports this module

    shipped = shipped_text("clusters", name_or_path)
    if shipped is not None:
        return load_cluster_file(text=shipped[0], source=shipped[1])
    if name_or_path.strip().lower().endswith(".json") or "/" in name_or_path:
        return load_cluster_file(path=name_or_path)
    raise ConfigError("cluster", name_or_path, f"must be a cluster file or one of {', '.join(shipped_clusters())}")
