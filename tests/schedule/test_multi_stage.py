"""Several stages per rank: literal tables, the registry's rules, device metrics, speeds, recomputation."""

from __future__ import annotations

import math

import pytest

from pipesim import Topology, simulate, uniform_profile
from pipesim.errors import ConfigError
from pipesim.metrics import _exposed_communication
from pipesim.schedule import build_schedule, to_csv, validate
from pipesim.schedule.csv_format import from_csv
from pipesim.simulation import simulate_schedule
from pipesim.spec.profile import Profile
from pipesim.spec.validation import build

TF, TB = 1.0e-3, 2.0e-3


def rows(name: str, stages: int, m: int, ranks: int) -> list[str]:
    schedule = build_schedule(name, stages, m, num_ranks=ranks)
    validate(schedule)
    return [" ".join(cell for cell in row if "U" not in cell) for row in schedule.to_text()]


def test_interleaved_1f1b_r2_v2_m4_table() -> None:
    assert rows("interleaved-1f1b", 4, 4, 2) == [
        "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3",
        "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3",
    ]


def test_looped_bfs_runs_backwards_in_falling_microbatch_order() -> None:
    assert rows("looped-bfs", 4, 2, 2) == ["0F0 0F1 2F0 2F1 2B1 2B0 0B1 0B0", "1F0 1F1 3F0 3F1 3B1 3B0 1B1 1B0"]


def test_zbv_r2_m2_table_places_stages_in_a_v() -> None:
    schedule = build_schedule("zbv", 4, 2, num_ranks=2)
    assert schedule.stage_to_rank == (0, 1, 1, 0)
    assert rows("zbv", 4, 2, 2) == ["0F0 0F1 3F0 3I0 3W0 3F1 3I1 3W1 0I0 0W0 0I1 0W1",
                                    "1F0 2F0 1F1 2F1 2I0 2W0 1I0 1W0 2I1 2W1 1I1 1W1"]


def test_dualpipev_mixes_full_and_split_backwards() -> None:
    assert rows("dualpipev", 4, 4, 2) == [
        "0F0 0F1 0F2 3F0 3I0 3W0 3F1 0F3 3B1 3F2 0B0 3B2 3F3 0B1 3B3 0I2 0W2 0I3 0W3",
        "1F0 2F0 1F1 2F1 1F2 2B0 2F2 1B0 1F3 2B1 2F3 1B1 2B2 1B2 2I3 1I3 2W3 1W3",
    ]


def test_zb_h1_and_h2_tables() -> None:
    assert rows("zb-h1", 3, 3, 3) == ["0F0 0F1 0F2 0I0 0W0 0I1 0W1 0I2 0W2",
                                      "1F0 1F1 1I0 1F2 1I1 1W0 1I2 1W1 1W2",
                                      "2F0 2I0 2F1 2I1 2F2 2I2 2W0 2W1 2W2"]
    assert rows("zb-h2", 2, 3, 2) == ["0F0 0F1 0F2 0I0 0W0 0I1 0W1 0I2 0W2", "1F0 1I0 1F1 1I1 1F2 1I2 1W0 1W1 1W2"]


def test_update_follows_each_stages_last_backward_of_the_minibatch() -> None:
    ranks = build_schedule("interleaved-zb", 4, 2, num_ranks=2, num_minibatches=2).to_text()
    assert ranks[0][:9] == ["0F0", "0F1", "2F0", "2F1", "2I0", "2W0", "2I1", "2W1", "2U0"]
    assert ranks[0][12:15] == ["0W1", "0U0", "0F2"]
    assert ranks[0][-1] == "0U1"


@pytest.mark.parametrize(("args", "message"), [
    (("gpipe", 4, 4, {"num_ranks": 2}), "num_ranks=2: gpipe runs one stage per rank"),
    (("zb-h1", 4, 4, {"num_ranks": 2}), "stages_per_rank=2: zb-h1 runs one stage per rank"),
    (("interleaved-1f1b", 6, 4, {"num_ranks": 4}), "num_stages=6: must be a multiple of num_ranks"),
    (("zbv", 4, 4, {}), "stages_per_rank=1: zbv needs exactly 2 stages per rank"),
    (("dualpipev", 6, 4, {"num_ranks": 3}), "num_microbatches=4: must be >= the number of stages for dualpipev"),
    (("looped-bfs", 4, 4, {"num_ranks": 0}), "num_ranks=0: must be an integer >= 1"),
])
def test_registry_rejects_with_a_clear_message(args: tuple[str, int, int, dict[str, int]], message: str) -> None:
    name, stages, m, options = args
    with pytest.raises(ConfigError, match=message):
        build_schedule(name, stages, m, **options)


