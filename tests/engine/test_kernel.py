"""The timing and memory kernels compiled by numba and as plain Python: the same bits."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine_strategies import Case, cases
from pipesim import jit
from pipesim.engine.analytic import analytic_unsupported, run_analytic, span_ends
from pipesim.engine.kernel import QUEUES, KernelState, links_may_queue, solve
from pipesim.engine.lowering import Program
from pipesim.engine.memory import memory_columns
from pipesim.engine.noise import run_durations
from pipesim.engine.trace import MEMORY_COLUMNS, SPAN_COLUMNS
from pipesim.errors import ConfigError
from pipesim.simulation import make_plan, prepare

needs_numba = pytest.mark.skipif(not jit.AVAILABLE, reason="numba is not installed (the fast extra)")


def same(a: npt.NDArray[np.generic], b: npt.NDArray[np.generic]) -> bool:
    """Equal bit for bit: same dtype, shape and bytes."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@needs_numba
@given(cases())
def test_compiled_and_plain_kernels_give_identical_traces(case: Case) -> None:
    program = prepare(case.profile, case.topology, make_plan(case.profile, **case.kwargs))
    compiled, plain = run_analytic(program, compiled=True), run_analytic(program, compiled=False)
    for column in SPAN_COLUMNS:
        assert same(compiled.spans[column], plain.spans[column]), column
    start, end = compiled.spans["start_s"][: program.ops.num_ops], compiled.spans["end_s"][: program.ops.num_ops]
    a, b = memory_columns(program, start, end, compiled=True), memory_columns(program, start, end, compiled=False)
    for column in MEMORY_COLUMNS:
        assert same(a[column], b[column]), column
        assert same(a[column], compiled.memory[column]), column


def test_the_policy_depends_on_the_setting_and_the_run_size_only() -> None:
    assert not jit.use_compiled(10**9, "never")
    assert jit.use_compiled(1, "always") == jit.AVAILABLE
    small, large = jit.COMPILED_FROM_OPS - 1, jit.COMPILED_FROM_OPS
    for _ in range(3):  # the same answer however often the process has asked before
        assert not jit.use_compiled(small, "auto")
        assert jit.use_compiled(large, "auto") == jit.AVAILABLE
    with pytest.raises(ConfigError, match="kernels='fast': must be one of auto, always, never"):
        jit.use_compiled(1, "fast")  # type: ignore[arg-type]


def test_the_environment_chooses_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPESIM_JIT", "always")
    assert jit.setting_from_environment() == "always"
    monkeypatch.setenv("PIPESIM_NO_JIT", "1")
    assert jit.setting_from_environment() == "never"
    monkeypatch.delenv("PIPESIM_NO_JIT")
    monkeypatch.setenv("PIPESIM_JIT", "sometimes")
    with pytest.raises(ConfigError, match="PIPESIM_JIT='sometimes'"):
        jit.setting_from_environment()


FIRST_AND_SECOND_CALL = """
import json
from pipesim import simulate, uniform_profile
from pipesim.engine import kernel
from pipesim.metrics import kernels as metric_kernels
profile = uniform_profile(num_layers=4, forward_s=1e-3, backward_s=2e-3, activation_bytes=1e6)
runs = [simulate(profile, schedule="1f1b", num_stages=4, num_microbatches=8, engine="analytic", kernels="always")
        for _ in range(2)]
ran = [k.dispatcher().signatures != [] for k in (kernel.solve, metric_kernels._levels, metric_kernels._exposed)]
print(json.dumps({"startup": [r.startup_s for r in runs], "ran_compiled": ran}))
"""


@needs_numba
def test_compiled_kernels_run_compiled_and_their_start_up_is_counted_once() -> None:
    done = subprocess.run([sys.executable, "-c", FIRST_AND_SECOND_CALL], capture_output=True, text=True, check=True)
    found = json.loads(done.stdout)
    assert found["ran_compiled"] == [True, True, True]  # the engine's and the metrics' machine code ran
    first, second = found["startup"]
    assert first > 0 and second == 0.0  # a fresh process pays numba's start-up on its first call only


@given(cases(), st.sampled_from([False, True]))
def test_span_ends_of_many_runs_are_those_of_separate_runs(case: Case, compiled: bool) -> None:
    """One kernel state reused run after run (``span_ends``) leaves nothing of a run in the next."""
    program = prepare(case.profile, case.topology, make_plan(case.profile, **case.kwargs))
    if analytic_unsupported(program) is not None:
        return
    use = compiled and jit.AVAILABLE
    rng = np.random.default_rng(3)
    runs = [program.ops.duration_s * rng.uniform(0.5, 1.5, program.ops.num_ops) for _ in range(3)]
    runs.append(program.ops.duration_s)
    for durations, ends in zip(runs, span_ends(program, runs, compiled=use), strict=True):
        assert same(ends, run_analytic(program, durations=durations, compiled=use).spans["end_s"])


