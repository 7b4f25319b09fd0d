"""Op times by context (the kind of the op before on the rank): measured from traces, given back to each op."""

from __future__ import annotations

import numpy as np
import pytest

from pipesim import uniform_profile
from pipesim.engine.trace import KINDS
from pipesim.harness.op_context import MIN_CONTEXT_OPS, context_of, context_times, in_context
from pipesim.simulation import PreparedRun, make_plan, prepare, run_program
from pipesim.spec.topology import Topology


def program_of(schedule: str, num_microbatches: int = 4, num_minibatches: int = 4) -> PreparedRun:
    profile = uniform_profile(num_layers=4, forward_s=1e-3, backward_s=2e-3, activation_bytes=0.0, param_bytes=0.0)
    plan = make_plan(profile, schedule=schedule, num_stages=2, num_microbatches=num_microbatches,
                     num_minibatches=num_minibatches)
    return prepare(profile, Topology.uniform(num_devices=2), plan)


def contexts(program: PreparedRun) -> list[tuple[int, str, str]]:
    """Each op's (stage, kind, context), written out from the op table (a test oracle)."""
    table, keys = program.ops, []
    for index in range(len(table.kind)):
        same_rank = index > 0 and table.rank[index - 1] == table.rank[index]
        previous = KINDS[int(table.kind[index - 1])] if same_rank else ""
        keys.append((int(table.stage[index]), KINDS[int(table.kind[index])], {"I": "B", "W": "B"}.get(previous,
                                                                                                     previous)))
    return keys


def test_a_split_backward_counts_as_a_backward_and_a_rank_s_first_op_has_no_context() -> None:
    assert [context_of(kind) for kind in ("F", "B", "I", "W", "U", "")] == ["F", "B", "B", "B", "U", ""]


def test_op_times_measured_in_their_context_are_given_back_to_each_op_of_another_order() -> None:
    """A run whose F after a B lasts 1.3x its F after an F (1F1B and GPipe orders together): the
    times by context come back exactly, and a third schedule's ops each get their own context's."""
    runs = []
    for schedule in ("gpipe", "1f1b"):
        program = program_of(schedule)
        durations = np.array(program.ops.duration_s, copy=True)
        slower = np.array([kind == "F" and context == "B" for _, kind, context in contexts(program)])
        durations[slower] *= 1.3
        runs.append(run_program(program, durations_s=durations))
    times = context_times(runs)
    assert times[(0, "F", "F")] == pytest.approx(2e-3) and times[(0, "F", "B")] == pytest.approx(2.6e-3)
    assert times[(1, "B", "F")] == pytest.approx(4e-3) and times[(1, "B", "B")] == pytest.approx(4e-3)
    # The last stage of GPipe and 1F1B runs an F after a U once per minibatch: 4 in all, just enough.
    assert MIN_CONTEXT_OPS == 4 and times[(1, "F", "U")] == pytest.approx(2e-3)
    target = program_of("2bw")
    given = in_context(target, times)
    for index, key in enumerate(contexts(target)):
        expected = times.get(key, float(target.ops.duration_s[index]))
        assert given[index] == pytest.approx(expected), key
    assert np.isclose(given, 2.6e-3).sum() > 0  # 2BW runs F after B: they take the slower time


def test_a_context_seen_too_rarely_is_left_to_the_lowered_duration() -> None:
    run = run_program(program_of("gpipe", num_microbatches=2, num_minibatches=3))
    assert context_times([run]) == {}  # one steady minibatch of 2 microbatches: at most 2 ops a context
    target = program_of("1f1b")
    assert np.array_equal(in_context(target, {}), target.ops.duration_s)
