"""The analytic engine against the DES engine: the same spans and metrics on every generated case.

Both engines run one timing kernel (``kernel.advance``), so their agreement checks the plumbing
around it (worklist against SimPy's wake-ups, assembly, metrics), not the timing itself: a wrong
recurrence in the kernel would agree with itself. The independent timing checks are the reference
list scheduler (test_engine_model.py) and the closed forms (test_closed_forms*.py)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine_strategies import ALL_SCHEDULE_NAMES, Case, cases, shapes
from pipesim import ConfigError, ScheduleError, Topology, build_schedule, simulate, uniform_profile
from pipesim.engine.analytic import analytic_unsupported, run_analytic
from pipesim.engine.des import run_des
from pipesim.engine.lowering import lower
from pipesim.engine.trace import MEMORY_COLUMNS, SPAN_COLUMNS, Trace
from pipesim.errors import DeadlockError
from pipesim.metrics import compute_metrics
from pipesim.schedule.deps import backward_kinds, dependencies
from pipesim.schedule.ir import OpKind, Schedule
from pipesim.schedule.versions import assign_versions
from pipesim.simulation import make_plan, prepare
from pipesim.spec.stages import stage_costs

REL = 1e-9


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL, abs_tol=1e-15) or (math.isinf(a) and a == b)


def assert_traces_agree(des: Trace, analytic: Trace) -> None:
    """Same spans in the same order (times to 1e-9 relative) and the same memory events."""
    for column in SPAN_COLUMNS:
        a, b = des.spans[column], analytic.spans[column]
        assert a.shape == b.shape, column
        if column in ("start_s", "end_s", "bytes"):
            assert np.allclose(a, b, rtol=REL, atol=1e-15), column
        else:
            assert np.array_equal(a, b), column
    for column in MEMORY_COLUMNS:
        a, b = des.memory[column], analytic.memory[column]
        assert np.allclose(a, b, rtol=REL, atol=1e-15) if a.dtype.kind == "f" else np.array_equal(a, b), column


def assert_same_values(a: Any, b: Any, where: str = "metrics") -> None:
    """Recursive equality of metric dicts, floats to 1e-9 relative."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same_values(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_values(x, y, f"{where}[{index}]")
    elif isinstance(a, float):
        assert close(a, b), (where, a, b)
    else:
        assert a == b, (where, a, b)


def program_of(case: Case):  # type: ignore[no-untyped-def]
    plan = make_plan(case.profile, **case.kwargs)
    return prepare(case.profile, case.topology, plan)


@given(cases())
def test_both_engines_plumb_the_shared_kernel_to_the_same_spans_and_metrics(case: Case) -> None:
    """Plumbing, not timing: the worklist and the DES's wake-ups drive the same kernel alike."""
    program = program_of(case)
    des = run_des(program)
    analytic = run_analytic(program)
    assert analytic.info.engine == "analytic"
    assert_traces_agree(des, analytic)
    metrics_des = compute_metrics(des).to_dict()
    metrics_analytic = compute_metrics(analytic).to_dict()
    assert metrics_des.pop("engine") == "des" and metrics_analytic.pop("engine") == "analytic"
    assert_same_values(metrics_des, metrics_analytic)


@given(st.sampled_from(ALL_SCHEDULE_NAMES).flatmap(lambda name: st.tuples(st.just(name), shapes(name))),
       st.integers(1, 3))
