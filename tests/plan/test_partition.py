"""PipeDream's partitioner against brute force, its cost model against per-layer sums, and its errors."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesim.errors import ConfigError
from pipesim.plan.costs import Chain, CostModel, DeviceRow, StageSpec, estimate
from pipesim.plan.partition import Partitioner, partition
from pipesim.spec.files import load_profile
from pipesim.spec.profile import Profile
from pipesim.spec.topology import Topology
from pipesim.spec.validation import build

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-9


@st.composite
def profiles(draw: st.DrawFn, max_layers: int = 10) -> Profile:
    """Chains of 1..max_layers layers with times, weights, activations and stashes drawn independently."""
    num_layers = draw(st.integers(1, max_layers))
    times = st.floats(0.0, 10.0, allow_nan=False)
    sizes = st.sampled_from([0.0, 1.0, 3.0, 10.0, 40.0, 100.0, 1000.0])
    layers = [
        {"name": f"l{index}", "forward_s": draw(times), "backward_s": draw(times),
         "activation_bytes": draw(sizes), "param_bytes": draw(sizes), "stash_bytes": draw(sizes)}
        for index in range(num_layers)
    ]
    return build(Profile, {"layers": layers, "microbatch_size": draw(st.integers(1, 4))})


@st.composite
def topologies(draw: st.DrawFn, max_devices: int = 4) -> Topology:
    """Flat or two-level topologies of 1..max_devices devices."""
    num_devices = draw(st.integers(1, max_devices))
    bandwidths = st.sampled_from([1.0, 4.0, 20.0, math.inf])
    if draw(st.booleans()):
        return Topology.uniform(num_devices=num_devices, bandwidth=draw(bandwidths))
    return Topology.hierarchical(num_devices=num_devices, devices_per_server=draw(st.integers(1, 2)),
                                 intra_bandwidth=draw(bandwidths), inter_bandwidth=draw(bandwidths))


models = st.builds(
    CostModel,
    overlap=st.booleans(),
    microbatches_per_allreduce=st.integers(1, 3),
    weight_versions=st.sampled_from(["stash", "double"]),
    optimizer_state_multiplier=st.sampled_from([0.0, 1.0, 2.0]),
)


def all_plans(num_layers: int, num_devices: int, rule: str | int, use_all_devices: bool) -> list[tuple[StageSpec, ...]]:
    """Every cut of the chain into stages and every replication of them, on consecutive devices."""
    plans = []
    for num_stages in range(1, min(num_layers, num_devices) + 1):
        for cuts in itertools.combinations(range(1, num_layers), num_stages - 1):
            bounds = (0, *cuts, num_layers)
            ranges = list(zip(bounds[:-1], bounds[1:], strict=True))
            if rule == "straight":
                choices = [(1,) * num_stages]
            elif rule == "free":
                choices = list(itertools.product(range(1, num_devices + 1), repeat=num_stages))
            else:
                choices = [(int(rule),) * num_stages]
            for replicas in choices:
                used = sum(replicas)
                if used == num_devices or (not use_all_devices and used < num_devices):
                    plans.append(tuple((s, e, r) for (s, e), r in zip(ranges, replicas, strict=True)))
    return plans


CASES = {
    "model": models, "recompute": st.booleans(), "rule": st.sampled_from(["free", "free", "straight", 2]),
    "use_all_devices": st.booleans(), "memory_quantile": st.sampled_from([None, 0.0, 0.3, 0.7]),
}


@given(profile=profiles(), topology=topologies(), **CASES)
def test_no_enumerated_plan_beats_the_dp(profile: Profile, topology: Topology, model: CostModel, recompute: bool,
                                         rule: str | int, use_all_devices: bool, memory_quantile: float | None) -> None:
    """Chains of up to 10 layers on up to 4 devices: every cut and replication, against the DP."""
    check_against_brute_force(profile, topology, model, recompute, rule, use_all_devices, memory_quantile)


@pytest.mark.slow
@settings(max_examples=1000)
@given(profile=profiles(max_layers=11), topology=topologies(max_devices=5), **CASES)
def test_no_enumerated_plan_beats_the_dp_on_more_cases(profile: Profile, topology: Topology, model: CostModel,
                                                       recompute: bool, rule: str | int, use_all_devices: bool,
                                                       memory_quantile: float | None) -> None:
    """The same on up to 11 layers and 5 devices, 1000 cases (make bench-planner)."""
    check_against_brute_force(profile, topology, model, recompute, rule, use_all_devices, memory_quantile)


def check_against_brute_force(profile: Profile, topology: Topology, model: CostModel, recompute: bool,
                              rule: str | int, use_all_devices: bool, memory_quantile: float | None) -> None:
    """The DP's plan is no slower than the fastest enumerated plan that fits, and meets the limit."""
    chain = Chain.from_profile(profile, recompute=recompute)
    row = DeviceRow.from_topology(topology)
    plans = all_plans(chain.num_layers, row.num_devices, rule, use_all_devices)
    costs = [estimate(chain, row, model, plan) for plan in plans]
    memory_limit = math.inf
    if memory_quantile is not None and costs:
        memories = sorted(cost.peak_memory_bytes for cost in costs)
        memory_limit = memories[int(memory_quantile * (len(memories) - 1))] * (1 + 1e-9) + 1e-9
    fitting = [cost for cost in costs if cost.peak_memory_bytes <= memory_limit]
    solver = Partitioner(chain, row, model, replicas=rule, use_all_devices=use_all_devices)
    found = solver.fastest(memory_limit)
    if not fitting:
        assert found is None
        return
    assert found is not None
    mine = estimate(chain, row, model, found)
    best = min(cost.time_s for cost in fitting)
    assert mine.time_s <= best * (1 + TOLERANCE) + 1e-12
    assert mine.peak_memory_bytes <= memory_limit * (1 + TOLERANCE)
    smallest = solver.smallest()
    assert smallest is not None
    least = min(cost.peak_memory_bytes for cost in costs)
    assert least * (1 - TOLERANCE) <= solver.memory_of(smallest) <= least * (1 + TOLERANCE) + 1e-9


