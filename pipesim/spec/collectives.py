"""Collectives as algorithms on cluster tiers: all-reduce (ring, tree), reduce-scatter, all-gather, all-to-all, send.

A group is ``size`` GPUs ``stride`` apart in the cluster's numbering (tensor parallelism's ranks
are neighbours, stride 1; data parallelism's are a tensor-parallel group apart). Its collective
runs on the outermost tier it spans; each domain of the tier inside that one holds ``per_domain``
members, which together drive ``per_domain`` links of the outer tier (one per GPU).

Times are alpha-beta. With n ranks, bytes S (the whole buffer), per-hop latency a and bus rate
B (nccl-tests' bus bandwidth, here predicted):

- ring all-reduce: 2 (n-1) a + 2 (n-1)/n S / B;
- tree all-reduce (NCCL's double binary tree between domains, a chain inside them):
  2 (log2(domains) a_outer + (per_domain - 1) a_inner) + 2 S / B;
- reduce-scatter and all-gather (ring): (n-1) a + (n-1)/n S / B;
- all-to-all (each rank sends S/n to every rank, nccl-tests' ``alltoall`` with S the buffer a
  rank holds): (n-1) a + (n-1)/n S / B_a2a;
- send: a + S / rate of the tier between the two GPUs.

B is the outer tier's rate times the members per domain (their links side by side), capped by
what the inner tier carries: in a ring through k members of a domain each of k rings leaves
through a different member, so each member sends (k-1)/k of its traffic inside the domain:
B = min(k x outer rate, k/(k-1) x inner rate).

An all-to-all has no ring to spread over the domain's links: each rank sends (n-k)/n of its buffer
through its own link of the outer tier and (k-1)/n inside its domain, both at once, so its bus
bandwidth (nccl-tests: algbw x (n-1)/n) is B_a2a = min((n-1)/(n-k) x outer rate, (n-1)/(k-1) x
inner rate), the inner tier's rate for a group inside one domain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pipesim.spec.cluster import Cluster

Algorithm = Literal["ring", "tree", "auto"]


@dataclass(frozen=True)
class Group:
    """Where a collective's GPUs sit: ``size`` members, ``stride`` apart."""

    size: int
    stride: int = 1


@dataclass(frozen=True)
class Path:
    """A group's path on a cluster: bus rate, per-hop latencies, domains and members per domain."""

    bus_bytes_per_s: float
    outer_latency_s: float
    inner_latency_s: float
    num_domains: int
    per_domain: int
    tier_index: int


def group_path(cluster: Cluster, group: Group) -> Path:
    """The tier a group's collective runs on and what it reaches there (module docstring)."""
    span = group.stride * (group.size - 1) + 1
    index = cluster.tier_of_span(span)
    tier = cluster.tiers[index]
    if index == 0:
        return Path(tier.rate_bytes_per_s, tier.latency_s, tier.latency_s, 1, group.size, 0)
    inner = cluster.tiers[index - 1]
    domain = cluster.domain(index - 1)
    per_domain = int(max(1, min(group.size, domain // group.stride))) if group.stride < domain else 1
    bus = per_domain * tier.rate_bytes_per_s
    if per_domain > 1:
        bus = min(bus, per_domain / (per_domain - 1) * inner.rate_bytes_per_s)
    return Path(bus, tier.latency_s, inner.latency_s, max(1, math.ceil(group.size / per_domain)), per_domain, index)


def allreduce_s(cluster: Cluster, group: Group, num_bytes: float, algorithm: Algorithm = "auto") -> float:
    """Seconds of an all-reduce of ``num_bytes`` over ``group`` (0 for one GPU or no bytes)."""
    n = group.size
    if n <= 1 or num_bytes <= 0:
        return 0.0
    path = group_path(cluster, group)
    ring = 2 * (n - 1) * path.outer_latency_s + 2 * (n - 1) / n * num_bytes / path.bus_bytes_per_s
    if algorithm == "ring":
        return ring
    hops = math.ceil(math.log2(path.num_domains)) if path.num_domains > 1 else 0
    tree = 2 * (hops * path.outer_latency_s + (path.per_domain - 1) * path.inner_latency_s) \
        + 2 * num_bytes / path.bus_bytes_per_s
    return tree if algorithm == "tree" else min(ring, tree)


def reduce_scatter_s(cluster: Cluster, group: Group, num_bytes: float) -> float:
    """Seconds of a ring reduce-scatter of a ``num_bytes`` buffer over ``group`` (each keeps 1/n)."""
    n = group.size
    if n <= 1 or num_bytes <= 0:
        return 0.0
    path = group_path(cluster, group)
    return (n - 1) * path.outer_latency_s + (n - 1) / n * num_bytes / path.bus_bytes_per_s


def allgather_s(cluster: Cluster, group: Group, num_bytes: float) -> float:
    """Seconds of a ring all-gather into a ``num_bytes`` buffer over ``group`` (each brings 1/n)."""
    return reduce_scatter_s(cluster, group, num_bytes)


def all_to_all_bus_bytes_per_s(cluster: Cluster, group: Group) -> float:
    """nccl-tests' all-to-all bus bandwidth of ``group`` on ``cluster`` (module docstring)."""
    n = group.size
    index = cluster.tier_of_span(group.stride * (n - 1) + 1)
    if index == 0:
        return cluster.tiers[0].rate_bytes_per_s
    k = group_path(cluster, group).per_domain
    outer = (n - 1) / (n - k) * cluster.tiers[index].rate_bytes_per_s
    if k == 1:
        return outer
    return min(outer, (n - 1) / (k - 1) * cluster.tiers[index - 1].rate_bytes_per_s)


def all_to_all_s(cluster: Cluster, group: Group, num_bytes: float) -> float:
    """Seconds of an all-to-all of a ``num_bytes`` buffer per rank over ``group`` (each rank keeps
    1/n and sends 1/n to each other rank): (n-1) a + (n-1)/n S / B_a2a; 0 for one GPU or no bytes."""
    n = group.size
    if n <= 1 or num_bytes <= 0:
        return 0.0
    path = group_path(cluster, group)
    return (n - 1) * path.outer_latency_s + (n - 1) / n * num_bytes / all_to_all_bus_bytes_per_s(cluster, group)


def send_s(cluster: Cluster, stride: int, num_bytes: float) -> float:
    """Seconds to send ``num_bytes`` to the GPU ``stride`` places away (its tier's latency and rate)."""
    if num_bytes <= 0:
        return 0.0
    tier = cluster.tiers[cluster.tier_of_span(stride + 1)]
    return tier.latency_s + num_bytes / tier.rate_bytes_per_s


def send_tier(cluster: Cluster, stride: int) -> int:
    """The tier a send to the GPU ``stride`` places away crosses."""
    return cluster.tier_of_span(stride + 1)
