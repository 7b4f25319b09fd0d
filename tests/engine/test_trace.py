"""The Trace: exact JSON round trip, determinism, and the DataFrame's fixed columns."""

from __future__ import annotations

import pytest

from pipesim import ConfigError, Topology, Trace, load_profile, simulate

COLUMNS = ["device", "stream", "op", "kind", "stage", "microbatch", "minibatch", "weight_version", "start_s",
           "end_s", "duration_s", "bytes", "peer", "position"]


def vgg_result(name: str = "pipedream"):  # type: ignore[no-untyped-def]
    profile = load_profile("traces/vgg16.json")
    topology = Topology.uniform(num_devices=4, bandwidth="25Gbit/s", latency="5us")
    return simulate(profile, topology, schedule=name, num_stages=4, num_microbatches=4)


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "pipedream", "2bw", "pipemare"])
def test_json_round_trip_is_exact(name: str) -> None:
    trace = vgg_result(name).trace
    text = trace.to_json()
    again = Trace.from_json(text)
    assert again.equals(trace)
    assert again.to_json() == text


def test_same_inputs_give_byte_identical_json() -> None:
    assert vgg_result().trace.to_json() == vgg_result().trace.to_json()


def test_jitter_is_seeded() -> None:
    profile = load_profile("traces/vgg16.json")

    def run(seed: int) -> str:
        return simulate(profile, schedule="1f1b", num_stages=4, num_microbatches=4, jitter=0.1, seed=seed).trace.to_json()

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_frame_has_fixed_columns_and_one_row_per_span() -> None:
    trace = vgg_result().trace
    frame = trace.to_frame()
    assert list(frame.columns) == COLUMNS
    assert len(frame) == trace.num_spans
    compute = frame[frame["stream"] == "compute"]
    assert set(compute["kind"]) == {"F", "B", "U"}
    assert (frame["end_s"] >= frame["start_s"]).all()


def test_from_json_rejects_other_files() -> None:
    with pytest.raises(ConfigError, match="schema"):
        Trace.from_json('{"schema": "something/else"}')
    with pytest.raises(ConfigError, match="not valid JSON"):
        Trace.from_json("{")
