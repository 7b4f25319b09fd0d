"""A schedule is its op table: the order facts the 1F1B block formula writes equal their general
definitions (the same schedule converted from its Op lists), column by column and lowered; the Op
objects are a view built on first use."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipesim.engine.analytic import run_analytic
from pipesim.engine.lowering import Program, lower
from pipesim.errors import ConfigError, ScheduleError
from pipesim.schedule.ir import F, Schedule
from pipesim.schedule.registry import build_schedule
from pipesim.schedule.validate import validate
from pipesim.simulation import make_plan, prepare
from pipesim.spec.plan import Plan
from pipesim.spec.profile import Profile, uniform_profile
from pipesim.spec.topology import Topology
from pipesim.spec.validation import build

# The schedules written by the block formula (``schedule.one_f_one_b``), with order facts given.
NAMES = ("gpipe", "1f1b", "pipedream", "2bw", "pipemare")
TABLE_COLUMNS = ("rank_offsets", "rank", "position", "stage", "kind", "microbatch", "minibatch", "version",
                 "duration_s", "wait", "send_rank", "send_bytes", "transfer_s", "is_remote_send")
ORDER_FACTS = ("minibatch", "updates_before", "forward", "wait", "version", "send_rank",
               "is_remote_send")


def converted(schedule: Schedule) -> Schedule:
    """The same schedule converted from its Op lists: every order fact derived by definition."""
    return Schedule.from_ranks(schedule.name, schedule.num_stages, schedule.num_microbatches,
                               schedule.num_minibatches, schedule.ranks, schedule.stage_to_rank, schedule.weights)


def ragged_profile(num_layers: int) -> Profile:
    """Layers of different times and sizes, so that every stage's costs differ."""
    layers = [{"name": f"l{i}", "forward_s": (1 + i % 3) / 1024, "backward_s": (2 + i % 5) / 1024,
               "activation_bytes": 1000.0 * (1 + i % 4), "param_bytes": 500.0 * (1 + i % 2)}
              for i in range(num_layers)]
    return build(Profile, {"name": "ragged", "layers": layers})


def both_programs(profile: Profile, topology: Topology, plan: Plan) -> tuple[Program, Program]:
    """The plan prepared from the registry, and lowered from the converted schedule."""
    fast = prepare(profile, topology, plan)
    reference = lower(converted(fast.schedule), fast.costs, topology, rank_devices=fast.rank_devices,
                      microbatch_size=profile.microbatch_size,
                      optimizer_state_multiplier=plan.optimizer_state_multiplier)
    return fast, reference


def assert_same_program(fast: Program, reference: Program) -> None:
    assert fast.schedule.table.wait is not None and reference.schedule.table.wait is None
    for name in ORDER_FACTS:
        got, want = getattr(fast.schedule, name), getattr(reference.schedule, name)
        assert got.dtype == want.dtype and np.array_equal(got, want), name
    for name in TABLE_COLUMNS + ("link",):
        got, want = getattr(fast.ops, name), getattr(reference.ops, name)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert np.array_equal(got, want), name
    assert fast.info == reference.info
    assert (fast.keeps_versions, fast.has_link_contention) == (reference.keeps_versions, reference.has_link_contention)
    assert fast.shared_paths == reference.shared_paths
    assert fast.nic_bandwidth_bytes_per_s == reference.nic_bandwidth_bytes_per_s
    assert fast.costs == reference.costs and fast.rank_devices == reference.rank_devices


def plan_for(profile: Profile, name: str, p: int, m: int, k: int, **options: Any) -> Plan:
    return make_plan(profile, schedule=name, num_stages=p, num_microbatches=m, num_minibatches=k, **options)


GRID = [(name, p, m) for name in NAMES for p, m in ((1, 1), (1, 3), (2, 2), (3, 5), (4, 4), (4, 9), (5, 16))]