def test_cost_model_matches_per_layer_sums() -> None:
    """One hand-checkable plan on two servers of two: times, all-reduce, transfer and memory."""
    layers = [
        {"name": f"l{i}", "forward_s": f, "backward_s": 2 * f, "activation_bytes": a, "param_bytes": w, "stash_bytes": s}
        for i, (f, a, w, s) in enumerate([(1.0, 8.0, 10.0, 5.0), (2.0, 4.0, 20.0, 6.0), (3.0, 2.0, 30.0, 7.0)])
    ]
    profile = build(Profile, {"layers": layers})
    topology = Topology.hierarchical(num_devices=4, devices_per_server=2, intra_bandwidth=100.0, inter_bandwidth=10.0)
    chain, row = Chain.from_profile(profile), DeviceRow.from_topology(topology)
    result = estimate(chain, row, CostModel(), ((0, 2, 3), (2, 3, 1)))
    first, second = result.stages
    # Stage 0: layers 0-1 on devices 0..2 (the ring crosses servers: 10 B/s).
    assert first.compute_s == pytest.approx(3 * 1.0 + 3 * 2.0)
    assert first.allreduce_s == pytest.approx(4 * 2 / 3 * 30.0 / 10.0)
    assert first.time_s == pytest.approx((9.0 + 8.0) / 3)
    # The cut after layer 1 runs from device 0 to device 3, between servers.
    assert first.transfer_s == pytest.approx(2 * 4.0 / 10.0)
    assert first.inflight == 2  # ceil(4 devices to the end / 3 replicas)
    assert first.memory_bytes == pytest.approx(30.0 * (2 + 1 + 1) + 11.0 * 2)
    assert second.time_s == pytest.approx(9.0) and second.memory_bytes == pytest.approx(30.0 * 3 + 7.0)
    assert result.time_s == pytest.approx(9.0) and result.bottleneck == "stage 1"
    overlapped = estimate(chain, row, CostModel(overlap=True), ((0, 2, 3), (2, 3, 1)))
    assert overlapped.stages[0].time_s == pytest.approx(9.0 / 3)


def test_a_replicated_stage_computes_at_its_slowest_replicas_speed() -> None:
    """The hand-checked plan above on devices of speeds 2, 1, 2 and 4: the replicas of stage 0 take
    microbatches in turn, so the slowest (speed 1) paces it; stage 1 runs on the speed-4 device."""
    layers = [{"name": f"l{i}", "forward_s": f, "backward_s": 2 * f, "activation_bytes": 1.0, "param_bytes": 0.0}
              for i, f in enumerate([1.0, 2.0, 3.0])]
    flat = Topology.hierarchical(num_devices=4, devices_per_server=2, intra_bandwidth=100.0, inter_bandwidth=10.0)
    devices = [device.model_copy(update={"speed": speed}) for device, speed in zip(flat.devices, (2.0, 1.0, 2.0, 4.0),
                                                                                   strict=True)]
    row = DeviceRow.from_topology(flat.model_copy(update={"devices": tuple(devices)}))
    first, second = estimate(Chain.from_profile(build(Profile, {"layers": layers})), row, CostModel(),
                             ((0, 2, 3), (2, 3, 1))).stages
    assert first.compute_s == pytest.approx((3 * 1.0 + 3 * 2.0) / 1.0) and first.time_s == pytest.approx(9.0 / 3)
    assert second.compute_s == pytest.approx(3 * 3.0 / 4.0)


