"""The columnar schedules against the Op generators: the same OpTable column by column, the same traces."""

from __future__ import annotations

import dataclasses
import json
import pickle
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipesim.engine.analytic import run_analytic
from pipesim.engine.des import run_des
from pipesim.engine.lowering import Program
from pipesim.errors import ConfigError
from pipesim.metrics import compute_metrics
from pipesim.schedule.columnar import POLICIES, DeferredSchedule, columnar_order, is_columnar
from pipesim.schedule.registry import build_schedule
from pipesim.schedule.validate import validate
from pipesim.simulation import make_plan, prepare
from pipesim.spec.plan import Plan
from pipesim.spec.profile import Profile, uniform_profile
from pipesim.spec.topology import Topology
from pipesim.spec.validation import build

NAMES = tuple(POLICIES)
TABLE_COLUMNS = ("rank_offsets", "rank", "position", "stage", "kind", "microbatch", "minibatch", "version",
                 "duration_s", "wait", "send_rank", "send_bytes", "transfer_s")
CACHED_COLUMNS = ("is_remote_send", "link", "previous_send")


def ragged_profile(num_layers: int) -> Profile:
    """Layers of different times and sizes, so that every stage's costs differ."""
    layers = [{"name": f"l{i}", "forward_s": (1 + i % 3) / 1024, "backward_s": (2 + i % 5) / 1024,
               "activation_bytes": 1000.0 * (1 + i % 4), "param_bytes": 500.0 * (1 + i % 2)}
              for i in range(num_layers)]
    return build(Profile, {"name": "ragged", "layers": layers})


def both_programs(profile: Profile, topology: Topology, plan: Plan) -> tuple[Program, Program]:
    """The plan prepared the columnar way and the Op way."""
    return prepare(profile, topology, plan), prepare(profile, topology, plan, columnar=False)


def assert_same_program(fast: Program, reference: Program) -> None:
    assert isinstance(fast.schedule, DeferredSchedule)
    assert not isinstance(reference.schedule, DeferredSchedule)
    for name in TABLE_COLUMNS + CACHED_COLUMNS:
        got, want = getattr(fast.ops, name), getattr(reference.ops, name)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert np.array_equal(got, want), name
    assert fast.info == reference.info
    assert (fast.keeps_versions, fast.has_link_contention) == (reference.keeps_versions, reference.has_link_contention)
    assert fast.shared_paths == reference.shared_paths
    assert fast.nic_bandwidth_bytes_per_s == reference.nic_bandwidth_bytes_per_s
    assert fast.costs == reference.costs and fast.rank_devices == reference.rank_devices


def assert_same_runs(fast: Program, reference: Program) -> None:
    """Both engines give identical traces and metrics on both programs."""
    runs = [(run_des(fast), run_des(reference))]
    if not fast.has_link_contention:
        runs.append((run_analytic(fast), run_analytic(reference)))
    for got, want in runs:
        assert got.equals(want)
        assert json.dumps(compute_metrics(got).to_dict(), sort_keys=True) == \
            json.dumps(compute_metrics(want).to_dict(), sort_keys=True)


def plan_for(profile: Profile, name: str, p: int, m: int, k: int, **options: Any) -> Plan:
    return make_plan(profile, schedule=name, num_stages=p, num_microbatches=m, num_minibatches=k, **options)


GRID = [(name, p, m) for name in NAMES for p, m in ((1, 1), (1, 3), (2, 2), (3, 5), (4, 4), (4, 9), (5, 16))]


@pytest.mark.parametrize(("name", "p", "m"), GRID)
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("recompute", [False, True])
def test_columnar_program_equals_the_op_path(name: str, p: int, m: int, k: int, recompute: bool) -> None:
    profile = ragged_profile(p + 3)
    topology = Topology.uniform(num_devices=p, bandwidth="1GB/s", latency="5us")
    for update in ("minibatch", "microbatch") if name == "pipemare" else ("minibatch",):
        plan = plan_for(profile, name, p, m, k, recompute=recompute, pipemare_update=update)
        fast, reference = both_programs(profile, topology, plan)
        assert_same_program(fast, reference)
        assert_same_runs(fast, reference)


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
def test_columnar_program_equals_the_op_path_for_any_plan(case: tuple[Profile, Topology, Plan]) -> None:
    fast, reference = both_programs(*case)
    assert_same_program(fast, reference)
    assert_same_runs(fast, reference)


@pytest.mark.parametrize("name", NAMES)
def test_the_deferred_schedule_is_the_registry_schedule(name: str) -> None:
    p, m, k = 3, 4, 2
    order = columnar_order(name, p, m, k)
    schedule = order.schedule
    assert "ranks" not in schedule.__dict__  # nothing built yet
    assert (schedule.num_ranks, schedule.num_ops, schedule.has_split_backward) == (3, order.num_ops, False)
    assert "ranks" not in schedule.__dict__
    reference = build_schedule(name, p, m, num_minibatches=k)
    assert schedule == reference and reference == schedule and hash(schedule) == hash(reference)
    assert schedule.ranks == reference.ranks and "ranks" in schedule.__dict__
    assert schedule.to_dict() == reference.to_dict()
    validate(schedule)
    assert pickle.loads(pickle.dumps(columnar_order(name, p, m, k).schedule)) == reference
    assert dataclasses.replace(schedule, name="copy").ranks == reference.ranks
    with pytest.raises(AttributeError):
        _ = schedule.no_such_field  # type: ignore[attr-defined]


def test_program_readers_of_ops_build_them_on_demand() -> None:
    profile = uniform_profile(num_layers=8, forward_s=1 / 1024, backward_s=2 / 1024, activation_bytes=64.0)
    plan = plan_for(profile, "pipedream", 4, 6, 2)
    fast, reference = both_programs(profile, Topology.uniform(num_devices=4), plan)
    run_analytic(fast)  # the engines and memory need no Op objects
    assert "ranks" not in fast.schedule.__dict__
    assert fast.ranks == reference.ranks
    assert fast.versions == reference.versions


def test_other_schedules_and_bad_counts_keep_the_op_path() -> None:
    assert not is_columnar("zb-h1", 4, 8)
    assert not is_columnar("gpipe", 4, 8, num_ranks=2)
    assert not is_columnar("2bw", 4, 3)
    profile = uniform_profile(num_layers=8, forward_s=1e-3, backward_s=2e-3)
    program = prepare(profile, Topology.uniform(num_devices=4), plan_for(profile, "zb-h1", 4, 8, 1))
    assert not isinstance(program.schedule, DeferredSchedule)
    with pytest.raises(ConfigError, match="must be >= num_stages for 2bw"):
        prepare(profile, Topology.uniform(num_devices=4), plan_for(profile, "2bw", 4, 3, 2))


def test_a_time_that_is_not_finite_is_refused_as_on_the_op_path() -> None:
    from pipesim.engine.lowering import lower, lower_columnar

    profile = uniform_profile(num_layers=4, forward_s=1e-3, backward_s=2e-3, activation_bytes=8.0)
    topology = Topology.uniform(num_devices=4)
    fast = prepare(profile, topology, plan_for(profile, "1f1b", 4, 4, 1))
    costs = dataclasses.replace(fast.costs, backward_s=(2e-3, float("inf"), 2e-3, 2e-3))
    messages = []
    for run in (lambda: lower_columnar(columnar_order("1f1b", 4, 4, 1), costs, topology),
                lambda: lower(build_schedule("1f1b", 4, 4), costs, topology)):
        with pytest.raises(ConfigError, match="every op's time must be finite") as error:
            run()
        messages.append(str(error.value))
    assert messages[0] == messages[1]
