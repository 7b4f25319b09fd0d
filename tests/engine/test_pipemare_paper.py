"""PipeMare on the paper's own pipeline, against the paper's delay and utilization.

Source: Yang et al., "PipeMare: Asynchronous Pipeline Parallel DNN Training" (MLSys 2021): each
stage runs one forward and one backward in every time step, so a microbatch's forward on stage
s (0-indexed, p stages) runs at step i + s and its backward at step i + 2p - 1 - s. Between them
2(p - s) - 1 backwards of other microbatches run on the stage: with an update per microbatch the
delay (discrepancy version(B) - version(F), and the forward delay) is 2(p - s) - 1 updates, with
one per minibatch of m microbatches at most ceil((2(p - s) - 1) / m); N microbatches take
N + 2p - 1 steps, and in steady state a stage is never idle (utilization 1, one microbatch per
step). DESIGN.md section 2 writes the same forms.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

from trace_invariants import versions_from_trace

from pipesim import Topology, simulate, uniform_profile
from pipesim.schedule.invariants import find_pipemare_violations


def run(p: int, m: int, k: int, update: str, *, tf: float = 1.0, tb: float = 1.0, engine: str = "des"):  # type: ignore[no-untyped-def]
    profile = uniform_profile(num_layers=p, forward_s=tf, backward_s=tb, activation_bytes=1024.0)
    return simulate(profile, Topology.uniform(num_devices=p), schedule="pipemare", num_stages=p, num_microbatches=m,
                    num_minibatches=k, pipemare_update=update, pipemare_model="paper", engine=engine)


def test_delay_and_discrepancy_are_the_papers() -> None:
    for p in range(1, 7):
        for m in (1, 2, 3, p, 2 * p):
            k = 4 + -(-4 * p // m)  # the pipeline fills: K m > 2(2p - 1)
            for update in ("minibatch", "microbatch"):
                result = run(p, m, k, update)
                every = m if update == "minibatch" else 1
                for stage in result.metrics.stages:
                    rounds = 2 * (p - stage.stage) - 1
                    expected = rounds if update == "microbatch" else math.ceil(rounds / m)
                    assert stage.discrepancy_max == expected, (p, m, update, stage.stage)
                    assert stage.forward_delay_steps == expected, (p, m, update, stage.stage)
                    assert stage.weight_versions_max == 1
                # Every microbatch's discrepancy, not only the largest, as the trace recorded it.
                versions = versions_from_trace(result.trace)
                assert find_pipemare_violations(result.schedule, versions, every, warmup_rounds=2) == []


def test_steps_and_steady_state_utilization() -> None:
    for p, m in ((2, 4), (4, 8), (5, 10)):
        k = 5
        result = run(p, m, k, "minibatch")
        assert result.metrics.makespan_s == k * m + 2 * p - 1  # N + 2p - 1 unit steps
        # Unequal times: a step lasts max(F, B); one microbatch per step, no idle time.
        uneven = run(p, m, k, "minibatch", tf=1.0, tb=2.0)
        assert uneven.metrics.iteration_time_s == m * 2.0
        assert uneven.metrics.bubble_fraction == 0.0
        assert all(stage.utilization == 1.0 for stage in uneven.metrics.stages)
        # The 1F1B device model alternates F and B: a step holds one of them, m (F + B) per minibatch.
        profile = uniform_profile(num_layers=p, forward_s=1.0, backward_s=2.0, activation_bytes=1024.0)
        alternating = simulate(profile, Topology.uniform(num_devices=p), schedule="pipemare", num_stages=p,
                               num_microbatches=m, num_minibatches=k)
        assert alternating.metrics.iteration_time_s == m * 3.0


def test_the_drain_stays_outside_the_window_when_forwards_are_slower() -> None:
    # p = 4, m = 4, F = 2, B = 1. In steady state a step holds F(i + w) and B(i) and lasts
    # max(F, B) = 2; one microbatch per step, so a minibatch takes m max(F, B) = 4 x 2 = 8.
    # Stage 0 runs B(i) at step i + 2p - 1 = i + 7, beside F(i + 7) only while i + 7 <= N - 1:
    # with N = 4 K, microbatches N - 7 .. N - 1 run their backward alone, in a step of B = 1.
    # Microbatch N - 7 = 4 (K - 2) + 1 lies in minibatch K - 2: the drain takes the last two
    # minibatches, and the window (from minibatch 0's end) holds K - 3 minibatches.
    for k in (4, 8, 64):
        metrics = run(4, 4, k, "minibatch", tf=2.0, tb=1.0).metrics
        assert metrics.iteration_time_s == 4 * max(2.0, 1.0), k  # 7.0, 7.667, 7.968 when the drain was in
        assert (metrics.warmup_minibatches, metrics.cooldown_minibatches) == (1, 2), k
        assert metrics.bubble_fraction == 0.0, k
    # Any depth and size: with K = 3 + ceil((2p - 1) / m) (warm-up, drain, one steady minibatch)
    # a minibatch takes m max(F, B) and no stage idles, F above or below B.
    for p in range(1, 6):
        for m in (1, 2, p, 2 * p):
            for tf, tb in ((2.0, 1.0), (3.0, 1.0), (1.0, 3.0)):
                metrics = run(p, m, 3 + -(-(2 * p - 1) // m), "minibatch", tf=tf, tb=tb).metrics
                assert metrics.iteration_time_s == m * max(tf, tb), (p, m, tf, tb)
                assert metrics.bubble_fraction == 0.0, (p, m, tf, tb)


def test_engines_plumb_the_shared_kernel_alike() -> None:
    """Plumbing only: both engines run one timing kernel; the closed forms above check the times."""
    for update in ("minibatch", "microbatch"):
        des = run(4, 3, 6, update, tf=0.75, tb=1.5, engine="des")
        analytic = run(4, 3, 6, update, tf=0.75, tb=1.5, engine="analytic")
        for column in ("start_s", "end_s"):
            assert des.trace.spans[column].tobytes() == analytic.trace.spans[column].tobytes()


def test_cli_selects_model_and_update() -> None:
    command = [sys.executable, "-m", "pipesim", "simulate", "--uniform", "layers=4,forward_ms=1,backward_ms=1",
               "--stages", "4", "--microbatches", "2", "--minibatches", "8", "--schedule", "pipemare", "--json"]
    by_model = {}
    for model, update in (("paper", "microbatch"), ("paper", "minibatch"), ("1f1b", "microbatch")):
        done = subprocess.run([*command, "--pipemare-model", model, "--pipemare-update", update],
                              capture_output=True, text=True, check=True)
        by_model[(model, update)] = [stage["discrepancy_max"] for stage in json.loads(done.stdout)["stages"]]
    assert by_model[("paper", "microbatch")] == [7, 5, 3, 1]
    assert by_model[("paper", "minibatch")] == [4, 3, 2, 1]
    assert by_model[("1f1b", "microbatch")] == [3, 2, 1, 0]
    bad = subprocess.run([*command, "--pipemare-model", "wave"], capture_output=True, text=True)
    assert bad.returncode == 2 and "pipemare-model" in bad.stderr and "Traceback" not in bad.stderr
