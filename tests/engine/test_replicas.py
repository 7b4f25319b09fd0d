"""Replicated stages in the engine: all-reduce only (default), or PipeDream's round-robin replicas."""

from __future__ import annotations

import pytest

from pipesim.simulation import make_plan, simulate_plan
from pipesim.spec.profile import uniform_profile
from pipesim.spec.stages import stage_costs
from pipesim.spec.topology import Topology

PROFILE = uniform_profile(num_layers=4, forward_s=1.0, backward_s=2.0, activation_bytes=0.0, param_bytes=100.0)
TOPOLOGY = Topology.hierarchical(num_devices=8, devices_per_server=4, intra_bandwidth=100.0, inter_bandwidth=10.0)


@pytest.mark.parametrize(("schedule", "per_update"), [("1f1b", 1), ("2bw", 1), ("pipedream", 3)])
def test_a_replicated_stage_is_r_times_as_fast_and_all_reduces_over_its_ring(schedule: str, per_update: int) -> None:
    # Stage 0: 3 replicas on devices 0..2 (one server); stage 1: 3 replicas on devices 3..5 (two servers).
    plan = make_plan(PROFILE, schedule=schedule, num_stages=3, num_microbatches=6, partition=((0, 2), (2, 3), (3, 4)),
                     replicas=(3, 3, 1), placement=(0, 3, 6), replica_model="round-robin")
    costs = stage_costs(PROFILE, plan, TOPOLOGY)
    assert costs.forward_s == pytest.approx((2 / 3, 1 / 3, 1.0))
    assert costs.backward_s == pytest.approx((4 / 3, 2 / 3, 2.0))
    ring = 2 * 2 / 3
    assert costs.update_s == pytest.approx((ring * 200 / 100 / per_update, ring * 100 / 10 / per_update, 0.0))


def test_a_stage_replicated_r_times_keeps_up_with_r_times_the_work() -> None:
    """Stage 0 has 3x the layers of stage 1 on 3 replicas: with free links the pipeline is balanced."""
    profile = uniform_profile(num_layers=4, forward_s=1.0, backward_s=2.0)
    plan = make_plan(profile, schedule="1f1b", num_stages=2, num_microbatches=8, partition=((0, 3), (3, 4)),
                     replicas=(3, 1), placement=(0, 3), replica_model="round-robin")
    result = simulate_plan(profile, Topology.uniform(num_devices=4), plan)
    assert result.metrics.iteration_time_s == pytest.approx((8 + 2 - 1) * 3.0)
    assert [stage.utilization for stage in result.metrics.stages] == pytest.approx([8 / 9, 8 / 9])


def test_simulate_without_a_topology_gives_each_round_robin_replica_a_device() -> None:
    from pipesim import simulate

    profile = uniform_profile(num_layers=4, forward_s=1.0, backward_s=2.0)
    options = {"schedule": "1f1b", "num_stages": 2, "num_microbatches": 8, "partition": ((0, 3), (3, 4)),
               "replicas": (3, 1), "placement": (0, 3), "replica_model": "round-robin"}
    result = simulate(profile, **options)
    assert result.metrics.iteration_time_s == simulate(profile, Topology.uniform(num_devices=4),
                                                       **options).metrics.iteration_time_s


def test_a_ring_past_the_last_device_uses_the_default_bandwidth() -> None:
    plan = make_plan(PROFILE, schedule="1f1b", num_stages=2, num_microbatches=2, replicas=(1, 2),
                     replica_model="round-robin")
    costs = stage_costs(PROFILE, plan, Topology.uniform(num_devices=2, bandwidth=50.0))
    assert costs.update_s == pytest.approx((0.0, 2 * 1 / 2 * 200 / 50))


@pytest.mark.parametrize("schedule", ["1f1b", "pipedream"])
def test_by_default_replicas_only_add_the_all_reduce_at_the_default_bandwidth(schedule: str) -> None:
    plan = make_plan(PROFILE, schedule=schedule, num_stages=2, num_microbatches=4, partition=((0, 3), (3, 4)),
                     replicas=(3, 1), placement=(0, 3))
    costs = stage_costs(PROFILE, plan, TOPOLOGY)
    assert costs.forward_s == pytest.approx((3.0, 1.0)) and costs.backward_s == pytest.approx((6.0, 2.0))
    assert costs.update_s == pytest.approx((2 * 2 / 3 * 300 / 10.0, 0.0))