def test_ring_bandwidth_is_the_slowest_level_of_the_range() -> None:
    topology = Topology.hierarchical(num_devices=8, devices_per_server=4, intra_bandwidth=100.0, inter_bandwidth=10.0)
    row = DeviceRow.from_topology(topology)
    for first in range(8):
        for last in range(first, 8):
            expected = math.inf if first == last else 100.0 if first // 4 == last // 4 else 10.0
            assert row.ring_bandwidth[first, last] == expected == topology.ring_bandwidth_bytes_per_s(first, last)


@pytest.mark.parametrize(
    ("model", "stages", "first_of_last_stage"),
    [
        ("vgg16", ((0, 34, 15), (34, 41, 1)), "node35 Linear(in_features=25088"),
        ("alexnet", ((0, 17, 15), (17, 23, 1)), "node18 Linear(in_features=9216"),
        ("resnet50", ((0, 177, 16),), "node1 Input"),
    ],
)
def test_four_servers_of_four_give_the_configs_pipedream_shipped(
    model: str, stages: tuple[StageSpec, ...], first_of_last_stage: str
) -> None:
    """PipeDream's Cluster-A setting (4 servers of 4, 10 Gbit/s between them): the runtime's shipped
    gpus=16 configs are 15-1 with the classifier alone for VGG-16 and AlexNet (the same cuts), and
    data parallelism for ResNet-50 (deployed_configs.json in the shared traces). PipeDream's cost
    factors (4 (r-1)/r all-reduce, 2 x activation per cut) on our device row find them."""
    profile = load_profile(ROOT / "traces" / f"{model}.json")
    topology = Topology.hierarchical(num_devices=16, devices_per_server=4, intra_bandwidth="10GB/s",
                                     inter_bandwidth="10Gbit/s")
    for overlap in (False, True):
        found = partition(profile, topology, overlap=overlap, cost_model="pipedream")
        assert found.stages == stages
        assert profile.layers[stages[-1][0]].name.startswith(first_of_last_stage)
        assert found.data_parallel.time_s / found.estimate.time_s >= (2 if len(stages) > 1 else 1)


def test_straight_pipeline_uses_one_device_per_stage() -> None:
    profile = load_profile(ROOT / "traces" / "resnet50.json")
    topology = Topology.uniform(num_devices=4, bandwidth="25Gbit/s")
    found = partition(profile, topology, straight=True)
    assert [replicas for _, _, replicas in found.stages] == [1, 1, 1, 1]
    with pytest.raises(ConfigError, match="a straight pipeline needs a layer per device"):
        partition(load_profile(ROOT / "traces" / "vgg16.json"), Topology.uniform(num_devices=64), straight=True)


def test_a_memory_limit_no_plan_meets_names_the_smallest_that_fits() -> None:
    profile = load_profile(ROOT / "traces" / "vgg16.json")
    topology = Topology.uniform(num_devices=4, bandwidth="10Gbit/s")
    with pytest.raises(ConfigError) as caught:
        partition(profile, topology, memory_bytes=1e9)
    message = str(caught.value)
    assert "no PipeDream plan fits in 1.00 GB per device; the smallest per-device memory any plan needs is" in message
    needed = int(message.rsplit("(", 1)[1].split()[0])
    fits = partition(profile, topology, memory_bytes=needed)
    assert fits.estimate.peak_memory_bytes <= needed
    with pytest.raises(ConfigError):
        partition(profile, topology, memory_bytes=needed * (1 - 1e-6))


def test_a_memory_limit_changes_the_plan_and_is_met() -> None:
    profile = load_profile(ROOT / "traces" / "vgg16.json")
    topology = Topology.hierarchical(num_devices=16, devices_per_server=4, intra_bandwidth="10GB/s",
                                     inter_bandwidth="10Gbit/s")
    free = partition(profile, topology)
    limited = partition(profile, topology, memory_bytes=16e9)
    assert limited.estimate.peak_memory_bytes <= 16e9 < free.estimate.peak_memory_bytes
    assert limited.estimate.time_s >= free.estimate.time_s
