"""Time and memory invariants of every DES run, and each checker catching a broken trace."""

from __future__ import annotations

import functools

import numpy as np
from hypothesis import given
from reference_scheduler import ReferenceScheduler
from strategies import Case, cases

from pipesim.engine.analytic import run_analytic
from pipesim.engine.des import run_des
from pipesim.engine.lowering import Program, lower
from pipesim.engine.trace import KINDS, STREAMS, Trace
from pipesim.metrics import compute_metrics
from pipesim.schedule.csv_format import from_csv
from pipesim.schedule.invariants import check_schedule, find_weight_violations, versions_held
from pipesim.simulation import make_plan, prepare
from pipesim.spec.plan import Plan
from pipesim.spec.profile import Profile, uniform_profile
from pipesim.spec.stages import stage_costs
from pipesim.spec.topology import Topology
from pipesim.spec.validation import build
from trace_invariants import (
    find_duration_mismatches,
    find_early_starts,
    find_idle_waits,
    find_memory_floor_violations,
    find_missing_spans,
    find_overlaps,
    find_stash_mismatches,
    find_trace_violations,
    versions_from_trace,
)

COMPUTE, SEND = STREAMS.index("compute"), STREAMS.index("send")


@given(cases())
def test_every_run_meets_the_time_and_memory_invariants(case: Case) -> None:
    program, trace = case.run()
    assert find_trace_violations(program, trace) == []
    assert find_trace_violations(program, run_analytic(program)) == []  # the fast path too
    # The versions the engine recorded obey the schedule's policy.
    assert find_weight_violations(program.schedule, versions_from_trace(trace)) == []
    held = versions_held(program.schedule, program.versions.version_of)
    for stage in compute_metrics(trace).stages:
        assert stage.weight_versions_max <= held[stage.stage]


# --- each checker catches a broken trace -------------------------------------------------------


@functools.cache
def sample_run(name: str = "1f1b") -> tuple[Program, Trace]:
    """p = 3, m = 4 on a 1 GB/s link with 10 us latency: every stage waits on some transfer."""
    profile = uniform_profile(num_layers=3, forward_s=1e-3, backward_s=2e-3, activation_bytes=1e6, param_bytes=4e6)
    plan = make_plan(profile, schedule=name, num_stages=3, num_microbatches=4)
    program = prepare(profile, Topology.uniform(num_devices=3, bandwidth="1GB/s", latency="10us"), plan)
    return program, run_des(program)


def row_of(trace: Trace, stream: int, op: str) -> int:
    s = trace.spans
    for row in range(trace.num_spans):
        if int(s["stream"][row]) == stream and f"{s['stage'][row]}{KINDS[s['kind'][row]]}{s['microbatch'][row]}" == op:
            return row
    raise KeyError(op)


def with_spans(trace: Trace, row: int, **values: float) -> Trace:
    spans = {column: array.copy() for column, array in trace.spans.items()}
    for column, value in values.items():
        spans[column][row] = value
    return Trace(info=trace.info, spans=spans, memory=trace.memory)


def without_row(trace: Trace, table: str, row: int) -> Trace:
    data = {column: np.delete(array, row) for column, array in getattr(trace, table).items()}
    return Trace(info=trace.info, spans=data if table == "spans" else trace.spans,
                 memory=data if table == "memory" else trace.memory)


def test_the_sample_run_is_clean() -> None:
    assert find_trace_violations(*sample_run()) == []


def test_a_missing_span_is_caught() -> None:
    program, trace = sample_run()
    broken = without_row(trace, "spans", row_of(trace, COMPUTE, "1B2"))
    assert [(v.rank, v.position, v.op) for v in find_missing_spans(program, broken)] == [(1, 6, "1B2")]


def test_overlapping_spans_are_caught() -> None:
    program, trace = sample_run()
    row = row_of(trace, COMPUTE, "2F1")
    start = float(trace.spans["start_s"][row_of(trace, COMPUTE, "2B0")])  # 2B0 is right before 2F1
    broken = with_spans(trace, row, start_s=start + 1e-4)
    found = find_overlaps(broken)
    assert [(v.rank, v.op) for v in found] == [(2, "2F1")]
    assert "before 2B0 ends" in found[0].message


def test_a_start_before_the_input_arrives_is_caught() -> None:
    program, trace = sample_run()
    row = row_of(trace, COMPUTE, "1F0")
    produced = float(trace.spans["end_s"][row_of(trace, COMPUTE, "0F0")])
    duration = float(trace.spans["end_s"][row] - trace.spans["start_s"][row])
    broken = with_spans(trace, row, start_s=produced, end_s=produced + duration)  # as if the link were free
    found = find_early_starts(program, broken)
    assert {v.op for v in found} == {"1F0"}
    assert any("0F0 ends plus its link time" in v.message for v in found)