@pytest.mark.parametrize(("name", "p", "m"), GRID)
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("recompute", [False, True])
def test_formula_facts_equal_their_definitions(name: str, p: int, m: int, k: int, recompute: bool) -> None:
    profile = ragged_profile(p + 3)
    topology = Topology.uniform(num_devices=p, bandwidth="1GB/s", latency="5us")
    for update in ("minibatch", "microbatch") if name == "pipemare" else ("minibatch",):
        plan = plan_for(profile, name, p, m, k, recompute=recompute, pipemare_update=update)
        fast, reference = both_programs(profile, topology, plan)
        assert_same_program(fast, reference)


# Schedules assembled from one minibatch's table (``schedule.multi_stage.assemble``, which gives
# the minibatch and version columns): (name, ranks, stages per rank).
ASSEMBLED = (("interleaved-1f1b", 2, 2), ("looped-bfs", 3, 2), ("interleaved-zb", 2, 3), ("zbv", 3, 2),
             ("dualpipev", 2, 2), ("zb-h1", 4, 1), ("zb-h2", 3, 1))


@pytest.mark.parametrize(("name", "num_ranks", "v"), ASSEMBLED)
@pytest.mark.parametrize("k", [1, 3])
def test_assembled_facts_equal_their_definitions(name: str, num_ranks: int, v: int, k: int) -> None:
    for m in (num_ranks * v, 2 * num_ranks * v + 2):
        schedule = build_schedule(name, num_ranks * v, m, num_minibatches=k, num_ranks=num_ranks)
        reference = converted(schedule)
        assert schedule.table.minibatch is not None and reference.table.minibatch is None
        assert schedule.table == reference.table
        for fact in ORDER_FACTS:
            got, want = getattr(schedule, fact), getattr(reference, fact)
            assert got.dtype == want.dtype and np.array_equal(got, want), (fact, m)


def test_two_ops_waiting_for_one_output_are_named() -> None:
    """Each output is awaited by at most one op: the later of two is marked."""
    schedule = Schedule.from_ranks("custom", 2, 1, 1, ((F(0, 0),), (F(1, 0), F(1, 0))), (0, 1))
    with pytest.raises(ScheduleError, match="1F0 waits for 0F0, whose output another op already waits for"):
        _ = schedule.wait


@st.composite
def columnar_cases(draw: st.DrawFn) -> tuple[Profile, Topology, Plan]:
    """A plan of one of the five schedules: p <= 6, m <= 10 (m >= p for 2bw), K <= 4, a random
    partition, recomputation per stage, replicas, a placement and a topology with levels."""
    name = draw(st.sampled_from(NAMES))
    p = draw(st.integers(1, 6))
    m = draw(st.integers(p if name == "2bw" else 1, 10))
    num_layers = p + draw(st.integers(0, 4))
    cuts = sorted(draw(st.permutations(range(1, num_layers)))[: p - 1])
    bounds = [0, *cuts, num_layers]
    modes = draw(st.lists(st.sampled_from(["none", "full", "selective"]), min_size=p, max_size=p))
    plan = build(Plan, {
        "schedule": name, "num_stages": p, "num_microbatches": m, "num_minibatches": draw(st.integers(1, 4)),
        "partition": [[bounds[i], bounds[i + 1]] for i in range(p)],
        "recompute_stages": modes if draw(st.booleans()) else [],
        "recompute": draw(st.booleans()),
        "replicas": draw(st.lists(st.integers(1, 2), min_size=p, max_size=p)),
        "placement": draw(st.permutations(range(p))),
        "optimizer_state_multiplier": draw(st.sampled_from([0.0, 1.0, 2.0])),
        "pipemare_update": draw(st.sampled_from(["minibatch", "microbatch"])),
    })
    profile = uniform_profile(num_layers=num_layers, forward_s=draw(st.sampled_from([0.0, 1 / 1024])),
                              backward_s=2 / 1024, activation_bytes=draw(st.sampled_from([0.0, 4096.0])),
                              param_bytes=1024.0) if draw(st.booleans()) else ragged_profile(num_layers)
    topology: dict[str, Any] = {
        "devices": [{"name": f"d{i}", "speed": draw(st.sampled_from([0.5, 1.0, 2.0]))} for i in range(p)],
        "bandwidth_bytes_per_s": draw(st.sampled_from([1e6, 1e9, float("inf")])), "latency_s": 1e-6,
    }
    if draw(st.booleans()):
        topology["levels"] = [{"group_size": draw(st.integers(1, 3)), "bandwidth_bytes_per_s": 1e10,
                               "latency_s": 0.0}]
    return profile, build(Topology, topology), plan


