"""The analytic engine's kernels, compiled and as plain Python, against the numpy paths: same bits."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from hypothesis import given

from engine_strategies import Case, cases
from pipesim.engine.analytic import _solve_loop, _solve_rounds, solve_in_span_order
from pipesim.engine.assemble import op_starts
from pipesim.engine.memory import memory_columns
from pipesim.engine.trace import MEMORY_COLUMNS
from pipesim.simulation import make_plan, prepare


def same(a: npt.NDArray[np.generic], b: npt.NDArray[np.generic]) -> bool:
    """Equal bit for bit: same dtype, shape and bytes."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@given(cases())
def test_kernels_compiled_plain_and_numpy_give_identical_arrays(case: Case) -> None:
    program = prepare(case.profile, case.topology, make_plan(case.profile, **case.kwargs))
    ops = program.ops
    n = ops.num_ops
    spans, arrival, remote, stuck = solve_in_span_order(ops)
    assert not stuck
    start, end = spans["start_s"], spans["end_s"]
    plain_spans, plain_arrival, plain_remote, plain_stuck = solve_in_span_order(ops, compiled=False)
    assert not plain_stuck
    assert same(start, plain_spans["start_s"]) and same(end, plain_spans["end_s"])
    assert same(arrival, plain_arrival) and same(remote, plain_remote)
    assert same(remote, np.flatnonzero(ops.is_remote_send))
    for solve in (_solve_rounds, _solve_loop):
        other_end, other_arrival, other_stuck = solve(ops)
        assert not other_stuck
        assert same(end[:n], other_end) and same(arrival, other_arrival)
        starts, send_starts = op_starts(program, other_end, other_arrival)
        assert same(start[:n], starts)
        assert same(start[n:], send_starts[remote]) and same(end[n:], other_arrival[remote])

    numpy = memory_columns(program, end[:n], method="numpy")
    compiled = memory_columns(program, end[:n], method="kernel")
    plain = memory_columns(program, end[:n], method="kernel", compiled=False)
    for column in MEMORY_COLUMNS:
        assert same(compiled[column], numpy[column]), column
        assert same(plain[column], numpy[column]), column
