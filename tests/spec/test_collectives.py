"""Collectives on a cluster's tiers against the nccl-tests bandwidth formulas and alpha-beta arithmetic."""

from __future__ import annotations

import pytest

from pipesim.errors import ConfigError
from pipesim.spec.cluster import Cluster, Tier, cluster_from_flags, load_cluster, shipped_clusters
from pipesim.spec.collectives import (
    Group,
    all_to_all_bus_bytes_per_s,
    all_to_all_s,
    allgather_s,
    allreduce_s,
    group_path,
    reduce_scatter_s,
    send_s,
)
from pipesim.spec.validation import build

GB = 1e9


def two_tier(latency: float = 0.0) -> Cluster:
    """8 GPUs a node at 300 GB/s (0.8 of it in collectives), a 25 GB/s NIC per GPU (0.9)."""
    return Cluster(name="test", tiers=(
        Tier(name="nvlink", gpus=8, bandwidth_bytes_per_s=300 * GB, latency_s=latency / 5, bus_efficiency=0.8),
        Tier(name="ib", gpus=None, bandwidth_bytes_per_s=25 * GB, latency_s=latency, bus_efficiency=0.9)))


def busbw_allreduce(seconds: float, num_bytes: float, n: int) -> float:
    """nccl-tests: algbw = S / t, all-reduce busbw = algbw x 2 (n - 1) / n."""
    return num_bytes / seconds * 2 * (n - 1) / n


def busbw_gather(seconds: float, num_bytes: float, n: int) -> float:
    """nccl-tests: all-gather and reduce-scatter busbw = algbw x (n - 1) / n."""
    return num_bytes / seconds * (n - 1) / n


def test_inside_a_node_the_bus_bandwidth_is_the_links_collective_rate() -> None:
    cluster, size = two_tier(), 1 * GB
    seconds = allreduce_s(cluster, Group(8), size, "ring")
    assert seconds == pytest.approx(2 * 7 / 8 * size / (300 * GB * 0.8))
    assert busbw_allreduce(seconds, size, 8) == pytest.approx(240 * GB)
    assert busbw_gather(reduce_scatter_s(cluster, Group(8), size), size, 8) == pytest.approx(240 * GB)
    assert busbw_gather(allgather_s(cluster, Group(4), size), size, 4) == pytest.approx(240 * GB)


def test_across_nodes_a_group_drives_one_nic_per_member_in_a_node() -> None:
    cluster, size = two_tier(), 1 * GB
    # Data parallelism over 32 GPUs with TP = 8: one member a node, one NIC: 25 x 0.9 = 22.5 GB/s.
    one = allreduce_s(cluster, Group(32, stride=8), size, "ring")
    assert busbw_allreduce(one, size, 32) == pytest.approx(22.5 * GB)
    # TP = 2: four members a node drive four NICs: 90 GB/s.
    four = allreduce_s(cluster, Group(32, stride=2), size, "ring")
    assert busbw_allreduce(four, size, 32) == pytest.approx(4 * 22.5 * GB)
    # TP = 1: eight NICs (180 GB/s), under NVLink's share: 8/7 x 240 = 274 GB/s.
    eight = allreduce_s(cluster, Group(32), size, "ring")
    assert busbw_allreduce(eight, size, 32) == pytest.approx(8 * 22.5 * GB)
    assert group_path(cluster, Group(32)).per_domain == 8 and group_path(cluster, Group(32)).num_domains == 4


def test_eight_fast_nics_are_capped_by_what_nvlink_carries_inside_the_node() -> None:
    cluster = Cluster(name="fat", tiers=(Tier(name="nvlink", gpus=8, bandwidth_bytes_per_s=100 * GB, latency_s=0),
                                         Tier(name="ib", gpus=None, bandwidth_bytes_per_s=50 * GB, latency_s=0)))
    # Each member sends 7/8 of its traffic inside the node: min(8 x 50, 8/7 x 100) = 114.3 GB/s.
    assert group_path(cluster, Group(16)).bus_bytes_per_s == pytest.approx(8 / 7 * 100 * GB)


def test_latency_terms_are_alpha_per_ring_step_and_per_tree_level() -> None:
    alpha = 5e-6
    cluster, size = two_tier(alpha), 1e3  # a small message: latency decides
    n = 64
    ring = 2 * (n - 1) * alpha + 2 * (n - 1) / n * size / (22.5 * GB)
    # one member per node: 64 domains, a tree of 6 levels up and down, no chain inside a node
    tree = 2 * 6 * alpha + 2 * size / (22.5 * GB)
    assert allreduce_s(cluster, Group(n, stride=8), size, "ring") == pytest.approx(ring)
    assert allreduce_s(cluster, Group(n, stride=8), size, "tree") == pytest.approx(tree)
    assert allreduce_s(cluster, Group(n, stride=8), size) == pytest.approx(min(ring, tree))
    # a large message: the ring's 2 (n-1)/n S beats the tree's 2 S
    big = 1e9
    assert allreduce_s(cluster, Group(n, stride=8), big) == allreduce_s(cluster, Group(n, stride=8), big, "ring")