def test_programs_of_one_schedule_share_the_kernel_structure_only_where_their_chunks_agree() -> None:
    """The kernel's integer structure is kept per schedule: lowering one schedule with and without
    overlapped chunks must still give each program its own inputs."""
    from pipesim import Topology, build_schedule, uniform_profile
    from pipesim.engine.lowering import lower
    from pipesim.spec.stages import stage_costs

    profile = uniform_profile(num_layers=8, forward_s=1e-3, backward_s=2e-3, activation_bytes=1e6)
    topology = Topology.uniform(num_devices=4, bandwidth="10GB/s", latency="5us")
    plan = make_plan(profile, schedule="dualpipev", num_stages=8, num_microbatches=8, stages_per_rank=2)
    shared = build_schedule("dualpipev", 8, 8, num_minibatches=plan.num_minibatches, num_ranks=4)
    costs = stage_costs(profile, plan, topology, stage_devices=tuple(shared.stage_to_rank))
    for chunks in ("dualpipe", "torch", "dualpipe"):
        fresh = build_schedule("dualpipev", 8, 8, num_minibatches=plan.num_minibatches, num_ranks=4)
        one, other = (run_analytic(lower(schedule, costs, topology, fb_chunks=chunks, fb_overlap=0.5))
                      for schedule in (shared, fresh))
        assert same(one.spans["end_s"], other.spans["end_s"]), chunks
    assert "kernel_structure" in shared.derived


def solved_spans(program: Program, durations: npt.NDArray[np.float64], compiled: bool,
                 queues: bool | None = None) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Every span's start and end from the timing kernel; ``queues`` overrides the run's choice
    of whether sends may wait for their link."""
    state = KernelState.build(program, durations, compiled=compiled)
    if queues is not None:
        state.ints[state.offsets[QUEUES]] = int(queues)
    assert jit.pick(solve, compiled)(state.order, state.ints, state.floats) == 0
    start, end = state.span_times()
    return np.array(start), np.array(end)


@given(cases(), st.sampled_from([0.0, 0.2]), st.sampled_from([False, True]))
def test_a_run_whose_links_never_queue_gets_the_queues_bits_without_it(case: Case, jitter: float,
                                                                       compiled: bool) -> None:
    program = prepare(case.profile, case.topology, make_plan(case.profile, **case.kwargs))
    if analytic_unsupported(program) is not None:
        return
    ops, use = program.ops, compiled and jit.AVAILABLE
    assert ops.shortest_send_s <= ops.duration_s[ops.is_remote_send].min(initial=np.inf)  # a bound
    durations = run_durations(program, jitter=jitter, seed=5)
    shortest = durations[ops.is_remote_send].min(initial=np.inf)
    may_queue = bool(ops.hold_by_link_s.size and shortest < ops.hold_by_link_s.max())
    chosen = links_may_queue(ops, durations)
    assert chosen == may_queue if jitter else chosen >= may_queue  # lowered times: from the bound
    spans, queued = solved_spans(program, durations, use), solved_spans(program, durations, use, queues=True)
    for a, b in zip(spans, queued, strict=True):
        assert same(a, b)


@pytest.mark.parametrize("compiled", [False, True])
def test_the_queue_is_skipped_where_the_longest_hold_is_below_every_sender_and_kept_elsewhere(compiled: bool) -> None:
    """1F1B on 4 ranks, F 2 ms: 1 MB holds a 10 Gbit/s link 0.8 ms (never busy at a send), 4 MB
    3.2 ms (a rank's F and B sends queue behind each other)."""
    from pipesim import Topology, uniform_profile

    use = compiled and jit.AVAILABLE
    topology = Topology.uniform(num_devices=4, bandwidth="10Gbit/s", latency="7us")
    outcomes = []
    for activation_bytes in (1e6, 4e6):
        profile = uniform_profile(num_layers=8, forward_s=1e-3, backward_s=2e-3, activation_bytes=activation_bytes)
        program = prepare(profile, topology, make_plan(profile, schedule="1f1b", num_stages=4, num_microbatches=8))
        durations = program.ops.duration_s
        queues = links_may_queue(program.ops, durations)
        with_queue, without = (solved_spans(program, durations, use, queues=q) for q in (True, False))
        outcomes.append((queues, all(same(a, b) for a, b in zip(with_queue, without, strict=True))))
    assert outcomes == [(False, True), (True, False)]  # skipped where it changes nothing; kept where it does