def test_an_idle_device_with_a_ready_op_is_caught() -> None:
    program, trace = sample_run()
    row = row_of(trace, COMPUTE, "0U0")  # the last op on rank 0: delaying it breaks nothing else
    broken = with_spans(trace, row, start_s=trace.spans["start_s"][row] + 1e-3, end_s=trace.spans["end_s"][row] + 1e-3)
    found = find_idle_waits(program, broken)
    assert [(v.rank, v.position, v.op) for v in found] == [(0, 8, "0U0")]
    assert "although it is ready" in found[0].message
    assert find_early_starts(program, broken) == [] and find_overlaps(broken) == []


def test_an_idle_link_is_caught() -> None:
    program, trace = sample_run()
    row = row_of(trace, SEND, "2B3")
    broken = with_spans(trace, row, start_s=trace.spans["start_s"][row] + 1e-5, end_s=trace.spans["end_s"][row] + 1e-5)
    found = find_idle_waits(program, broken)
    late = float(broken.spans["start_s"][row])
    assert [(v.op, v.message.split(",")[0]) for v in found] == [("2B3", f"its send starts at {late!r} s")]


def test_a_wrong_duration_is_caught() -> None:
    program, trace = sample_run()
    row = row_of(trace, COMPUTE, "1B1")
    broken = with_spans(trace, row, end_s=trace.spans["end_s"][row] - 1e-4)
    assert [v.op for v in find_duration_mismatches(program, broken)] == ["1B1"]


def test_a_stash_count_that_disagrees_with_the_spans_is_caught() -> None:
    program, trace = sample_run()
    m = trace.memory
    frees = np.flatnonzero((m["stage"] == 1) & (m["category"] == 3) & (m["delta_count"] == -1))
    broken = without_row(trace, "memory", int(frees[0]))  # the engine "forgets" to free 1B0's stash
    found = find_stash_mismatches(broken)
    assert [v.op for v in found] == ["stage 1"]
    assert "but F done minus B done is" in found[0].message


def test_a_peak_below_weights_and_optimizer_state_is_caught() -> None:
    program, trace = sample_run()
    m = trace.memory
    weights, optimizer = np.flatnonzero((m["stage"] == 0) & ((m["category"] == 0) | (m["category"] == 2)))
    broken = without_row(without_row(trace, "memory", int(optimizer)), "memory", int(weights))
    found = find_memory_floor_violations(broken)
    assert [v.op for v in found] == ["stage 0"]
    assert "is below weights + optimizer state 8000000.0 B" in found[0].message


def test_a_recorded_version_that_breaks_stashing_is_caught() -> None:
    program, trace = sample_run("pipedream")
    row = row_of(trace, COMPUTE, "0B7")
    broken = with_spans(trace, row, weight_version=trace.spans["weight_version"][row] + 1)
    found = find_weight_violations(program.schedule, versions_from_trace(broken))
    assert [v.op for v in found] == ["0B7"]
    assert "but its forward ran on" in found[0].message


# DualPipeV, p = 2, m = 4, as torch 2.13's _dump_csv(format="compute_only") writes it: V placement
# (rank 0 holds stages 0 and 3), overlapped F/B pairs, and stages that finish some microbatches with
# a full B and others with I then W.
DUALPIPEV_CSV = (
    "0F0,0F1,0F2,3F0,3I0,3W0,3F1,(0F3;3B1)OVERLAP_F_B,(3F2;0B0)OVERLAP_F_B,3B2,(3F3;0B1)OVERLAP_F_B,3B3,"
    "0I2,0W2,0I3,0W3\n"
    "1F0,2F0,1F1,2F1,1F2,2B0,(2F2;1B0)OVERLAP_F_B,(1F3;2B1)OVERLAP_F_B,(2F3;1B1)OVERLAP_F_B,2B2,1B2,2I3,1I3,"
    "2W3,1W3\n"
)


def test_a_dualpipev_order_with_mixed_backwards_runs_clean() -> None:
    schedule = from_csv(DUALPIPEV_CSV)
    assert check_schedule(schedule, stages_per_rank=2).is_valid
    layer = {"forward_s": 2.0 ** -10, "backward_s": 2.0 ** -9, "backward_input_s": 2.0 ** -10,
             "backward_weight_s": 2.0 ** -10, "activation_bytes": 1024.0, "param_bytes": 4096.0}
    profile = build(Profile, {"layers": [dict(layer, name=f"l{index}") for index in range(4)]})
    plan = build(Plan, {"schedule": "gpipe", "num_stages": 4, "num_microbatches": 4, "stages_per_rank": 2,
                        "placement": list(schedule.stage_to_rank)})
    topology = Topology.uniform(num_devices=2, bandwidth=2.0 ** 20, latency=2.0 ** -12)
    program = lower(schedule, stage_costs(profile, plan, topology), topology)
    trace = run_des(program)
    assert find_trace_violations(program, trace) == []
    assert find_trace_violations(program, run_analytic(program)) == []
    # The gradient of (2, 0) comes from 2B0 and the one of (2, 3) from 2I3: 1B0 and 1I3 wait for them.
    waits = {str(lowered.op): [str(dep) for dep in lowered.waits_for] for lowered in program.ranks[1]}
    assert waits["1B0"] == ["2B0"] and waits["1I3"] == ["2I3"]
    assert trace.makespan_s == max(t.end_s for t in ReferenceScheduler(program.ranks).run())
