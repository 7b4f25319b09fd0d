"""The closed forms of DESIGN.md section 2, checked exactly on the DES engine."""

from __future__ import annotations

import math

import pytest

from pipesim import Topology, simulate, uniform_profile

TF, TB = 1.0e-3, 2.0e-3


def run(name: str, p: int, m: int, k: int | None = None, **kwargs: object):  # type: ignore[no-untyped-def]
    profile = uniform_profile(num_layers=p, forward_s=TF, backward_s=TB, activation_bytes=1e6, param_bytes=4e6)
    return simulate(profile, Topology.uniform(num_devices=p), schedule=name, num_stages=p,
                    num_microbatches=m, num_minibatches=k, **kwargs)


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)


# p in 1..16 and m in 1..64: every p, and m on a grid dense at the small end.
GRID = [(p, m) for p in range(1, 17) for m in (*range(1, 17), 24, 31, 32, 48, 63, 64)]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_flush_iteration_time_bubble_and_inflight(name: str) -> None:
    for p, m in GRID:
        metrics = run(name, p, m).metrics
        assert close(metrics.iteration_time_s, (m + p - 1) * (TF + TB)), (p, m)
        assert close(metrics.bubble_fraction, (p - 1) / (m + p - 1)), (p, m)
        for stage in metrics.stages:
            expected = m if name == "gpipe" else min(m, p - stage.stage)
            assert stage.max_inflight_microbatches == expected, (p, m, stage.stage)
            assert stage.weight_versions_max == 1
            assert stage.forward_delay_steps == 0
            assert stage.discrepancy_max == 0


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_flush_iteration_time_is_per_minibatch_with_several_minibatches(name: str) -> None:
    for p, m, k in ((4, 8, 2), (4, 8, 3), (3, 5, 5)):
        metrics = run(name, p, m, k).metrics
        assert close(metrics.iteration_time_s, (m + p - 1) * (TF + TB))
        assert close(metrics.makespan_s, k * (m + p - 1) * (TF + TB))


FLUSH_SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("zb-h1", 1), ("zb-h2", 1), ("zb-auto", 1), ("interleaved-1f1b", 2),
                   ("looped-bfs", 2), ("interleaved-zb", 2), ("zbv", 2), ("dualpipev", 2)]