def test_columns_match_the_per_op_rules(shape: tuple[str, tuple[int, int, int]], k: int) -> None:
    """The OpTable's versions, inputs and send targets are those of assign_versions,
    dependencies and sends_to (several stages per rank and mixed B and I/W included)."""
    from pipesim.schedule.deps import sends_to

    name, (p, per_rank, m) = shape
    schedule = build_schedule(name, p, m, num_minibatches=k, num_ranks=p // per_rank)
    profile = uniform_profile(num_layers=p, forward_s=1e-3, backward_s=2e-3)
    topology = Topology.uniform(num_devices=schedule.num_ranks)
    plan = make_plan(profile, schedule=name, num_stages=p, num_microbatches=m, num_minibatches=k,
                     stages_per_rank=per_rank)
    program = lower(schedule, stage_costs(profile, plan, topology, stage_devices=schedule.stage_to_rank), topology)
    versions = assign_versions(schedule).version_of
    grad = backward_kinds(schedule)
    flat = [op for ops in schedule.ranks for op in ops]
    table = program.ops
    for g, op in enumerate(flat):
        assert table.version[g] == versions[op], op
        waits = [dep for dep in dependencies(op, p, grad) if dep.stage != op.stage]
        assert ([flat[table.wait[g]]] if table.wait[g] >= 0 else []) == waits, op
        target = sends_to(op, p, grad)
        assert table.send_rank[g] == (-1 if target is None else schedule.stage_to_rank[target]), op
    assert [row.op for ops in program.ranks for row in ops] == flat


def deadlocked_program():  # type: ignore[no-untyped-def]
    """Two stages that wait for each other: rank 0 runs 0B0 (needs 1B0) before 0F0 (which 1F0 needs)."""
    good = build_schedule("gpipe", 2, 1)
    rank0 = (good.ranks[0][1], good.ranks[0][0], *good.ranks[0][2:])
    bad = Schedule.from_ranks(name="custom", num_stages=2, num_microbatches=1, num_minibatches=1,
                              ranks=(rank0, good.ranks[1]), stage_to_rank=good.stage_to_rank)
    profile = uniform_profile(num_layers=2, forward_s=1e-3, backward_s=2e-3)
    topology = Topology.uniform(num_devices=2)
    plan = make_plan(profile, schedule="gpipe", num_stages=2, num_microbatches=1)
    return lower(bad, stage_costs(profile, plan, topology), topology, check=False)


def test_auto_picks_analytic_with_or_without_jitter_and_gives_the_des_bits() -> None:
    profile = uniform_profile(num_layers=4, forward_s=1e-3, backward_s=2e-3, activation_bytes=1e6)
    topology = Topology.uniform(num_devices=4, bandwidth="10GB/s", latency="5us")
    plain = simulate(profile, topology, schedule="1f1b", num_stages=4, num_microbatches=8, engine="auto")
    noisy = simulate(profile, topology, schedule="1f1b", num_stages=4, num_microbatches=8, engine="auto",
                     jitter=0.1, seed=3)
    assert plain.metrics.engine == "analytic" and noisy.metrics.engine == "analytic"
    assert plain.to_dict()["num_ops"] == 4 * (2 * 8 + 1)
    # Jitter is drawn up front: the analytic engine gives the DES engine's trace.
    des = simulate(profile, topology, schedule="1f1b", num_stages=4, num_microbatches=8, engine="des",
                   jitter=0.1, seed=3)
    assert des.metrics.engine == "des"
    assert np.array_equal(des.trace.spans["end_s"], noisy.trace.spans["end_s"])
    assert not np.array_equal(plain.trace.spans["end_s"], noisy.trace.spans["end_s"])
    program = prepare(profile, topology, make_plan(profile, schedule="1f1b", num_stages=4, num_microbatches=8))
    assert analytic_unsupported(program) is None


def test_version_errors_are_those_of_assign_versions() -> None:
    schedule = build_schedule("2bw", 3, 3, num_minibatches=2)
    broken = Schedule.from_ranks(name="custom", num_stages=3, num_microbatches=2, num_minibatches=3,
                                 ranks=schedule.ranks, stage_to_rank=schedule.stage_to_rank, weights=schedule.weights)
    profile = uniform_profile(num_layers=3, forward_s=1e-3, backward_s=2e-3)
    topology = Topology.uniform(num_devices=3)
    plan = make_plan(profile, schedule="2bw", num_stages=3, num_microbatches=3)
    with pytest.raises(ScheduleError) as expected:
        assign_versions(broken)
    with pytest.raises(ScheduleError) as got:
        lower(broken, stage_costs(profile, plan, topology), topology, check=False)
    assert got.value.reason == expected.value.reason


def reference_memory(program, end_s: list[list[float]],  # type: ignore[no-untyped-def]
                     start_s: list[list[float]]) -> list[tuple[float, int, int, int, float, int]]:
    """The memory events op by op, as a plain walk over the ops in order of (end, rank, position),
    with each recomputing backward's working bytes (category 4) taken at its start (ends first at
    one instant) and given back at its end, after the end's activation event."""
    costs, schedule = program.costs, program.schedule
    rows = []
    for stage in range(schedule.num_stages):
        device = schedule.stage_to_rank[stage]
        params = costs.param_bytes[stage]
        rows += [(0.0, device, stage, 0, params, 1), (0.0, device, stage, 1, params, 1),
                 (0.0, device, stage, 2, params * program.info.optimizer_state_multiplier, 1)]
    working = costs.working_bytes or [0.0] * schedule.num_stages
    order = sorted([(end, 0, r, j) for r, ends in enumerate(end_s) for j, end in enumerate(ends)]
                   + [(start, 1, r, j) for r, starts in enumerate(start_s) for j, start in enumerate(starts)])
    kept = costs.weight_stash_bytes or costs.stash_bytes
    last_use = program.versions.last_use
    latest = [0] * schedule.num_stages
    ended: set[tuple[int, int]] = set()
    for end, is_start, r, j in order:
        row = program.ranks[r][j]
        op, stage = row.op, row.op.stage
        stash = costs.stash_bytes[stage]
        if is_start:
            if op.kind in (OpKind.B, OpKind.I) and working[stage]:
                rows.append((end, r, stage, 4, working[stage], 0))
            continue
        if op.kind is OpKind.F:
            rows.append((end, r, stage, 3, stash, 1))
        elif op.kind is OpKind.B:
            rows.append((end, r, stage, 3, -stash, -1))
        elif op.kind is OpKind.I and kept[stage] != stash:  # W frees what I keeps
            rows.append((end, r, stage, 3, kept[stage] - stash, 0))
        elif op.kind is OpKind.W:
            rows.append((end, r, stage, 3, -kept[stage], -1))
        if op.kind in (OpKind.B, OpKind.I) and working[stage]:
            rows.append((end, r, stage, 4, -working[stage], 0))
        if not program.keeps_versions:
            continue
        if op.kind is OpKind.U:
            latest[stage] = row.version + 1
            rows.append((end, r, stage, 0, costs.param_bytes[stage], 1))
            if (stage, row.version) in ended or (stage, row.version) not in last_use:
                rows.append((end, r, stage, 0, -costs.param_bytes[stage], -1))
        elif last_use.get((stage, row.version)) == op:
            ended.add((stage, row.version))
            if row.version < latest[stage]:
                rows.append((end, r, stage, 0, -costs.param_bytes[stage], -1))
    return rows


@given(cases())
def test_memory_events_match_a_walk_over_the_ops(case: Case) -> None:
    program = program_of(case)
    trace = run_analytic(program)
    offsets = program.ops.rank_offsets.tolist()
    ends = trace.spans["end_s"][: program.ops.num_ops].tolist()
    starts = trace.spans["start_s"][: program.ops.num_ops].tolist()
    per_rank = [ends[offsets[r]:offsets[r + 1]] for r in range(program.ops.num_ranks)]
    starts_per_rank = [starts[offsets[r]:offsets[r + 1]] for r in range(program.ops.num_ranks)]
    m = trace.memory
    got = list(zip(*(m[c].tolist() for c in MEMORY_COLUMNS), strict=True))
    assert got == reference_memory(program, per_rank, starts_per_rank)
