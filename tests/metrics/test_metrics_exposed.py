"""Exposed communication and staleness of compute_metrics against their definitions, op by op."""

from __future__ import annotations

import pytest

import pipesim
from pipesim.engine.trace import KINDS, STREAMS, Trace
from pipesim.metrics import compute_metrics, staleness, steady_window

_F, _B, _I = KINDS.index("F"), KINDS.index("B"), KINDS.index("I")


def exposed_reference(trace: Trace, device: int, low: float, high: float) -> float:
    """The definition, op by op: idle time before an op while the send it waited for was in flight."""
    spans = sorted((span for span in trace.iter_spans() if span.device == device and span.stream == "compute"),
                   key=lambda span: span.position)
    gaps, previous = {}, 0.0
    for span in spans:
        if span.start_s > previous:
            gaps[(span.stage, KINDS.index(span.op[len(str(span.stage))]), span.microbatch)] = (previous, span.start_s)
        previous = span.end_s
    exposed = 0.0
    for span in trace.iter_spans():
        if span.stream != "send" or span.peer != device:
            continue
        kind = KINDS.index(span.op[len(str(span.stage))])
        keys = ([(span.stage + 1, _F, span.microbatch)] if kind == _F
                else [(span.stage - 1, _B, span.microbatch), (span.stage - 1, _I, span.microbatch)])
        for key in keys:
            if key in gaps:
                start, end = gaps[key]
                exposed += max(0.0, min(end, span.end_s, high) - max(start, span.start_s, low))
    return exposed


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "pipedream", "2bw", "pipemare"])
@pytest.mark.parametrize("jitter", [0.0, 0.3])
def test_metrics_match_the_definitions(schedule: str, jitter: float) -> None:
    profile = pipesim.load_profile("traces/vgg16.json")
    topology = pipesim.Topology.uniform(num_devices=4, bandwidth="10GB/s", latency="5us")
    trace = pipesim.simulate(profile, topology, schedule=schedule, num_stages=4, num_microbatches=6,
                             num_minibatches=3, jitter=jitter, seed=1).trace
    assert STREAMS.index("send") in set(trace.spans["stream"].tolist())
    metrics = compute_metrics(trace)
    low, high, _, _ = steady_window(trace)
    for stage in metrics.stages:
        assert stage.exposed_communication_s == exposed_reference(trace, stage.device, low, high)
        assert (stage.forward_delay_steps, stage.forward_delay_mean, stage.discrepancy_max) == staleness(
            trace, stage.stage)
    assert any(stage.exposed_communication_s > 0 for stage in metrics.stages)


def test_a_send_that_arrived_before_its_op_started_counts_only_while_in_flight() -> None:
    # In a measured run an op may start well after its input arrived (the host woke late): the
    # idle time after the arrival is not communication. Every send of a simulated run moved
    # earlier by half its length leaves each gap's last stretch without a message in flight.
    profile = pipesim.uniform_profile(num_layers=4, forward_s=1e-3, backward_s=2e-3, activation_bytes=1e6)
    topology = pipesim.Topology.uniform(num_devices=4, bandwidth="1GB/s", latency="5us")
    trace = pipesim.simulate(profile, topology, schedule="1f1b", num_stages=4, num_microbatches=4).trace
    sends = trace.spans["stream"] == STREAMS.index("send")
    shift = (trace.spans["end_s"] - trace.spans["start_s"]) / 2 * sends
    early = Trace(info=trace.info, spans={**trace.spans, "start_s": trace.spans["start_s"] - shift,
                                          "end_s": trace.spans["end_s"] - shift}, memory=trace.memory)
    low, high, _, _ = steady_window(early)
    metrics, before = compute_metrics(early), compute_metrics(trace)
    for stage, unshifted in zip(metrics.stages, before.stages, strict=True):
        assert stage.exposed_communication_s == pytest.approx(exposed_reference(early, stage.device, low, high),
                                                              rel=1e-12, abs=1e-15)
        assert stage.exposed_communication_s <= unshifted.exposed_communication_s
    # A 1 MB message holds the 1 GB/s link 1 ms: moved 0.5 ms earlier, it is in flight for less of each wait.
    assert sum(s.exposed_communication_s for s in metrics.stages) < sum(s.exposed_communication_s
                                                                          for s in before.stages)


def test_an_input_gradient_on_a_newer_version_than_its_forward_is_a_discrepancy() -> None:
    # No simulated split-backward schedule updates between an F and its I (they flush), but a measured
    # trace may show it: version(I) - version(F) counts as B's does. One I of stage 0 moved a version on.
    profile = pipesim.uniform_profile(num_layers=2, forward_s=1e-3, backward_s=2e-3, backward_input_s=1e-3,
                                      backward_weight_s=1e-3)
    trace = pipesim.simulate(profile, schedule="zb-h1", num_stages=2, num_microbatches=2, num_minibatches=2).trace
    spans = list(trace.iter_spans())
    row = next(index for index, span in enumerate(spans) if span.stream == "compute" and span.op == "0I1")
    version = trace.spans["weight_version"].copy()
    assert version[row] == 0
    version[row] = 1
    moved = Trace(info=trace.info, spans={**trace.spans, "weight_version": version}, memory=trace.memory)
    assert [stage.discrepancy_max for stage in compute_metrics(moved).stages] == [1, 0]
    assert [stage.discrepancy_max for stage in compute_metrics(trace).stages] == [0, 0]
