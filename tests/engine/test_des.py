"""The DES engine against the analytic one, its events and stepping.

Both engines run the same kernel (``kernel.advance``), so their bit-for-bit agreement checks the
plumbing (SimPy's wake-ups, drawn durations, shared NICs) and the compiled form against the plain
one, not the timing: the reference scheduler (test_engine_model.py) and the closed forms check that."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from engine_strategies import Case, cases
from pipesim import Topology, jit, uniform_profile
from pipesim.engine.analytic import run_analytic
from pipesim.engine.des import DesRun, run_des
from pipesim.engine.lowering import Program
from pipesim.engine.noise import DISTRIBUTIONS, draw_durations
from pipesim.engine.trace import MEMORY_COLUMNS, SPAN_COLUMNS, Trace
from pipesim.errors import DeadlockError
from pipesim.simulation import make_plan, prepare
from test_analytic import deadlocked_program

COMPILED = (True, False) if jit.AVAILABLE else (False,)


def program_of(case: Case, *, shared: bool = False) -> Program:
    topology = case.topology
    if shared:  # every device's NIC shared by the flows leaving and entering it
        data = Topology.uniform(num_devices=len(topology.devices), bandwidth="1GB/s",
                                latency="5us").model_dump(by_alias=True)
        data["shared"] = True
        topology = Topology.model_validate(data)
    return prepare(case.profile, topology, make_plan(case.profile, **case.kwargs))


def assert_bit_equal(a: Trace, b: Trace, *, meta: bool = True) -> None:
    """Every span and memory column equal, float for float (not to a tolerance), and the meta."""
    for column in SPAN_COLUMNS:
        assert a.spans[column].dtype == b.spans[column].dtype, column
        assert np.array_equal(a.spans[column], b.spans[column]), column
    for column in MEMORY_COLUMNS:
        assert np.array_equal(a.memory[column], b.memory[column]), column
    if meta:
        assert a.info == b.info


def events_of(run: DesRun) -> int:
    """Step ``run`` to its end, counting SimPy events."""
    count = 0
    while run.next_event_s() < math.inf:
        run.step()
        count += 1
    return count


@given(cases(), st.sampled_from([0.0, 0.0, 0.25]), st.integers(0, 3))
def test_des_plumbing_gives_the_analytic_trace_bit_for_bit(case: Case, jitter: float, seed: int) -> None:
    """Plumbing and compiled-against-plain agreement of one kernel (not an independent timing check).
    Jitter is drawn up front, so the analytic engine runs it too; meta differs only in the engine."""
    program = program_of(case)
    des = run_des(program, jitter=jitter, seed=seed)
    for compiled in COMPILED:
        assert_bit_equal(des, DesRun(program, jitter=jitter, seed=seed, compiled=compiled).finish())
        analytic = run_analytic(program, jitter=jitter, seed=seed, compiled=compiled)
        assert_bit_equal(des, analytic, meta=False)
        assert analytic.info.engine == "analytic" and des.info.engine == "des"


@settings(max_examples=60)
@given(cases(max_stages=4), st.sampled_from(DISTRIBUTIONS), st.integers(0, 2**32 - 1))
def test_stochastic_samples_are_plumbed_alike_on_both_engines(case: Case, distribution: str, seed: int) -> None:
    """``--samples`` runs on drawn durations, per rank or flat: each draw gives one trace (plumbing)."""
    program = program_of(case)
    durations = draw_durations(program, np.random.default_rng(seed), distribution=distribution,  # type: ignore[arg-type]
                               cv=0.3)
    des = run_des(program, durations=durations)
    assert_bit_equal(des, run_des(program, durations=np.concatenate([np.asarray(row) for row in durations])))
    assert_bit_equal(des, run_analytic(program, durations=durations), meta=False)


@settings(max_examples=40)
@given(cases(max_stages=4, max_microbatches=6), st.sampled_from([0.0, 0.2]))
def test_shared_nics_run_the_same_with_the_compiled_and_the_plain_kernel(case: Case, jitter: float) -> None:
    """Sends over shared NICs take SimPy's network processes; the kernel's form does not change a bit."""
    program = program_of(case, shared=True)
    event("shared paths" if program.shared_paths else "one device: no links")
    runs = [run_des(program, jitter=jitter, seed=1, compiled=compiled) for compiled in COMPILED]
    for run in runs[1:]:
        assert_bit_equal(runs[0], run)


def one_f_one_b(p: int, m: int) -> Program:
    profile = uniform_profile(num_layers=p, forward_s=1e-3, backward_s=2e-3, activation_bytes=1e6, param_bytes=4e6)
    topology = Topology.uniform(num_devices=p, bandwidth="25Gbit/s", latency="5us")
    return prepare(profile, topology, make_plan(profile, schedule="1f1b", num_stages=p, num_microbatches=m))


@pytest.mark.parametrize("compiled", COMPILED)
def test_about_half_an_event_per_op_and_the_clock_reaches_the_end(compiled: bool) -> None:
    program = one_f_one_b(8, 32)
    run = DesRun(program, compiled=compiled)
    # 1F1B: a rank runs about two ops (a B and an F) between waits on its neighbours.
    assert events_of(run) < 0.6 * program.ops.num_ops
    makespan = run.finish().makespan_s
    assert makespan == run_analytic(program).makespan_s
    # SimPy's clock ends at the last op's end (its sums of delays may differ in the last bits).
    assert math.isclose(run.env.now, makespan, rel_tol=1e-12)


@pytest.mark.parametrize("compiled", COMPILED)
def test_stepping_only_computes_what_the_final_trace_holds(compiled: bool) -> None:
    program = one_f_one_b(4, 8)
    final = run_analytic(program)
    rank, position = final.spans["device"], final.spans["position"]
    is_compute = final.spans["stream"] == 0
    expected = {(int(r), int(q), float(s), float(e)) for r, q, s, e, c in
                zip(rank, position, final.spans["start_s"], final.spans["end_s"], is_compute, strict=True) if c}
    run = DesRun(program, compiled=compiled)
    seen = 0
    while True:
        done, _ = run.completed()
        assert set(done) <= expected
        # Once the events due now are processed, every op that ends by the clock is known (and
        # some beyond it: lookahead).
        by_now = {span for span in expected if span[3] <= run.env.now}
        if run.next_event_s() > run.env.now:
            assert set(run.completed(until_s=run.env.now)[0]) == by_now
        assert len(done) >= seen
        seen = len(done)
        if run.next_event_s() == math.inf:
            break
        run.step()
    assert set(run.completed()[0]) == expected
    assert_bit_equal(run.finish(), final, meta=False)


@pytest.mark.parametrize("compiled", COMPILED)
def test_a_deadlock_names_the_same_stuck_ops_on_both_engines(compiled: bool) -> None:
    program = deadlocked_program()
    messages = []
    for run in (lambda: run_analytic(program, compiled=compiled), lambda: run_des(program, compiled=compiled)):
        with pytest.raises(DeadlockError) as caught:
            run()
        messages.append(caught.value.reason)
    assert messages[0] == messages[1]
    assert "rank 0 at 0B0 waits for 1B0" in messages[0]
