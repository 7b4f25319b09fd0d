"""The Trace: exact JSON round trip, determinism, the DataFrame's fixed columns, and a file's columns checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli_runner import pipesim
from pipesim import ConfigError, Topology, Trace, load_profile, simulate
from pipesim.engine.trace import STREAMS

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


def _edited(text: str, table: str, column: str, value: object) -> str:
    """``text`` (a trace's JSON) with row 3 of ``table.column`` set to ``value``."""
    data = json.loads(text)
    data[table][column][3] = value
    return json.dumps(data)


@pytest.mark.parametrize(("table", "column", "value", "message"), [
    ("memory", "category", 7, "memory.category=7: must be in 0..4"),
    ("memory", "category", -1, "memory.category=-1: must be in 0..4"),
    ("spans", "stream", 2, "spans.stream=2: must be in 0..1"),
    ("spans", "kind", 9, "spans.kind=9: must be in 0..4"),
    ("spans", "device", 4, "spans.device=4: must be in 0..3"),
    ("memory", "device", -1, "memory.device=-1: must be in 0..3"),
    ("spans", "stage", 4, "spans.stage=4: must be in 0..3"),
    ("memory", "stage", 9, "memory.stage=9: must be in 0..3"),
    ("spans", "peer", -2, "spans.peer=-2: must be in -1..3"),
    ("spans", "microbatch", -1, "spans.microbatch=-1: must be >= 0"),
    ("spans", "minibatch", 4, "spans.minibatch=4: must be in 0..3"),
    ("spans", "position", -1, "spans.position=-1: must be >= 0"),
    ("spans", "device", 1.5, "spans.device=1.5: must be an integer"),
    ("spans", "stage", "x", "spans.stage='x': must be an integer"),
    ("spans", "kind", True, "spans.kind=True: must be an integer"),
    ("spans", "position", 2**70, f"spans.position={2**70}: must fit in 64 bits"),
    ("memory", "time_s", None, "memory.time_s=None: must be a finite number"),
    ("spans", "end_s", float("inf"), "spans.end_s=inf: must be a finite number"),
    ("memory", "delta_bytes", "1", "memory.delta_bytes='1': must be a finite number"),
])
def test_from_json_names_a_column_value_outside_its_type_or_range(table: str, column: str, value: object,
                                                                   message: str) -> None:
    text = vgg_result().trace.to_json()  # 4 stages on 4 ranks, K=4
    with pytest.raises(ConfigError) as raised:
        Trace.from_json(_edited(text, table, column, value), source="t.json")
    assert str(raised.value) == f"t.json: {message}"


def test_a_trace_file_with_a_bad_code_is_one_line_and_exit_2(tmp_path: Path) -> None:
    text = vgg_result().trace.to_json()
    bad = tmp_path / "bad.json"
    bad.write_text(_edited(text, "memory", "category", 7))
    for args in (("plot", "memory", str(bad), "--out", str(tmp_path / "m.png")),
                 ("report", str(bad), "--out", str(tmp_path / "r.html"))):
        done = pipesim(*args)
        assert (done.returncode, done.stderr) == (2, f"pipesim: error: {bad}: memory.category=7: must be in 0..4\n")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["bad.json"]


def test_two_compute_spans_of_one_device_at_one_position_are_refused(tmp_path: Path) -> None:
    data = json.loads(vgg_result().trace.to_json())
    spans = data["spans"]
    rows = [r for r, (stream, device) in enumerate(zip(spans["stream"], spans["device"], strict=True))
            if stream == STREAMS.index("compute") and device == 1]
    spans["position"][rows[3]] = spans["position"][rows[2]]
    path = tmp_path / "twice.json"
    path.write_text(json.dumps(data))
    position = spans["position"][rows[2]]
    rule = f"spans.position={position}: must differ between the compute spans of one device (device 1 has two)"
    done = pipesim("plot", "staleness", str(path), "--out", str(tmp_path / "s.png"))
    assert (done.returncode, done.stderr) == (2, f"pipesim: error: {path}: {rule}\n")
    # Built in Python rather than read: the exposure metric sorted such rows again and again (a
    # subprocess with a timeout, so that a regression fails instead of hanging).
    script = ("import sys, json; from pipesim.engine.trace import Trace; from pipesim.metrics import compute_metrics; "
              "good = Trace.from_json(sys.stdin.read()); spans = dict(good.spans); "
              f"spans['position'] = spans['position'].copy(); spans['position'][{rows[3]}] = {position}; "
              "compute_metrics(Trace(info=good.info, spans=spans, memory=good.memory))")
    good = vgg_result().trace.to_json()
    done = subprocess.run([sys.executable, "-c", script], input=good, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr.strip().splitlines()[-1] == f"pipesim.errors.ConfigError: {rule}"


@pytest.mark.parametrize(("key", "value", "message"), [
    ("stage_to_rank", [0, 1, 2, 4], "meta.stage_to_rank[3]=4: must be in 0..3"),
    ("stage_to_rank", [0, 1, 2], "meta.stage_to_rank=[0, 1, 2]: must have one item per stage (4)"),
    ("rank_devices", [0, 1, 2, -1], "meta.rank_devices[3]=-1: must be >= 0"),
    ("device_memory_bytes", [None], "meta.device_memory_bytes=[None]: must have one item per rank (4)"),
    ("param_bytes", [1.0, 2.0, -3.0, 4.0], "meta.param_bytes[2]=-3.0: must be a finite number >= 0"),
    ("num_stages", 0, "meta.num_stages=0: must be >= 1"),
    ("num_microbatches", 10**12, "meta.num_microbatches=1000000000000: times num_stages (4) and num_minibatches "
                                 "(4) must be at most 100,000,000"),
])
def test_from_json_checks_the_runs_counts_and_lists(key: str, value: object, message: str) -> None:
    data = json.loads(vgg_result().trace.to_json())
    data["meta"][key] = value
    with pytest.raises(ConfigError) as raised:
        Trace.from_json(json.dumps(data), source="t.json")
    assert str(raised.value) == f"t.json: {message}"
