"""Shared NICs: flows crossing one NIC split its bandwidth (DES only), and engines that cannot, refuse."""

from __future__ import annotations

import math

import pytest
import simpy
from hypothesis import given
from hypothesis import strategies as st

from pipesim import Topology, simulate, uniform_profile
from pipesim.engine.network import Network
from pipesim.errors import ConfigError
from pipesim.spec.topology import Level


def finish_times(capacity: dict[str, float], flows: list[tuple[float, float, float, tuple[str, ...]]]) -> list[float]:
    """Run flows (start_s, bytes, latency_s, nics) through a Network; return their end times."""
    env = simpy.Environment()
    network = Network(env, capacity)
    ends = [0.0] * len(flows)

    def one(index: int, start: float, num_bytes: float, latency: float, nics: tuple[str, ...]):  # type: ignore[no-untyped-def]
        yield env.timeout(start)
        yield env.process(network.transfer(num_bytes, latency, nics))
        ends[index] = env.now

    for index, flow in enumerate(flows):
        env.process(one(index, *flow))
    env.run()
    return ends


def test_flows_on_one_nic_share_it_and_the_survivor_speeds_up() -> None:
    # 1 B/s NIC: 1 B and 3 B together move at 0.5 B/s; the first ends at 2 s, the second then
    # has 2 B left at full speed and ends at 4 s.
    assert finish_times({"nic": 1.0}, [(0, 1.0, 0, ("nic",)), (0, 3.0, 0, ("nic",))]) == [2.0, 4.0]


def test_alone_a_flow_takes_latency_plus_bytes_over_bandwidth() -> None:
    assert finish_times({"a": 4.0, "b": 4.0}, [(1.0, 8.0, 0.5, ("a", "b"))]) == [3.5]


def test_rates_are_max_min_fair_across_nics() -> None:
    # x (1 B/s) carries A and B, y (2 B/s) carries B and C: A, B get 0.5, C the 1.5 left on y.
    ends = finish_times({"x": 1.0, "y": 2.0}, [(0, 0.5, 0, ("x",)), (0, 0.5, 0, ("x", "y")), (0, 1.5, 0, ("y",))])
    assert ends == pytest.approx([1.0, 1.0, 1.0])


def test_a_late_flow_slows_an_early_one() -> None:
    # 2 B at 1 B/s from 0; a second 2 B flow joins at 1 s: both at 0.5 B/s, first ends at 3 s.
    assert finish_times({"n": 1.0}, [(0, 2.0, 0, ("n",)), (1.0, 2.0, 0, ("n",))]) == pytest.approx([3.0, 4.0])


def test_shared_nics_of_a_hierarchy_name_the_groups_below() -> None:
    topology = Topology.model_validate({
        "devices": [{"name": f"gpu{i}"} for i in range(8)],
        "levels": [{"group_size": 4, "bandwidth_bytes_per_s": 1e11},
                   {"group_size": 8, "bandwidth_bytes_per_s": 1e9, "shared": True}],
    })
    assert topology.has_contention
    assert topology.shared_nics(0, 1) is None  # inside a server: dedicated
    assert topology.shared_nics(1, 5) == ("out:1:0", "in:1:1")
    assert topology.shared_nics(6, 2) == ("out:1:1", "in:1:0")
    assert Topology.uniform(num_devices=2).shared_nics(0, 1) is None
    assert Level(group_size=2, bandwidth_bytes_per_s=1.0).shared is False


def shared(num_devices: int, *, shared_nics: bool) -> Topology:
    data = Topology.uniform(num_devices=num_devices, bandwidth="1GB/s", latency="5us").model_dump(by_alias=True)
    data["shared"] = shared_nics
    return Topology.model_validate(data)


def test_contention_needs_the_des_engine() -> None:
    profile = uniform_profile(num_layers=4, forward_s=1e-3, backward_s=2e-3, activation_bytes=4e6)
    args = {"schedule": "1f1b", "num_stages": 4, "num_microbatches": 8}
    with pytest.raises(ConfigError, match="engine='analytic': the topology shares links"):
        simulate(profile, shared(4, shared_nics=True), engine="analytic", **args)  # type: ignore[arg-type]
    result = simulate(profile, shared(4, shared_nics=True), engine="auto", **args)  # type: ignore[arg-type]
    assert result.metrics.engine == "des"


def test_shared_nics_slow_overlapping_sends_and_leave_lone_ones_alone() -> None:
    profile = uniform_profile(num_layers=4, forward_s=1e-3, backward_s=2e-3, activation_bytes=4e6)
    args = {"schedule": "1f1b", "num_stages": 4, "num_microbatches": 8}
    dedicated = simulate(profile, shared(4, shared_nics=False), **args).metrics  # type: ignore[arg-type]
    contended = simulate(profile, shared(4, shared_nics=True), **args).metrics  # type: ignore[arg-type]
    # In steady state a middle device sends an activation down and a gradient up at once.
    assert contended.makespan_s > dedicated.makespan_s * 1.01
    lone = {"schedule": "gpipe", "num_stages": 2, "num_microbatches": 1}
    a = simulate(profile, shared(2, shared_nics=False), **lone).metrics  # type: ignore[arg-type]
    b = simulate(profile, shared(2, shared_nics=True), **lone).metrics  # type: ignore[arg-type]
    assert math.isclose(a.makespan_s, b.makespan_s, rel_tol=1e-12)


def reference_rates(capacity: dict[str, float], nics_of_flows: list[tuple[str, ...]]) -> list[float]:
    """Max-min fair rates by progressive filling, recounting every NIC's unfixed flows each round."""
    left = {nic: capacity[nic] for nics in nics_of_flows for nic in nics}
    rates = [0.0] * len(nics_of_flows)
    unfixed = list(range(len(nics_of_flows)))
    while unfixed:
        best_nic, best_share = "", math.inf
        for nic in sorted(left):
            count = sum(1 for i in unfixed if nic in nics_of_flows[i])
            if count and left[nic] / count < best_share:
                best_nic, best_share = nic, left[nic] / count
        for i in [i for i in unfixed if best_nic in nics_of_flows[i]]:
            rates[i] = best_share
            unfixed.remove(i)
            for nic in nics_of_flows[i]:
                left[nic] -= best_share
    return rates


NIC_NAMES = ("a", "b", "c", "d")


@given(st.dictionaries(st.sampled_from(NIC_NAMES), st.floats(0.5, 100.0), min_size=len(NIC_NAMES)),
       st.lists(st.lists(st.sampled_from(NIC_NAMES), min_size=1, max_size=2, unique=True).map(tuple),
                min_size=1, max_size=12))
def test_fair_rates_are_those_of_plain_progressive_filling(capacity: dict[str, float],
                                                           nics_of_flows: list[tuple[str, ...]]) -> None:
    env = simpy.Environment()
    network = Network(env, capacity)
    for nics in nics_of_flows:
        env.process(network.transfer(1.0, 0.0, nics))
    while env.peek() == 0:  # start every flow; none finishes at time 0
        env.step()
    assert [flow.rate for flow in network.flows] == reference_rates(capacity, nics_of_flows)
    for nic in set(capacity):
        assert sum(flow.rate for flow in network.flows if nic in flow.nics) <= capacity[nic] * (1 + 1e-12)