def test_interleaved_and_looped_bfs_closed_form() -> None:
    # m a multiple of R, uniform chunks: (V*m + R - 1)(tf + tb) per minibatch, the bubble / V.
    for r in (1, 2, 4):
        for v in (1, 2, 3):
            for m in (r, 3 * r):
                profile = uniform_profile(num_layers=r * v, forward_s=TF, backward_s=TB)
                for name in ("interleaved-1f1b", "looped-bfs"):
                    metrics = simulate(profile, schedule=name, num_stages=r * v, num_microbatches=m,
                                       stages_per_rank=v).metrics
                    assert math.isclose(metrics.iteration_time_s, (v * m + r - 1) * (TF + TB), rel_tol=1e-9)
                    assert metrics.num_ranks == r and len(metrics.device_utilization) == r
                    assert math.isclose(metrics.bubble_fraction, (r - 1) / (v * m + r - 1), rel_tol=1e-9,
                                        abs_tol=1e-12)


def test_device_memory_sums_its_stages_and_exposed_communication_is_per_stage() -> None:
    profile = uniform_profile(num_layers=8, forward_s=TF, backward_s=TB, activation_bytes=1e8, param_bytes=1e6)
    topology = Topology.uniform(num_devices=2, bandwidth="10GB/s")
    metrics = simulate(profile, topology, schedule="interleaved-1f1b", num_stages=4, num_microbatches=4,
                       stages_per_rank=2).metrics
    for device in (0, 1):
        mine = [s for s in metrics.stages if s.device == device]
        assert len(mine) == 2
        assert metrics.device_peak_memory_bytes[device] <= sum(s.peak_memory_bytes for s in mine)
        assert metrics.device_peak_memory_bytes[device] >= max(s.peak_memory_bytes for s in mine)
    # Each wait is charged to the stage whose op waited: a device's stages add up to its total.
    trace = simulate(profile, topology, schedule="interleaved-1f1b", num_stages=4, num_microbatches=4,
                     stages_per_rank=2).trace
    for device in (0, 1):
        total = _exposed_communication(trace, device, metrics.window_start_s, metrics.window_end_s)
        parts = [s.exposed_communication_s for s in metrics.stages if s.device == device]
        assert total > 0 and math.isclose(sum(parts), total, rel_tol=1e-12)


def test_device_speed_divides_the_times_of_every_stage_it_holds() -> None:
    topology = Topology.model_validate({"devices": [{"name": "fast", "speed": 2.0}, {"name": "slow", "speed": 0.5}]})
    split = uniform_profile(num_layers=4, forward_s=TF, backward_s=TB, backward_input_s=TB / 2,
                            backward_weight_s=TB / 2, param_bytes=1.0)
    frame = simulate(split, topology, schedule="zbv", num_stages=4, num_microbatches=4,
                     stages_per_rank=2).trace.to_frame()
    forwards = frame[(frame["stream"] == "compute") & (frame["kind"] == "F")]
    by_stage = forwards.groupby("stage")["duration_s"].max().to_dict()
    assert by_stage == pytest.approx({0: TF / 2, 1: TF * 2, 2: TF * 2, 3: TF / 2})
    # Every kind of op, the optimizer step included: stages 0 and 3 sit on the fast device.
    layer = {"name": "layer", "forward_s": TF, "backward_s": TB, "backward_input_s": TB / 2,
             "backward_weight_s": TB / 2, "update_s": TF / 4, "activation_bytes": 0.0, "param_bytes": 1.0}
    updating = build(Profile, {"layers": [layer] * 4})
    frame = simulate(updating, topology, schedule="zbv", num_stages=4, num_microbatches=4,
                     stages_per_rank=2).trace.to_frame()
    compute = frame[frame["stream"] == "compute"]
    by_kind = compute.groupby(["kind", "stage"])["duration_s"].max().to_dict()
    base = {"F": TF, "I": TB / 2, "W": TB / 2, "U": TF / 4}
    assert by_kind == pytest.approx({(kind, stage): seconds * (0.5 if stage in (0, 3) else 2.0)
                                     for kind, seconds in base.items() for stage in range(4)})


