"""The op-by-op breakdown of a run against its prediction: the same ops compared per stage and kind,
their spans' parts, and the iteration-time error written exactly as a sum over op kinds and waits."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesim import simulate, uniform_profile
from pipesim.engine.trace import Trace
from pipesim.harness.breakdown import by_kind, contributions, op_rows, steady_ops, traced_ops, window_share
from pipesim.metrics import compute_metrics


def trace_of(schedule: str = "gpipe", *, forward_s: float = 1e-3, backward_s: float = 2e-3, num_microbatches: int = 2,
             num_minibatches: int = 3, jitter: float = 0.0, seed: int = 0) -> Trace:
    profile = uniform_profile(num_layers=4, forward_s=forward_s, backward_s=backward_s, activation_bytes=0.0,
                              param_bytes=0.0)
    return simulate(profile, schedule=schedule, num_stages=2, num_microbatches=num_microbatches,
                    num_minibatches=num_minibatches, engine="des", jitter=jitter, seed=seed).trace


def test_the_same_ops_are_compared_per_stage_and_kind_with_the_waits_before_them() -> None:
    predicted = trace_of()
    measured = trace_of(forward_s=1.1e-3)
    rows = {(row.stage, row.kind): row for row in op_rows(predicted, measured)}
    # gpipe, m=2, K=3: the steady-state minibatch 1 has two F and two B per stage and one U.
    assert list(rows) == [(0, "F"), (0, "B"), (0, "U"), (1, "F"), (1, "B"), (1, "U")]
    assert rows[(0, "F")].count == 2 and rows[(0, "U")].count == 1
    assert rows[(0, "F")].predicted_s == pytest.approx(2e-3) and rows[(0, "F")].measured_s == pytest.approx(2.2e-3)
    assert rows[(1, "B")].ratio == pytest.approx(1.0)
    assert rows[(0, "F")].ratio == pytest.approx(1.1)
    # A simulated trace records no parts of its spans.
    assert math.isnan(rows[(0, "F")].receive_s) and math.isnan(rows[(0, "F")].cpu_s)
    # Stage 1's first F of a minibatch waits out stage 0's last B (4 ms) and its first F (2.2 ms; 2 predicted).
    ops = [op for op in traced_ops(measured) if op.stage == 1 and op.kind == "F" and op.minibatch == 1]
    assert [round(op.wait_s * 1e3, 6) for op in ops] == [6.2, 0.0]
    assert rows[(1, "F")].wait_s == pytest.approx(3.1e-3) and rows[(1, "F")].predicted_wait_s == pytest.approx(3e-3)


def test_recorded_parts_of_the_spans_are_reported_and_pooled_by_kind() -> None:
    trace = trace_of()
    receive = tuple(tuple(1e-4 * (position % 2) for position in range(len(ops))) for ops in _positions(trace))
    send = tuple(tuple(2e-4 for _ in ops) for ops in _positions(trace))
    measured = dataclasses.replace(trace, info=dataclasses.replace(trace.info, compute_receive_s=receive,
                                                                   compute_send_s=send, compute_cpu_s=send))
    rows = op_rows(trace, measured)
    for row in rows:
        assert row.send_s == pytest.approx(2e-4) and row.cpu_s == pytest.approx(2e-4)
        assert row.receive_s + row.work_s + row.send_s == pytest.approx(row.measured_s)
    pooled = {row.kind: row for row in by_kind(rows)}
    assert pooled["F"].count == 4 and pooled["F"].stage == -1
    assert pooled["F"].measured_s == pytest.approx(2e-3) and pooled["B"].measured_s == pytest.approx(4e-3)


def _positions(trace: Trace) -> list[list[int]]:
    ops: dict[int, list[int]] = {}
    for op in traced_ops(trace):
        ops.setdefault(op.device, []).append(op.position)
    return [sorted(ops[device]) for device in sorted(ops)]


def test_the_steady_state_ops_are_those_of_the_minibatches_inside_the_window() -> None:
    trace = trace_of(num_minibatches=5)
    assert {op.minibatch for op in steady_ops(trace)} == {1, 2, 3}


@settings(max_examples=30)
@given(schedule=st.sampled_from(["gpipe", "1f1b", "pipedream", "2bw", "zb-h1"]),
       seed=st.integers(0, 50), slower=st.floats(0.8, 1.3))
def test_the_error_is_exactly_the_sum_of_the_kinds_and_the_waits(schedule: str, seed: int, slower: float) -> None:
    predicted = trace_of(schedule, num_microbatches=4, num_minibatches=4)
    measured = trace_of(schedule, forward_s=1e-3 * slower, num_microbatches=4, num_minibatches=4, jitter=0.2,
                        seed=seed)
    parts = contributions(predicted, measured)
    mine, theirs = compute_metrics(predicted).iteration_time_s, compute_metrics(measured).iteration_time_s
    assert sum(parts.values()) == pytest.approx((mine - theirs) / theirs, abs=1e-12)
    assert window_share(measured).iteration_time_s == pytest.approx(theirs, rel=1e-12)
    assert set(parts) >= {"F", "waits"} and "spread" not in parts


def test_a_longer_forward_shows_in_f_and_in_the_waits_it_causes() -> None:
    predicted, measured = trace_of(num_microbatches=4), trace_of(forward_s=1.5e-3, num_microbatches=4)
    parts = contributions(predicted, measured)
    assert parts["F"] < 0 and parts["B"] == pytest.approx(0.0, abs=1e-12)
    assert parts["waits"] < 0  # stage 1 waits longer for each slower F of stage 0


# A run counts as quiet when the machine's load average over the minute before it was at most its
# number of CPUs, and every rank of the calibration and of the validated run had a CPU for at least this
# share of its ops' time (RunInfo cpu_share): on a busy machine op times move by more than 3% between
# two runs (other programs take the cores, and the caches and memory bandwidth between ops).
QUIET_CPU_SHARE = 0.97


def test_on_a_quiet_run_the_calibrated_and_measured_durations_of_a_kind_agree_within_3_percent() -> None:
    """The calibration runs (GPipe and 1F1B at the validated run's m and K) and a validated GPipe run:
    its backwards, pooled over the stages, last as long as the prediction gave them within 3%."""
    pytest.importorskip("torch")
    import os

    load = os.getloadavg()[0]
    cpus = len(os.sched_getaffinity(0))
    from pipesim.harness.calibration import Calibrated, CalibrationRun, calibrate
    from pipesim.harness.config import ModelSpec, RunConfig
    from pipesim.harness.profiler import Timing, measure_profile
    from pipesim.harness.validate import ScheduleValidation
    from pipesim.spec.profile import Profile
    from pipesim.spec.topology import Topology

    spec = ModelSpec("transformer", depth=4, width=128, seq_len=64, heads=4)
    profile = measure_profile(spec, 8, timing=Timing(warmup=1, repeats=3, processes=1), calibrate=False).profile
    made: list[Calibrated] = []

    def calibration(layers: Profile, config: RunConfig) -> Calibrated:
        made.append(calibrate(layers, spec, config.partition, CalibrationRun(),
                              for_run=(config.num_microbatches, config.num_minibatches)))
        return made[-1]

    validation = ScheduleValidation(profile, Topology.uniform(num_devices=2, bandwidth="10Gbit/s", latency="50us"),
                                    spec, schedule="gpipe", num_stages=2, num_microbatches=8, num_minibatches=6,
                                    calibration=calibration)
    run = validation.run_once()
    shares = [share for share in run.cpu_share if share is not None] + [made[0].cpu_share]
    assert run.calibration_rows and {row.kind for row in run.op_rows} == {"F", "B", "U"}
    backward = next(row for row in by_kind(run.op_rows) if row.kind == "B")
    # The prediction gave each B the calibration's time of its context: after an F or after a B.
    after = [made[0].context_s[(stage, "B", before)] for stage in (0, 1) for before in "FB"]
    assert min(after) <= backward.predicted_s <= max(after)
    assert backward.work_s < backward.measured_s and backward.receive_s >= 0 and backward.send_s >= 0
    if load > cpus or min(shares) < QUIET_CPU_SHARE:
        pytest.skip(f"not a quiet run: load average {load:.1f} on {cpus} CPUs, a rank had a CPU for {min(shares):.0%} "
                    f"of its ops' time (at most {cpus} and at least {QUIET_CPU_SHARE:.0%} wanted); B measured / "
                    f"calibrated {backward.ratio:.3f}")
    assert backward.ratio == pytest.approx(1.0, abs=0.03), backward