@pytest.mark.parametrize(("name", "per_rank"), FLUSH_SCHEDULES)
def test_every_flush_schedule_keeps_one_version_and_no_staleness(name: str, per_rank: int) -> None:
    # A flush updates after the minibatch's last backward: every op of minibatch k runs on version k,
    # and the U that consumes a gradient makes version k + 1 from version k: a delay of 0 steps.
    p, m = 4, 8
    profile = uniform_profile(num_layers=p, forward_s=TF, backward_s=TB, activation_bytes=1e6, param_bytes=4e6)
    metrics = simulate(profile, Topology.uniform(num_devices=p // per_rank), schedule=name, num_stages=p,
                       num_microbatches=m, num_minibatches=3, stages_per_rank=per_rank).metrics
    for stage in metrics.stages:
        assert (stage.weight_versions_max, stage.forward_delay_steps, stage.forward_delay_mean,
                stage.discrepancy_max) == (1, 0, 0.0, 0), (name, stage.stage)


def test_pipedream_versions_delay_and_no_bubble() -> None:
    for p in range(1, 9):
        for m in (p, p + 1, 2 * p):
            metrics = run("pipedream", p, m, 4).metrics
            assert close(metrics.iteration_time_s, m * (TF + TB)), (p, m)
            assert close(metrics.bubble_fraction, 0.0) or metrics.bubble_fraction < 1e-12
            for stage in metrics.stages:
                s = stage.stage
                assert stage.weight_versions_max == p - s, (p, m, s)
                assert stage.forward_delay_steps == p - 1 - s, (p, m, s)
                assert stage.discrepancy_max == 0  # stashing: B uses its F's version


def test_pipedream_no_bubble_when_its_warm_up_outlasts_a_minibatch() -> None:
    # m < p (PipeDream itself updates per input, m = 1): stage 0 runs p - 1 forwards ahead, so its
    # backwards after its last forward span ceil(p / m) minibatches of drain; the window leaves
    # them out (K = 3 + ceil(p / m) keeps one steady minibatch at least) and sees no bubble.
    for p in range(2, 9):
        for m in range(1, p):
            metrics = run("pipedream", p, m, 3 + -(-p // m)).metrics
            assert close(metrics.iteration_time_s, m * (TF + TB)), (p, m)
            assert metrics.bubble_fraction < 1e-12, (p, m, metrics.bubble_fraction)


def test_2bw_two_versions_delay_one_no_bubble() -> None:
    for p in range(1, 9):
        for m in (p, p + 3, 2 * p):
            metrics = run("2bw", p, m, 4).metrics
            assert close(metrics.iteration_time_s, m * (TF + TB)), (p, m)
            assert metrics.bubble_fraction < 1e-12
            for stage in metrics.stages:
                assert stage.weight_versions_max <= 2
                assert stage.forward_delay_steps == (1 if p > 0 else 0)
                assert stage.discrepancy_max == 0


def test_pipemare_one_version_and_the_order_derived_discrepancy() -> None:
    for p in range(1, 9):
        for m in (1, 2, p, 2 * p):
            for update, bound in (("minibatch", lambda s: math.ceil((p - s - 1) / m)), ("microbatch", lambda s: p - s - 1)):
                # Enough minibatches for the pipeline to fill: K * m >= 2p.
                k = max(4, -(-2 * p // m))
                metrics = run("pipemare", p, m, k, pipemare_update=update).metrics
                for stage in metrics.stages:
                    assert stage.weight_versions_max == 1
                    assert stage.discrepancy_max == bound(stage.stage), (p, m, update, stage.stage)
                    assert stage.forward_delay_steps == stage.discrepancy_max


def test_scaling_every_time_scales_every_span() -> None:
    base = run("1f1b", 4, 6)
    profile = uniform_profile(num_layers=4, forward_s=3 * TF, backward_s=3 * TB, activation_bytes=1e6, param_bytes=4e6)
    scaled = simulate(profile, Topology.uniform(num_devices=4), schedule="1f1b", num_stages=4, num_microbatches=6)
    for a, b in zip(base.trace.spans["end_s"].tolist(), scaled.trace.spans["end_s"].tolist(), strict=True):
        assert close(3 * a, b)


def test_each_hop_takes_the_bandwidth_of_the_level_its_two_devices_share() -> None:
    # Two servers of two devices: 0-1 and 2-3 over 10 GB/s inside a server, 1-2 over 1 GB/s between.
    # One microbatch down four stages and back: four hops inside a server, two between.
    profile = uniform_profile(num_layers=4, forward_s=TF, backward_s=TB, activation_bytes=1e6)
    topology = Topology.hierarchical(num_devices=4, devices_per_server=2, intra_bandwidth="10GB/s",
                                     inter_bandwidth="1GB/s")
    result = simulate(profile, topology, schedule="gpipe", num_stages=4, num_microbatches=1)
    assert close(result.metrics.makespan_s, 4 * TF + 4 * TB + 4 * 1e6 / 10e9 + 2 * 1e6 / 1e9)


def test_communication_adds_latency_plus_bytes_over_bandwidth() -> None:
    # Two stages, one microbatch: F0, send, F1, B1, send back, B0.
    profile = uniform_profile(num_layers=2, forward_s=TF, backward_s=TB, activation_bytes=1e6)
    topology = Topology.uniform(num_devices=2, bandwidth="1GB/s", latency="10us")
    result = simulate(profile, topology, schedule="gpipe", num_stages=2, num_microbatches=1)
    transfer = 10e-6 + 1e6 / 1e9
    assert close(result.metrics.makespan_s, 2 * TF + 2 * TB + 2 * transfer)


def test_op_count_estimate_is_exact_for_every_seed_schedule() -> None:
    from pipesim.simulation import estimate_num_ops

    for name in ("gpipe", "1f1b", "pipedream", "2bw", "pipemare"):
        for p, m, k in ((1, 1, 1), (3, 4, 2), (4, 8, 3)):
            result = run(name, p, m, k)
            assert estimate_num_ops(result.plan, uniform_profile(num_layers=p, forward_s=TF, backward_s=TB)) == \
                result.schedule.num_ops, (name, p, m, k)


@pytest.mark.parametrize("is_shared", [False, True])
def test_latency_pipelines_on_a_busy_link(is_shared: bool) -> None:
    # GPipe on two stages, m forwards on stage 0 faster than the link: the activations queue on
    # link 0 -> 1. Each holds the link for h = bytes / bandwidth and arrives latency L later; the
    # next one leaves when the bytes of the one before have left, not when it arrives, so
    # microbatch i leaves at TF + i h and stage 1's last forward starts at TF + m h + L (a link
    # that held each message for L + h would give TF + m (h + L)). With a shared NIC (the DES's
    # fluid network) each flow is alone on its NIC and gets the same times.
    m, latency, num_bytes, bandwidth = 6, 1e-3, 4e6, 1e9
    profile = uniform_profile(num_layers=2, forward_s=TF, backward_s=TB, activation_bytes=num_bytes)
    topology = Topology.uniform(num_devices=2, bandwidth=bandwidth, latency=latency).model_copy(
        update={"shared": is_shared})
    result = simulate(profile, topology, schedule="gpipe", num_stages=2, num_microbatches=m, engine="des")
    hold = num_bytes / bandwidth
    s = result.trace.spans
    starts = {(int(st), int(k), int(mb)): float(t) for st, k, mb, t, stream in
              zip(s["stage"], s["kind"], s["microbatch"], s["start_s"], s["stream"], strict=True) if stream == 0}
    for i in range(m):
        assert close(starts[(1, 0, i)], TF + (i + 1) * hold + latency), i
    if not is_shared:
        analytic = simulate(profile, topology, schedule="gpipe", num_stages=2, num_microbatches=m, engine="analytic")
        assert analytic.trace.spans["end_s"].tobytes() == s["end_s"].tobytes()
