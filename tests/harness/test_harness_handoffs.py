"""Calibrated op times lose the hand-over to another rank where a prediction puts two consecutive stages on one rank."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pipesim import simulate, uniform_profile
from pipesim.engine.trace import KINDS
from pipesim.harness.breakdown import steady_ops, traced_ops
from pipesim.harness.handoffs import hand_off_parts, without_local_hand_offs
from pipesim.simulation import PreparedRun, make_plan, prepare
from pipesim.spec.topology import Topology

PROFILE = uniform_profile(num_layers=8, forward_s=1e-3, backward_s=2e-3, activation_bytes=0.0, param_bytes=0.0)
# (stage, calibrated kind) -> (span, receive part, send part), seconds
PARTS = {(s, k): (4e-3 if k == "F" else 8e-3, 1e-3, 2e-3) for s in range(4) for k in ("F", "B")}


def program_of(schedule: str) -> PreparedRun:
    plan = make_plan(PROFILE, schedule=schedule, num_stages=4, num_microbatches=4, num_minibatches=3,
                     stages_per_rank=2)
    return prepare(PROFILE, Topology.uniform(num_devices=2), plan)


def test_zbvs_ops_shed_the_hand_overs_between_its_two_stages_on_one_rank() -> None:
    program = program_of("zbv")
    table = program.ops
    ranks, stages = table.rank.tolist(), table.stage.tolist()
    assert dict(zip(stages, ranks)) == {0: 0, 1: 1, 2: 1, 3: 0}  # the V: stages 1 and 2 on rank 1
    before = np.array(table.duration_s, dtype=np.float64)
    after = without_local_hand_offs(program, before, PARTS)
    # By hand: on rank 1, stage 1's F sends to stage 2 and stage 2's F receives from it in memory;
    # stage 2's backward ops send their gradient to stage 1, whose backward ops receive it, in memory.
    # Stages 0 and 3 (rank 0) are not neighbours: every message of theirs crosses ranks.
    shed = {(1, "F"): 2e-3 / 4e-3, (2, "F"): 1e-3 / 4e-3, (2, "B"): 2e-3 / 8e-3, (1, "B"): 1e-3 / 8e-3}
    for index, kind_code in enumerate(table.kind.tolist()):
        kind = KINDS[kind_code]
        key = (stages[index], "F" if kind == "F" else "B")
        share = 0.0 if kind == "U" else shed.get(key, 0.0)
        assert after[index] == pytest.approx(before[index] * (1 - share)), (stages[index], kind)
    assert (after < before).any() and (after <= before).all()


def test_a_looped_placement_hands_every_message_to_another_rank_so_nothing_changes() -> None:
    program = program_of("interleaved-1f1b")
    before = np.array(program.ops.duration_s, dtype=np.float64)
    assert np.array_equal(without_local_hand_offs(program, before, PARTS), before)


def test_the_parts_are_the_steady_state_means_of_the_recorded_receive_and_send() -> None:
    trace = simulate(PROFILE, schedule="1f1b", num_stages=2, num_microbatches=4, num_minibatches=4).trace
    positions: dict[int, int] = {}
    for op in traced_ops(trace):
        positions[op.device] = max(positions.get(op.device, -1), op.position)
    receive = tuple(tuple(1e-4 * (1 + p % 3) for p in range(positions[d] + 1)) for d in sorted(positions))
    send = tuple(tuple(2e-4 for _ in range(positions[d] + 1)) for d in sorted(positions))
    recorded = dataclasses.replace(trace, info=dataclasses.replace(trace.info, compute_receive_s=receive,
                                                                   compute_send_s=send))
    parts = hand_off_parts([recorded])
    steady = [op for op in steady_ops(recorded) if op.kind == "F" and op.stage == 1]
    span, got_receive, got_send = parts[(1, "F")]
    assert span == pytest.approx(np.mean([op.duration_s for op in steady]))
    assert got_receive == pytest.approx(np.mean([op.receive_s for op in steady])) and got_send == pytest.approx(2e-4)
    assert set(parts) == {(0, "F"), (0, "B"), (1, "F"), (1, "B")}  # U has no hand-over
    # A simulated trace records no parts: nothing to shed.
    assert hand_off_parts([trace]) == {}


def test_a_calibration_on_one_rank_made_its_hand_overs_in_memory_so_nothing_is_shed_twice() -> None:
    """``--ranks 1``: the calibration's consecutive stages share the rank, their receive and send
    are the in-memory ones already; a prediction with the same placement keeps every op's time."""
    trace = simulate(PROFILE, schedule="interleaved-1f1b", num_stages=2, num_microbatches=4, num_minibatches=4,
                     stages_per_rank=2).trace
    assert {op.device for op in traced_ops(trace)} == {0}
    positions = max(op.position for op in traced_ops(trace)) + 1
    recorded = dataclasses.replace(trace, info=dataclasses.replace(
        trace.info, compute_receive_s=(tuple(1e-4 for _ in range(positions)),),
        compute_send_s=(tuple(2e-4 for _ in range(positions)),)))
    parts = hand_off_parts([recorded])
    # By hand: stage 0's F sends to stage 1 and its B receives from it, on rank 0 both; stage 1's F
    # receives from stage 0 and its B sends to it. What crosses no boundary (the first stage's
    # input, the last stage's output) stays.
    assert parts[(0, "F")][1:] == pytest.approx((1e-4, 0.0)) and parts[(1, "F")][1:] == pytest.approx((0.0, 2e-4))
    assert parts[(0, "B")][1:] == pytest.approx((0.0, 2e-4)) and parts[(1, "B")][1:] == pytest.approx((1e-4, 0.0))
    plan = make_plan(PROFILE, schedule="interleaved-1f1b", num_stages=2, num_microbatches=4, num_minibatches=3,
                     stages_per_rank=2)
    program = prepare(PROFILE, Topology.uniform(num_devices=1), plan)
    before = np.array(program.ops.duration_s, dtype=np.float64)
    assert np.array_equal(without_local_hand_offs(program, before, parts), before)
