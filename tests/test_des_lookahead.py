"""The DES engine's lookahead mode against its strict mode: the same trace bit for bit, with fewer SimPy events."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from engine_strategies import Case, cases
from pipesim import Topology, uniform_profile
from pipesim.engine.analytic import run_analytic
from pipesim.engine.des import DesRun, run_des
from pipesim.engine.lowering import Program
from pipesim.engine.noise import DISTRIBUTIONS, draw_durations
from pipesim.engine.trace import MEMORY_COLUMNS, SPAN_COLUMNS, Trace
from pipesim.errors import DeadlockError
from pipesim.simulation import make_plan, prepare
from test_analytic import deadlocked_program

MODES = ({"lookahead": True, "compiled": True}, {"lookahead": True, "compiled": False})


def program_of(case: Case, *, shared: bool = False) -> Program:
    topology = case.topology
    if shared:  # every device's NIC shared by the flows leaving and entering it
        data = Topology.uniform(num_devices=len(topology.devices), bandwidth="1GB/s",
                                latency="5us").model_dump(by_alias=True)
        data["shared"] = True
        topology = Topology.model_validate(data)
    return prepare(case.profile, topology, make_plan(case.profile, **case.kwargs))


def assert_bit_equal(a: Trace, b: Trace) -> None:
    """Every span and memory column equal, float for float (not to a tolerance)."""
    for column in SPAN_COLUMNS:
        assert a.spans[column].dtype == b.spans[column].dtype, column
        assert np.array_equal(a.spans[column], b.spans[column]), column
    for column in MEMORY_COLUMNS:
        assert np.array_equal(a.memory[column], b.memory[column]), column
    assert a.info == b.info


def events_of(run: DesRun) -> int:
    """Step ``run`` to its end, counting SimPy events."""
    count = 0
    while run.next_event_s() < math.inf:
        run.step()
        count += 1
    return count


@given(cases(), st.sampled_from([0.0, 0.0, 0.25]), st.integers(0, 3))
def test_lookahead_gives_the_strict_trace_bit_for_bit(case: Case, jitter: float, seed: int) -> None:
    program = program_of(case)
    strict = run_des(program, jitter=jitter, seed=seed, lookahead=False)
    for mode in MODES:
        run = DesRun(program, jitter=jitter, seed=seed, **mode)
        assert run.lookahead
        assert_bit_equal(strict, run.finish())
    if jitter == 0:  # and both equal the analytic engine's trace (the same arithmetic, in the same order)
        analytic = run_analytic(program)
        for column in SPAN_COLUMNS:
            assert np.array_equal(strict.spans[column], analytic.spans[column]), column


@settings(max_examples=60)
@given(cases(max_stages=4), st.sampled_from(DISTRIBUTIONS), st.integers(0, 2**32 - 1))
def test_stochastic_samples_are_the_same_in_both_modes(case: Case, distribution: str, seed: int) -> None:
    """``--samples`` runs the DES on drawn durations: lookahead and strict agree on each draw."""
    program = program_of(case)
    durations = draw_durations(program, np.random.default_rng(seed), distribution=distribution,  # type: ignore[arg-type]
                               cv=0.3)
    strict = run_des(program, durations=durations, lookahead=False)
    for mode in MODES:
        assert_bit_equal(strict, DesRun(program, durations=durations, **mode).finish())
    assert_bit_equal(strict, run_des(program, durations=np.concatenate([np.asarray(row) for row in durations])))


@settings(max_examples=40)
@given(cases(max_stages=4, max_microbatches=6), st.sampled_from([0.0, 0.2]))
def test_shared_nics_always_run_strict(case: Case, jitter: float) -> None:
    """Contention makes arrivals depend on the order of events: those programs fall back to strict."""
    program = program_of(case, shared=True)
    event("shared paths" if program.shared_paths else "one device: no links")
    run = DesRun(program, jitter=jitter, seed=1, lookahead=True)
    assert run.lookahead == (not program.shared_paths)
    assert_bit_equal(run.finish(), run_des(program, jitter=jitter, seed=1, lookahead=False))
    assert_bit_equal(run_des(program, jitter=jitter, seed=1), run_des(program, jitter=jitter, seed=1, lookahead=False))


def one_f_one_b(p: int, m: int) -> Program:
    profile = uniform_profile(num_layers=p, forward_s=1e-3, backward_s=2e-3, activation_bytes=1e6, param_bytes=4e6)
    topology = Topology.uniform(num_devices=p, bandwidth="25Gbit/s", latency="5us")
    return prepare(profile, topology, make_plan(profile, schedule="1f1b", num_stages=p, num_microbatches=m))


@pytest.mark.parametrize("compiled", [True, False])
def test_lookahead_takes_about_half_an_event_per_op_and_its_clock_reaches_the_end(compiled: bool) -> None:
    program = one_f_one_b(8, 32)
    strict, ahead = DesRun(program), DesRun(program, lookahead=True, compiled=compiled)
    strict_events, ahead_events = events_of(strict), events_of(ahead)
    assert strict_events == program.ops.num_ops  # one event per op: its end
    # 1F1B: a rank runs about two ops (a B and an F) between waits on its neighbours.
    assert ahead_events < 0.6 * program.ops.num_ops
    makespan = strict.finish().makespan_s
    assert ahead.finish().makespan_s == makespan
    # SimPy's clock ends at the last op's end in both modes (its sums of delays may differ in the last bits).
    assert math.isclose(strict.env.now, makespan, rel_tol=1e-12)
    assert math.isclose(ahead.env.now, makespan, rel_tol=1e-12)


@pytest.mark.parametrize("compiled", [True, False])
def test_stepped_lookahead_only_computes_what_the_final_trace_holds(compiled: bool) -> None:
    program = one_f_one_b(4, 8)
    final = run_des(program, lookahead=False)
    rank, position = final.spans["device"], final.spans["position"]
    is_compute = final.spans["stream"] == 0
    expected = {(int(r), int(q), float(s), float(e)) for r, q, s, e, c in
                zip(rank, position, final.spans["start_s"], final.spans["end_s"], is_compute, strict=True) if c}
    run = DesRun(program, lookahead=True, compiled=compiled)
    seen = 0
    while True:
        done, _ = run.completed()
        assert set(done) <= expected
        # Lookahead: at every event, some ops are known beyond the clock, none before the ones it needs.
        assert len(done) >= seen
        seen = len(done)
        if run.next_event_s() == math.inf:
            break
        run.step()
    assert set(run.completed()[0]) == expected
    assert_bit_equal(run.finish(), final)


@pytest.mark.parametrize("compiled", [True, False])
def test_a_deadlock_names_the_same_stuck_ops_in_both_modes(compiled: bool) -> None:
    program = deadlocked_program()
    messages = []
    for run in (lambda: run_des(program, lookahead=False),
                lambda: DesRun(program, lookahead=True, compiled=compiled).finish()):
        with pytest.raises(DeadlockError) as caught:
            run()
        messages.append(caught.value.reason)
    assert messages[0] == messages[1]
    assert "rank 0 at 0B0 waits for 1B0" in messages[0]