@given(columnar_cases())
def test_formula_facts_equal_their_definitions_for_any_plan(case: tuple[Profile, Topology, Plan]) -> None:
    fast, reference = both_programs(*case)
    assert_same_program(fast, reference)


@pytest.mark.parametrize("name", NAMES)
def test_the_op_objects_are_a_view_of_the_table(name: str) -> None:
    schedule = build_schedule(name, 3, 4, num_minibatches=2)
    assert (schedule.num_ranks, schedule.has_split_backward) == (3, False)
    assert "ranks" not in schedule.__dict__  # nothing built yet
    reference = converted(schedule)
    assert schedule == reference and reference == schedule and hash(schedule) == hash(reference)
    assert schedule.ranks is schedule.ranks and schedule.num_ops == sum(len(ops) for ops in schedule.ranks)
    assert schedule.to_dict() == reference.to_dict()
    validate(schedule)
    assert pickle.loads(pickle.dumps(build_schedule(name, 3, 4, num_minibatches=2))) == reference
    assert dataclasses.replace(schedule, name="copy").ranks == reference.ranks
    assert schedule != build_schedule(name, 3, 4, num_minibatches=3)


@pytest.mark.parametrize("name", ["gpipe", "2bw", "zb-h1"])
def test_the_columns_are_read_only(name: str) -> None:
    schedule = build_schedule(name, 4, 4, num_minibatches=2)
    table = schedule.table
    for column in (table.rank_offsets, table.stage, table.kind, table.microbatch, table.rank, table.position,
                   *(getattr(schedule, fact) for fact in ORDER_FACTS)):
        with pytest.raises(ValueError):
            column[0] = 1


def test_program_readers_of_ops_build_them_on_demand() -> None:
    profile = uniform_profile(num_layers=8, forward_s=1 / 1024, backward_s=2 / 1024, activation_bytes=64.0)
    plan = plan_for(profile, "pipedream", 4, 6, 2)
    topology = Topology.uniform(num_devices=4)
    program = prepare(profile, topology, plan)
    run_analytic(program)  # the engines and memory need no Op objects
    assert "ranks" not in program.schedule.__dict__
    fast, reference = both_programs(profile, topology, plan)
    assert fast.ranks == reference.ranks
    assert fast.versions == reference.versions


def test_2bw_with_too_few_microbatches_is_refused() -> None:
    profile = uniform_profile(num_layers=8, forward_s=1e-3, backward_s=2e-3)
    with pytest.raises(ConfigError, match="must be >= num_stages for 2bw"):
        prepare(profile, Topology.uniform(num_devices=4), plan_for(profile, "2bw", 4, 3, 2))


def test_a_time_that_is_not_finite_is_refused_naming_the_value() -> None:
    profile = uniform_profile(num_layers=4, forward_s=1e-3, backward_s=2e-3, activation_bytes=8.0)
    topology = Topology.uniform(num_devices=4)
    fast = prepare(profile, topology, plan_for(profile, "1f1b", 4, 4, 1))
    costs = dataclasses.replace(fast.costs, backward_s=(2e-3, float("inf"), 2e-3, 2e-3))
    messages = []
    for schedule in (build_schedule("1f1b", 4, 4), converted(build_schedule("1f1b", 4, 4))):
        with pytest.raises(ConfigError, match="every op's time must be finite") as error:
            lower(schedule, costs, topology)
        messages.append(str(error.value))
    assert messages[0] == messages[1] and "inf" in messages[0]
