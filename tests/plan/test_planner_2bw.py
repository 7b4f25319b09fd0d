"""PipeDream-2BW's planner: its memory model against the engine's, its choices, and its limits."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pipesim.errors import ConfigError
from pipesim.plan.check import make_pipeline_plan, plan_and_check
from pipesim.plan.costs import Chain, CostModel, DeviceRow, estimate
from pipesim.plan.planner import plan_2bw, scale_profile
from pipesim.simulation import simulate_plan
from pipesim.spec.files import load_profile
from pipesim.spec.profile import uniform_profile
from pipesim.spec.topology import Topology

ROOT = Path(__file__).resolve().parents[2]
VGG = load_profile(ROOT / "traces" / "vgg16.json")
RESNET = load_profile(ROOT / "traces" / "resnet50.json")


@pytest.mark.parametrize(
    ("stages", "microbatches", "recompute", "multiplier"),
    [
        (((0, 60, 1), (60, 120, 1), (120, 176, 1), (176, 177, 1)), 4, False, 1.0),
        (((0, 90, 2), (90, 177, 2)), 3, True, 2.0),
        (((0, 30, 1), (30, 100, 1), (100, 170, 1), (170, 177, 1)), 5, False, 0.0),
        (((0, 177, 4),), 2, True, 1.0),
        (((0, 50, 2), (50, 177, 2)), 2, False, 1.0),
    ],
)
def test_2bw_memory_model_is_the_engines_peak(stages: tuple[tuple[int, int, int], ...], microbatches: int,
                                               recompute: bool, multiplier: float) -> None:
    """Per stage, two weight versions + gradients + optimizer state + stashes in flight, as the engine holds them."""
    topology = Topology.hierarchical(num_devices=4, devices_per_server=2, intra_bandwidth="10GB/s",
                                     inter_bandwidth="10Gbit/s")
    profile = scale_profile(RESNET, 32)
    plan = make_pipeline_plan(stages, schedule="2bw", num_devices=4, num_microbatches=microbatches * stages[0][2] * 2,
                              num_minibatches=4, recompute=recompute, optimizer_state_multiplier=multiplier)
    simulated = simulate_plan(profile, topology, plan)
    chain = Chain.from_profile(profile, recompute=recompute)
    model = CostModel(weight_versions="double", optimizer_state_multiplier=multiplier)
    predicted = estimate(chain, DeviceRow.from_topology(topology), model, stages)
    for mine, theirs in zip(predicted.stages, simulated.metrics.stages, strict=True):
        assert mine.memory_bytes == pytest.approx(theirs.peak_memory_bytes, rel=1e-12)


@pytest.mark.parametrize(("num_devices", "multiplier"), [(2, 0.0), (4, 2.0), (7, 1.0)])
def test_pipedream_memory_model_is_the_engines_peak_on_straight_plans(num_devices: int, multiplier: float) -> None:
    """Exact wherever a stage takes time; a zero-time stage frees at the instant it stashes, so the engine sees less."""
    topology = Topology.uniform(num_devices=num_devices, bandwidth="25Gbit/s")
    checked = plan_and_check(RESNET, topology, straight=True, optimizer_state_multiplier=multiplier)
    for mine, theirs in zip(checked.estimate.stages, checked.result.metrics.stages, strict=True):
        if mine.compute_s > 0:
            assert mine.memory_bytes == pytest.approx(theirs.peak_memory_bytes, rel=1e-12)
            assert mine.inflight == theirs.max_inflight_microbatches
        else:
            assert theirs.peak_memory_bytes <= mine.memory_bytes


@pytest.mark.parametrize("memory", [math.inf, 16e9, 8e9])
def test_every_2bw_plan_checked_by_simulation_agrees_on_memory(memory: float) -> None:
    topology = Topology.hierarchical(num_devices=8, devices_per_server=4, intra_bandwidth="10GB/s",
                                     inter_bandwidth="10Gbit/s", memory_bytes=memory)
    checked = plan_and_check(VGG, topology, planner="2bw", memory_bytes=memory)
    data = checked.to_dict()
    assert data["predicted"]["peak_memory_bytes"] <= memory
    assert data["simulated"]["peak_memory_bytes"] == pytest.approx(data["predicted"]["peak_memory_bytes"], rel=1e-12)
    width, depth = data["width"], data["depth"]
    assert width * depth == 8
    assert data["microbatch_size"] * data["num_microbatches"] * width == data["batch_size"]
    assert data["num_microbatches"] >= depth
    assert checked.plan.num_microbatches == data["num_microbatches"] * width


def test_a_tight_memory_limit_turns_recomputation_on_or_shrinks_microbatches() -> None:
    topology = Topology.uniform(num_devices=4, bandwidth="10GB/s")
    free = plan_2bw(VGG, topology).best
    tight = plan_2bw(VGG, topology, memory_bytes=4e9).best
    assert free.recompute is False and free.estimate is not None and tight.estimate is not None
    assert tight.estimate.peak_memory_bytes <= 4e9 < free.estimate.peak_memory_bytes
    assert tight.recompute or tight.microbatch_size < free.microbatch_size
    assert tight.throughput_samples_per_s <= free.throughput_samples_per_s * (1 + 1e-9)


def test_without_a_memory_limit_time_per_sample_does_not_depend_on_the_microbatch() -> None:
    """Times, activations and the all-reduce share all scale with b, so only memory tells sizes apart."""
    topology = Topology.uniform(num_devices=4, bandwidth="10GB/s")
    best = plan_2bw(VGG, topology, batch_size=512).best
    assert best.estimate is not None
    times = []
    for size in (8, 32):
        chain = Chain.from_profile(VGG, microbatch_size=size)
        model = CostModel(weight_versions="double", microbatches_per_allreduce=512 // (best.width * size))
        stages = tuple((s, e, r) for s, e, r in best.stages)
        times.append(estimate(chain, DeviceRow.from_topology(topology), model, stages).time_per_sample_s)
    assert times[0] == pytest.approx(times[1], rel=1e-12)


def test_equal_throughputs_go_to_the_plan_without_recomputation_on_the_fewest_stages() -> None:
    # Four equal layers on four free devices: a pipeline of d stages, each replicated 4/d times, takes
    # the same time per sample at every depth; recomputation only adds time.
    planned = plan_2bw(uniform_profile(num_layers=4, forward_s=1.0, backward_s=2.0), Topology.uniform(num_devices=4),
                       batch_size=16)
    plain = [c for c in planned.candidates if not c.recompute]
    assert sorted(c.depth for c in plain) == [1, 2, 4]
    assert len({round(c.throughput_samples_per_s, 12) for c in plain}) == 1
    assert all(c.throughput_samples_per_s < plain[0].throughput_samples_per_s for c in planned.candidates
               if c.recompute)
    assert (planned.best.depth, planned.best.recompute, planned.best.microbatch_size) == (1, False, 4)


def test_memory_no_configuration_meets_names_the_smallest() -> None:
    topology = Topology.uniform(num_devices=4, bandwidth="10GB/s")
    with pytest.raises(ConfigError, match="no 2BW plan fits in 100.00 MB per device; the smallest per-device memory"):
        plan_2bw(VGG, topology, memory_bytes=1e8)


def test_batch_sizes_no_depth_divides_are_refused() -> None:
    with pytest.raises(ConfigError, match="batch_size=3"):
        plan_2bw(uniform_profile(num_layers=4, forward_s=1.0, backward_s=1.0), Topology.uniform(num_devices=4),
                 batch_size=3, straight=True)


def test_scale_profile_scales_times_and_activations_not_weights() -> None:
    scaled = scale_profile(VGG, 32)
    assert scaled.microbatch_size == 32
    for before, after in zip(VGG.layers, scaled.layers, strict=True):
        assert after.forward_s == pytest.approx(before.forward_s / 4)
        assert after.activation_bytes == pytest.approx(before.activation_bytes / 4)
        assert after.stashed_bytes == pytest.approx(before.stashed_bytes / 4)
        assert after.param_bytes == before.param_bytes
    assert scale_profile(VGG, VGG.microbatch_size) is VGG


def test_a_huge_batch_size_is_planned_from_its_divisors_without_walking_every_integer() -> None:
    """10**12 samples per step hung listing 1..10**12 for its microbatch sizes; unlimited memory
    takes the largest size that leaves a microbatch per stage."""
    planned = plan_2bw(VGG, Topology.uniform(num_devices=4, bandwidth=10e9), batch_size=10**12)
    assert planned.batch_size == 10**12
    assert planned.best.microbatch_size * planned.best.num_microbatches * planned.best.width == 10**12
