"""Order invariants of every registered schedule, and each invariant's checker catching a broken order."""

from __future__ import annotations


from hypothesis import given
from hypothesis import strategies as st
from strategies import ScheduleParams, schedule_params

from pipesim.schedule.invariants import (
    check_schedule,
    find_pipemare_violations,
    find_placement_violations,
    find_same_rank_dependency_violations,
    find_weight_violations,
    pipemare_discrepancy,
    versions_held,
)
from pipesim.schedule.ir import B, F, Op, OpKind, Schedule, U, WeightPolicy
from pipesim.schedule.validate import find_completeness_violations, find_deadlock, find_local_order_violations
from pipesim.schedule.versions import assign_versions


def with_rank(schedule: Schedule, rank: int, ops: list[Op]) -> Schedule:
    ranks = list(schedule.ranks)
    ranks[rank] = tuple(ops)
    return Schedule.from_ranks(schedule.name, schedule.num_stages, schedule.num_microbatches, schedule.num_minibatches,
                               ranks, schedule.stage_to_rank, schedule.weights)


def messages(violations: list) -> list[str]:  # type: ignore[type-arg]
    return [str(v) for v in violations]


@given(schedule_params())
def test_every_schedule_is_complete_ordered_and_deadlock_free(params: ScheduleParams) -> None:
    schedule = params.build()
    assert find_completeness_violations(schedule) == []
    assert find_local_order_violations(schedule) == []
    assert find_same_rank_dependency_violations(schedule) == []
    assert find_placement_violations(schedule, params.stages_per_rank) == []
    assert find_deadlock(schedule) == []
    assert check_schedule(schedule, stages_per_rank=params.stages_per_rank).is_valid


@given(schedule_params())
def test_every_schedule_keeps_its_weight_policy(params: ScheduleParams) -> None:
    schedule = params.build()
    plan = assign_versions(schedule)
    assert find_weight_violations(schedule, plan.version_of) == []
    held = versions_held(schedule, plan.version_of)
    p, total = params.num_stages, schedule.total_microbatches
    for stage in range(p):
        warmup = min(p - stage - 1, total)
        forward = [plan.version_of[F(stage, i)] for i in range(total)]
        if schedule.weights is WeightPolicy.FLUSH:  # gpipe, 1f1b and the schedules of issue 8
            assert held[stage] == 1
            # Never stale: minibatch t's forwards see exactly t updates.
            assert forward == [schedule.minibatch_of(i) for i in range(total)]
        elif params.name == "pipedream":
            # p - s versions once the pipeline fills (N >= 2w), never more.
            assert held[stage] == (warmup + 1 if total >= 2 * warmup else held[stage])
            assert held[stage] <= p - stage
            # Forward delay of microbatch i: the U consuming its gradient (update i) minus its F's version.
            for i in range(total):
                consumer = plan.consumed_by[(stage, i)]
                assert plan.version_of[consumer] - forward[i] == min(i, warmup)
        elif params.name == "2bw":
            assert held[stage] <= 2
            assert forward == [max(0, schedule.minibatch_of(i) - 1) for i in range(total)]
        else:
            assert held[stage] == 1
            update_every = params.num_microbatches if params.options["update"] == "minibatch" else 1
            assert find_pipemare_violations(schedule, plan.version_of, update_every) == []