def test_a_send_takes_its_tiers_latency_and_rate() -> None:
    cluster = two_tier(4e-6)
    assert send_s(cluster, 1, 1 * GB) == pytest.approx(0.8e-6 + 1 * GB / (240 * GB))  # inside a node
    assert send_s(cluster, 8, 1 * GB) == pytest.approx(4e-6 + 1 * GB / (22.5 * GB))  # the next node
    assert allreduce_s(cluster, Group(1), GB) == 0.0 and send_s(cluster, 8, 0) == 0.0


def test_flags_build_a_two_tier_cluster_keeping_the_bases_efficiencies() -> None:
    base = load_cluster("dgx-h100")
    flags = cluster_from_flags(gpus_per_node=4, intra_node_bandwidth_bytes_per_s=100 * GB,
                               inter_node_bandwidth_bytes_per_s=12.5 * GB, inter_node_latency_s=2e-6, base=base)
    assert [tier.gpus for tier in flags.tiers] == [4, None]
    assert flags.tiers[1].rate_bytes_per_s == pytest.approx(12.5 * GB * base.tiers[1].bus_efficiency)


def test_a_tier_must_nest_in_the_next() -> None:
    tier = {"bandwidth_bytes_per_s": 1, "latency_s": 0}
    with pytest.raises(ConfigError, match=r"tiers\[1\]\.gpus=12: must be a multiple of the tier inside it \(8\)"):
        build(Cluster, {"name": "bad", "tiers": [{"name": "a", "gpus": 8, **tier}, {"name": "b", "gpus": 12, **tier}]})


@pytest.mark.parametrize("name", shipped_clusters())
def test_every_shipped_cluster_number_names_its_source(name: str) -> None:
    cluster = load_cluster(name)
    for index in range(len(cluster.tiers)):
        for field in ("bandwidth_bytes_per_s", "bus_efficiency"):
            assert f"tiers[{index}].{field}" in cluster.sources
    assert {"latency_s", "compute_share", "tiers[0].gpus"} <= set(cluster.sources)


def busbw_alltoall(seconds: float, num_bytes: float, n: int) -> float:
    """nccl-tests: all-to-all busbw = algbw x (n - 1) / n, with S the buffer each rank sends from."""
    return num_bytes / seconds * (n - 1) / n


def test_an_all_to_all_inside_a_node_runs_at_the_links_collective_rate() -> None:
    cluster, size = two_tier(), 1 * GB
    seconds = all_to_all_s(cluster, Group(8), size)
    assert seconds == pytest.approx(7 / 8 * size / (240 * GB))
    assert busbw_alltoall(seconds, size, 8) == pytest.approx(240 * GB)
    assert all_to_all_s(cluster, Group(1), size) == 0.0 and all_to_all_s(cluster, Group(8), 0) == 0.0


def test_an_all_to_all_across_nodes_sends_its_remote_share_through_each_members_own_nic() -> None:
    cluster, size = two_tier(latency=5e-6), 1 * GB
    # EP 4 with TP 4: members 4 apart, two a node. Each sends 2/4 of its buffer over its NIC (22.5 GB/s) and
    # 1/4 inside the node: t = max(2/4 S / 22.5, 1/4 S / 240) = S / 45 GB/s, plus 3 hops of 5 us;
    # busbw = 3/4 S / (S / 45) = 33.75 GB/s = (n-1)/(n-k) x 22.5.
    seconds = all_to_all_s(cluster, Group(4, stride=4), size)
    assert seconds == pytest.approx(3 * 5e-6 + size / (45 * GB))
    assert all_to_all_bus_bytes_per_s(cluster, Group(4, stride=4)) == pytest.approx(33.75 * GB)
    # EP 16, one member a node: every byte but its own 1/16 crosses the NIC: busbw is the NIC's 22.5 GB/s.
    assert all_to_all_bus_bytes_per_s(cluster, Group(16, stride=8)) == pytest.approx(22.5 * GB)
    # EP 16 over two full nodes: 8/16 leaves through the NIC, 7/16 over NVLink: the NIC decides,
    # busbw = 15/8 x 22.5 = 42.2 GB/s.
    assert all_to_all_bus_bytes_per_s(cluster, Group(16)) == pytest.approx(15 / 8 * 22.5 * GB)