def layered_profile() -> Profile:
    """Two stages of (linear with weights, relu without): the relu is what selective recompute drops."""
    layers = []
    for index in range(2):
        layers.append({"name": f"linear{index}", "forward_s": 1.0, "backward_s": 2.0, "activation_bytes": 400.0,
                       "param_bytes": 10.0})
        layers.append({"name": f"relu{index}", "forward_s": 0.25, "backward_s": 0.5, "activation_bytes": 100.0,
                       "param_bytes": 0.0})
    return build(Profile, {"layers": layers})


# Per stage: what a microbatch keeps from F to B, and what its B re-creates and holds while it
# runs (full: the whole stage's 400 + 100; selective: the relu's 100).
@pytest.mark.parametrize(("modes", "backward_s", "stash", "working"), [
    (("none", "none"), (2.5, 2.5), (500.0, 500.0), (0.0, 0.0)),
    (("full", "full"), (3.75, 3.75), (0.0, 100.0), (500.0, 500.0)),
    (("selective", "selective"), (2.75, 2.75), (400.0, 400.0), (100.0, 100.0)),
    (("full", "selective"), (3.75, 2.75), (0.0, 400.0), (500.0, 100.0)),
])
def test_recomputation_per_stage_costs_time_and_saves_memory(
    modes: tuple[str, str], backward_s: tuple[float, float], stash: tuple[float, float],
    working: tuple[float, float],
) -> None:
    result = simulate(layered_profile(), schedule="gpipe", num_stages=2, num_microbatches=3,
                      partition=((0, 2), (2, 4)), recompute_stages=modes)
    frame = result.trace.to_frame()
    backwards = frame[(frame["stream"] == "compute") & (frame["kind"] == "B")]
    assert tuple(backwards.groupby("stage")["duration_s"].max()) == backward_s
    peaks = tuple(s.peak_breakdown_bytes["activations"] + s.peak_breakdown_bytes["working"]
                  for s in result.metrics.stages)
    # GPipe: all 3 microbatches are stashed when the first B starts.
    assert peaks == (3 * stash[0] + working[0], 3 * stash[1] + working[1])


def test_plan_recompute_flag_is_full_recompute_everywhere() -> None:
    a = simulate(layered_profile(), schedule="1f1b", num_stages=2, num_microbatches=2, recompute=True)
    b = simulate(layered_profile(), schedule="1f1b", num_stages=2, num_microbatches=2, recompute_stages=("full", "full"))
    assert a.metrics.iteration_time_s == b.metrics.iteration_time_s
    assert a.metrics.peak_memory_bytes == b.metrics.peak_memory_bytes


def test_a_schedule_read_from_csv_simulates_like_the_generated_one() -> None:
    profile = uniform_profile(num_layers=8, forward_s=TF, backward_s=TB, backward_input_s=TB / 2,
                              backward_weight_s=TB / 2, activation_bytes=1e6)
    topology = Topology.uniform(num_devices=4, bandwidth="1GB/s", latency="5us")
    generated = simulate(profile, topology, schedule="zbv", num_stages=8, num_microbatches=8, stages_per_rank=2)
    read = simulate_schedule(profile, topology, from_csv(to_csv(generated.schedule), num_microbatches=8))
    assert read.schedule.stage_to_rank == generated.schedule.stage_to_rank
    assert read.metrics.makespan_s == generated.metrics.makespan_s
    assert read.metrics.device_utilization == generated.metrics.device_utilization


def test_a_flush_schedule_read_from_csv_runs_minibatch_k_on_version_k() -> None:
    # A CSV carries no versions: they come from counting each stage's updates along its rank. With a
    # flush, every op of minibatch k runs on version k and its U makes version k + 1 from version k.
    profile = uniform_profile(num_layers=4, forward_s=TF, backward_s=TB, activation_bytes=1e6, param_bytes=4e6)
    generated = build_schedule("1f1b", 4, 3, num_minibatches=3)
    read = from_csv(to_csv(generated, include_updates=True), num_microbatches=3)
    versions = [(op, version) for op, version in zip((op for ops in read.ranks for op in ops),
                                                     read.version.tolist(), strict=True)]
    assert versions and all(version == (op.microbatch if op.kind.value == "U" else op.microbatch // 3)
                            for op, version in versions)
    metrics = simulate_schedule(profile, Topology.uniform(num_devices=4), read).metrics
    assert all((stage.weight_versions_max, stage.forward_delay_steps, stage.discrepancy_max) == (1, 0, 0)
               for stage in metrics.stages)