def test_pipemare_closed_form_matches_its_summary() -> None:
    # The per-microbatch form gives the documented summary: min(i, w) per microbatch for u = 1,
    # at most ceil(w / m) and mean -> w / m for u = m.
    for p in range(1, 9):
        for stage in range(p):
            w = p - stage - 1
            assert [pipemare_discrepancy(p, stage, i, 64, 1) for i in range(64)] == [min(i, w) for i in range(64)]
            for m in range(1, 9):
                values = [pipemare_discrepancy(p, stage, i, 64 * m, m) for i in range(64 * m)]
                assert max(values) == -(-w // m)
                periods = (len(values) - w) // m  # over whole periods of m microbatches the mean is w / m
                assert sum(values[w:w + periods * m]) == periods * w


# --- each checker catches a broken order -------------------------------------------------------


@given(schedule_params(), st.data())
def test_a_dropped_op_is_reported_missing(params: ScheduleParams, data: st.DataObject) -> None:
    schedule = params.build()
    rank = data.draw(st.integers(0, schedule.num_ranks - 1))
    ops = [op for op in schedule.ranks[rank] if op.kind is not OpKind.U]
    dropped = data.draw(st.sampled_from(ops))
    broken = with_rank(schedule, rank, [op for op in schedule.ranks[rank] if op != dropped])
    found = find_completeness_violations(broken)
    assert any(v.op.startswith(str(dropped)) and v.message == "is missing" for v in found), messages(found)
    assert not check_schedule(broken).is_valid


@given(schedule_params(), st.data())
def test_a_duplicated_op_is_reported_at_its_second_cell(params: ScheduleParams, data: st.DataObject) -> None:
    schedule = params.build()
    rank = data.draw(st.integers(0, schedule.num_ranks - 1))
    ops = list(schedule.ranks[rank])
    copied = data.draw(st.sampled_from([op for op in ops if op.kind is not OpKind.U]))
    at = data.draw(st.integers(ops.index(copied) + 1, len(ops)))
    broken = with_rank(schedule, rank, ops[:at] + [copied] + ops[at:])
    found = find_completeness_violations(broken)
    assert (rank, at, str(copied), "appears more than once") in [(v.rank, v.position, v.op, v.message) for v in found]


@given(schedule_params(), st.data())
def test_a_backward_before_its_forward_is_reported(params: ScheduleParams, data: st.DataObject) -> None:
    schedule = params.build()
    rank = data.draw(st.integers(0, schedule.num_ranks - 1))
    ops = list(schedule.ranks[rank])
    backward = data.draw(st.sampled_from([op for op in ops if op.kind in (OpKind.B, OpKind.I)]))
    forward_at = ops.index(F(backward.stage, backward.microbatch))
    ops.remove(backward)
    ops.insert(forward_at, backward)
    found = find_local_order_violations(with_rank(schedule, rank, ops))
    assert [(v.rank, v.position, v.op) for v in found] == [(rank, forward_at, str(backward))]
    assert found[0].message == f"runs before {F(backward.stage, backward.microbatch)}"


def test_a_cross_rank_cycle_is_a_deadlock_naming_the_stuck_cells() -> None:
    schedule = ScheduleParams("gpipe", 2, 2, 1).build()
    # Rank 0 runs 0B0 before 0F1; rank 1 runs 1F1 (needs 0F1) before 1B0 (which 0B0 needs).
    broken = with_rank(schedule, 0, [F(0, 0), B(0, 0), F(0, 1), B(0, 1), U(0, 0)])
    assert find_completeness_violations(broken) == [] and find_local_order_violations(broken) == []
    found = find_deadlock(broken)
    assert [(v.rank, v.position, v.op) for v in found] == [(0, 1, "0B0"), (1, 1, "1F1")]
    assert "deadlock: waits for 1B0" in found[0].message


def test_a_stage_waiting_on_a_later_op_of_its_own_rank_is_named() -> None:
    # Two stages on one rank (a V placement): 1F0 placed before the 0F0 it needs.
    schedule = Schedule.from_ranks("custom", 2, 1, 1, ((F(1, 0), F(0, 0), B(1, 0), B(0, 0)),), (0, 0))
    found = find_same_rank_dependency_violations(schedule)
    assert [(v.rank, v.position, v.op) for v in found] == [(0, 0, "1F0")]
    assert "runs before 0F0" in found[0].message


def test_a_rank_with_the_wrong_number_of_stages_is_named() -> None:
    schedule = ScheduleParams("1f1b", 3, 3, 1).build()
    found = find_placement_violations(schedule, 2)
    assert [(v.rank, v.position) for v in found] == [(0, 0), (1, 0), (2, 0)]
    assert found[0].message == "rank 0 holds 1 stage(s) [0], expected 2"


def test_each_weight_policy_catches_a_wrong_version() -> None:
    cases = [
        # (schedule, op whose version is changed, new version, expected message part)
        (ScheduleParams("pipedream", 3, 3, 2).build(), B(0, 4), None, "but its forward ran on"),
        (ScheduleParams("gpipe", 2, 2, 2).build(), F(1, 2), 0, "stale"),
        (ScheduleParams("1f1b", 2, 2, 2).build(), B(0, 3), 0, "but its forward ran on 1"),
        (ScheduleParams("2bw", 2, 2, 3).build(), F(0, 5), 2, "minibatch 2 must run on version 1"),
        (ScheduleParams("pipemare", 3, 3, 2).build(), B(0, 3), 0, "current version is 1"),
    ]
    for schedule, op, version, expected in cases:
        versions = dict(assign_versions(schedule).version_of)
        versions[op] = versions[op] + 1 if version is None else version
        found = find_weight_violations(schedule, versions)
        assert any(v.op == str(op) and expected in v.message for v in found), (schedule.name, messages(found))


def test_too_many_versions_held_is_caught() -> None:
    schedule = ScheduleParams("2bw", 2, 2, 4).build()
    versions = dict(assign_versions(schedule).version_of)
    versions[B(0, 7)] = 0  # minibatch 3 runs on version 2; keeping 0 alive too makes 3 with the current one
    found = find_weight_violations(schedule, versions)
    assert any("holds 3 weight versions here, at most 2 allowed" in v.message for v in found), messages(found)
    single = ScheduleParams("pipemare", 2, 2, 2).build()
    versions = dict(assign_versions(single).version_of)
    versions[B(0, 3)] = 0
    assert any("at most 1 allowed" in v.message for v in find_weight_violations(single, versions))


def test_a_flush_order_with_an_update_inside_the_minibatch_is_caught() -> None:
    schedule = ScheduleParams("gpipe", 1, 2, 1).build()
    broken = with_rank(schedule, 0, [F(0, 0), U(0, 0), F(0, 1), B(0, 0), B(0, 1)])
    result = check_schedule(broken)
    assert [(v.rank, v.position, v.op) for v in result.violations] == [(0, 2, "0F1"), (0, 3, "0B0")]
    assert result.violations[0].message == "runs on version 1, but minibatch 0 must see 0 updates (flush)"
    assert result.violations[1].message == ("an update ran between its forward (version 0) and it; "
                                            "a flush schedule must not")


def test_a_wrong_pipemare_discrepancy_is_caught() -> None:
    schedule = ScheduleParams("pipemare", 4, 2, 3, {"update": "microbatch"}).build()
    versions = dict(assign_versions(schedule).version_of)
    versions[F(1, 4)] -= 1
    found = find_pipemare_violations(schedule, versions, 1)
    assert [v.op for v in found] == ["1B4"]
    assert found[0].message == "discrepancy 3, the closed form gives 2"


def test_policies_are_the_ones_the_registry_declares() -> None:
    expected = {"gpipe": WeightPolicy.FLUSH, "1f1b": WeightPolicy.FLUSH, "pipedream": WeightPolicy.STASH,
                "2bw": WeightPolicy.DOUBLE_BUFFER, "pipemare": WeightPolicy.SINGLE}
    for name, policy in expected.items():
        assert ScheduleParams(name, 2, 2, 1).build().weights is policy
