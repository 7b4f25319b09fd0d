"""A model's pipeline hops, each on the tier between its two ranks' GPUs (the cost-model issue: PP's
sends on the tier between the two stages' GPUs)."""

from __future__ import annotations

import pytest

from pipesim.spec.layout import Parallelism
from pipesim.spec.transformer_profile import (
    pipeline_bandwidth_bytes_per_s,
    pipeline_hop_tiers,
    pipeline_latency_s,
    pipeline_topology,
)
from tests.support.cost_fixtures import two_nodes

NVLINK, IB = 0, 1
# two_nodes(): a send runs at 300 GB/s x 0.8 inside a node (1 us) and 25 GB/s x 0.9 between (5 us).
NVLINK_RATE, IB_RATE = 240e9, 22.5e9


@pytest.mark.parametrize(("layout", "tiers"), [
    # One GPU a stage, 16 stages on two nodes of 8 (either placement: the ranks are GPUs 0 to 15): the
    # hop 7 -> 8 leaves node 0, and so does the wrap 15 -> 0; the other 14 stay on NVLink.
    (Parallelism(tp=1, pp=16), (NVLINK,) * 7 + (IB,) + (NVLINK,) * 7 + (IB,)),
    (Parallelism(tp=1, pp=16, placement="pp-in-node"), (NVLINK,) * 7 + (IB,) + (NVLINK,) * 7 + (IB,)),
    # TP 2 x DP 2 a rank (GPUs 4r .. 4r + 3): ranks 0, 1 on node 0, ranks 2, 3 on node 1.
    (Parallelism(tp=2, pp=4, dp=2), (NVLINK, IB, NVLINK, IB)),
    # TP 4 a rank: GPUs 0-3, 4-7, 8-11; a pipeline of 3 crosses once, and again on its wrap.
    (Parallelism(tp=4, pp=3), (NVLINK, IB, IB)),
    # TP 8: every rank a node of its own.
    (Parallelism(tp=8, pp=4), (IB,) * 4),
    # The whole pipeline in one node.
    (Parallelism(tp=2, pp=4), (NVLINK,) * 4),
    # PP innermost, TP 2 eight GPUs apart: pipeline rank r of TP rank t is GPU 8 t + r, all in node t.
    (Parallelism(tp=2, pp=8, placement="pp-in-node"), (NVLINK,) * 8),
    # PP innermost with 4 ranks and TP 4 (GPU 4 t + r): both pipelines of TP ranks 0, 1 stay in node 0.
    (Parallelism(tp=4, pp=4, placement="pp-in-node"), (NVLINK,) * 4),
    (Parallelism(tp=1, pp=1), ()),
])
def test_each_hop_crosses_the_tier_between_its_two_ranks_gpus(layout: Parallelism, tiers: tuple[int, ...]) -> None:
    assert pipeline_hop_tiers(two_nodes(), layout) == tiers


def test_the_hops_inside_a_node_get_links_of_their_own_the_rest_the_network() -> None:
    topology = pipeline_topology(two_nodes(), Parallelism(tp=1, pp=16), memory_bytes=80e9)
    assert (topology.bandwidth_bytes_per_s, topology.latency_s) == pytest.approx((IB_RATE, 5e-6))
    assert [(link.src, link.dst) for link in topology.links] == [(r, r + 1) for r in range(16 - 1) if r != 7]
    for src, dst in ((0, 1), (1, 0), (6, 7), (8, 9), (14, 15)):
        assert topology.link_cost(src, dst) == pytest.approx((1e-6, NVLINK_RATE))
    for src, dst in ((7, 8), (8, 7), (15, 0), (0, 15)):
        assert topology.link_cost(src, dst) == pytest.approx((5e-6, IB_RATE))
    assert {device.memory_bytes for device in topology.devices} == {80e9}
    # A lower bound on the step may take the fastest hop for every hop.
    layout = Parallelism(tp=1, pp=16)
    assert pipeline_bandwidth_bytes_per_s(two_nodes(), layout) == pytest.approx(NVLINK_RATE)
    assert pipeline_latency_s(two_nodes(), layout) == pytest.approx(1e-6)


def test_a_pipeline_on_one_tier_is_one_link_for_all_as_before() -> None:
    # With TP and no sequence parallelism the 1/t shares are all-gathered over NVLink's 240 GB/s bus on arrival.
    for layout, rate in ((Parallelism(tp=8, pp=4), 1 / (1 / IB_RATE + 7 / 240e9)),
                         (Parallelism(tp=2, pp=4), 1 / (1 / NVLINK_RATE + 1 / 240e9))):
        topology = pipeline_topology(two_nodes(), layout, memory_bytes=1e9)
        assert topology.links == () and topology.bandwidth_bytes_per_s == pytest.approx(rate, rel=1e-12)
