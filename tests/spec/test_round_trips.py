"""The text form, the schedule's JSON and CSV, and the trace's JSON round trip as exact identities."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
from strategies import Case, ScheduleParams, cases, schedule_params

from pipesim.engine.trace import Trace
from pipesim.schedule.csv_format import from_csv, read_csv_schedule, to_csv
from pipesim.schedule.ir import Op, OpKind


@given(st.integers(0, 10**6), st.sampled_from(list(OpKind)), st.integers(0, 10**6))
def test_op_text_round_trips(stage: int, kind: OpKind, microbatch: int) -> None:
    op = Op(stage, kind, microbatch)
    assert Op.parse(str(op)) == op
    assert str(Op.parse(str(op))) == str(op)


@given(schedule_params())
def test_schedule_csv_and_json_round_trip(params: ScheduleParams) -> None:
    schedule = params.build()
    text = to_csv(schedule, include_updates=True)
    again = from_csv(text, name=schedule.name, num_microbatches=schedule.num_microbatches)
    assert (again.ranks, again.stage_to_rank, again.num_stages) == (schedule.ranks, schedule.stage_to_rank,
                                                                    schedule.num_stages)
    assert to_csv(again, include_updates=True) == text
    data = json.loads(json.dumps(schedule.to_dict()))
    assert data == schedule.to_dict()
    assert tuple(tuple(Op.parse(cell) for cell in row) for row in data["ranks"]) == schedule.ranks


@given(schedule_params())
def test_torch_style_cells_read_back_to_the_same_ops(params: ScheduleParams) -> None:
    # The same order with PyTorch's extra cells around it (idle steps, communication, FSDP and
    # gradient reduction) reads back to the same ops, and the columns point at the cells.
    schedule = params.build()
    rows = []
    for rank, ops in enumerate(schedule.ranks):
        cells = [f"{rank}UNSHARD"] + [""] * rank
        for op in ops:
            if op.kind is not OpKind.U:
                cells += [f"{op.stage}RECV_F{op.microbatch}", str(op), f"{op.stage}SEND_B{op.microbatch}"]
        rows.append(",".join([*cells, f"{rank}REDUCE_GRAD", f"{rank}RESHARD"]))
    parsed = read_csv_schedule("\n".join(rows) + "\n")
    compute = tuple(tuple(op for op in ops if op.kind is not OpKind.U) for ops in schedule.ranks)
    assert parsed.schedule.ranks == compute
    for rank, ops in enumerate(compute):
        assert [rows[rank].split(",")[column] for column in parsed.columns[rank]] == [str(op) for op in ops]


@given(cases())
def test_trace_json_round_trips(case: Case) -> None:
    _, trace = case.run()
    text = trace.to_json()
    again = Trace.from_json(text)
    assert again.equals(trace)
    assert again.to_json() == text
