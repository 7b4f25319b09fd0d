"""Fuzzed inputs: every reader returns a valid model or a one-line PipesimError naming file, field, value."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipesim.errors import PipesimError
from pipesim.schedule.csv_format import from_csv
from pipesim.spec.files import load_plan, load_profile, load_topology
from pipesim.spec.graphtxt import parse_graph_txt

ROOT = Path(__file__).resolve().parents[1]
FUZZ = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

GRAPH = """node1 -- Input0 -- forward_compute_time=0.000, backward_compute_time=0.000, activation_size=602112.000, parameter_size=0.000
node2 -- Conv2d(3, 64) -- forward_compute_time=1.500, backward_compute_time=2.250, activation_size=[1024.0; 2048.0], parameter_size=7168.000
node3 -- ReLU -- forward_compute_time=0.250, backward_compute_time=0.125, activation_size=1024.000, parameter_size=0.000
node4 -- Add -- forward_compute_time=0.000, backward_compute_time=0.000, activation_size=1024.000, parameter_size=0.000
node5 -- Linear(10, 10) -- forward_compute_time=0.700, backward_compute_time=0.900, activation_size=40.000, parameter_size=440.000 -- stage_id=1
\tnode1 -- node2
\tnode2 -- node3
\tnode2 -- node4
\tnode3 -- node4
\tnode4 -- node5
"""
PROFILE = {
    "schema": "pipesim.profile/1", "name": "tiny", "microbatch_size": 2,
    "layers": [
        {"name": "a", "forward_s": 0.001, "backward_s": 0.002, "activation_bytes": 100.0, "param_bytes": 10.0},
        {"name": "b", "forward_s": 0.002, "backward_s": 0.003, "activation_bytes": 50.0, "param_bytes": 20.0,
         "stash_bytes": 70.0, "backward_input_s": 0.001, "backward_weight_s": 0.002},
    ],
}
TOPOLOGY = {
    "schema": "pipesim.topology/1",
    "devices": [{"name": "g0", "memory_bytes": 1e9, "speed": 1.0}, {"name": "g1"}, {"name": "g2"}],
    "bandwidth_bytes_per_s": 1e9, "latency_s": 1e-6,
    "levels": [{"group_size": 2, "bandwidth_bytes_per_s": 1e10}],
    "links": [{"src": 0, "dst": 2, "bandwidth_bytes_per_s": 5e8}],
}
PLAN = {"schema": "pipesim.plan/1", "schedule": "1f1b", "num_stages": 2, "num_microbatches": 4,
        "partition": [[0, 1], [1, 2]], "replicas": [1, 2], "placement": [0, 1], "recompute": False}
CSV = "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"

ODD_VALUES = st.sampled_from([
    None, True, -1, -1.5, 0, 1e308, 10**40, "x", "ü\u202e", "", [], {}, [1, 2], {"a": 1}, float("nan"),
    float("inf"), -float("inf"), "1e999", 2**63,
])


def paths_of(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths_of(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += paths_of(item, (*prefix, index))
    return found


@st.composite
def mutated_json(draw: st.DrawFn, valid: dict[str, Any]) -> str:
    """A valid document with one mutation: a value replaced, a key deleted or added, or text damage."""
    data = json.loads(json.dumps(valid))
    how = draw(st.sampled_from(["replace", "delete", "add", "truncate", "insert", "duplicate"]))
    text = json.dumps(data)
    if how in ("replace", "delete", "add"):
        path = draw(st.sampled_from(paths_of(data)[1:]))
        parent = data
        for part in path[:-1]:
            parent = parent[part]
        if how == "replace":
            parent[path[-1]] = draw(ODD_VALUES)
        elif how == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.sampled_from(["extra", "schema", "layers", "ü"]))] = draw(ODD_VALUES)
        text = json.dumps(data, allow_nan=True)
    elif how == "truncate":
        text = text[: draw(st.integers(0, len(text) - 1))]
    elif how == "insert":
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.text(min_size=1, max_size=3)) + text[at:]
    else:
        key = draw(st.sampled_from(list(data)))
        text = text[:-1] + f", {json.dumps(key)}: {json.dumps(data[key])}" + "}"
    return text


def check_outcome(read: Any, path: Path) -> None:
    try:
        read(path)
    except PipesimError as error:
        message = str(error)
        assert "\n" not in message, message
        assert str(path) in message, message
        assert "=" in message or ": " in message, message
    except Exception as error:  # noqa: BLE001 - the point: nothing else may escape
        raise AssertionError(f"{type(error).__name__} escaped: {error}") from error


@FUZZ
@given(text=mutated_json(PROFILE))
def test_profile_json_fuzz(tmp_path_factory: Any, text: str) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "profile.json"
    path.write_text(text, encoding="utf-8")
    check_outcome(load_profile, path)


@FUZZ
@given(text=mutated_json(TOPOLOGY))
def test_topology_json_fuzz(tmp_path_factory: Any, text: str) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "topology.json"
    path.write_text(text, encoding="utf-8")
    check_outcome(load_topology, path)


@FUZZ
@given(text=mutated_json(PLAN))
def test_plan_json_fuzz(tmp_path_factory: Any, text: str) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "plan.json"
    path.write_text(text, encoding="utf-8")
    check_outcome(load_plan, path)


@st.composite
def mutated_graph(draw: st.DrawFn) -> str:
    lines = GRAPH.splitlines()
    how = draw(st.sampled_from(["drop", "repeat", "value", "cycle", "truncate", "junk", "swap"]))
    index = draw(st.integers(0, len(lines) - 1))
    if how == "drop":
        del lines[index]
    elif how == "repeat":
        lines.insert(index, lines[index])
    elif how == "value":
        value = draw(st.sampled_from(["nan", "inf", "-1.0", "1e999", "1e308", "abc", "[1; x]", "[]", "", "1_0",
                                      "99999999999999999999999999999999999"]))
        key = draw(st.sampled_from(["forward_compute_time=", "backward_compute_time=", "activation_size=",
                                    "parameter_size="]))
        line = lines[index]
        if key in line:
            start = line.index(key) + len(key)
            end = line.find(",", start)
            end = len(line) if end == -1 or key == "activation_size=" and line[start] == "[" else end
            if line[start] == "[":
                end = line.index("]", start) + 1
            lines[index] = line[:start] + value + line[end:]
    elif how == "cycle":
        lines.append(draw(st.sampled_from(["\tnode5 -- node1", "\tnode4 -- node2", "\tnode3 -- node3",
                                           "\tnode5 -- node9"])))
    elif how == "truncate":
        text = "\n".join(lines)
        return text[: draw(st.integers(0, len(text)))]
    elif how == "junk":
        lines.insert(index, draw(st.text(max_size=40)))
    else:
        other = draw(st.integers(0, len(lines) - 1))
        lines[index], lines[other] = lines[other], lines[index]
    return "\n".join(lines) + "\n"


@FUZZ
@given(text=mutated_graph())
def test_graph_txt_fuzz(tmp_path_factory: Any, text: str) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "graph.txt"
    path.write_text(text, encoding="utf-8")
    check_outcome(load_profile, path)


def test_graph_txt_fuzz_seed_file_is_valid() -> None:
    profile = parse_graph_txt(GRAPH, source="graph.txt")
    assert profile.num_layers == 5
    assert math.isclose(sum(layer.forward_s for layer in profile.layers), 2.45e-3)


@FUZZ
@given(
    cells=st.lists(st.lists(st.one_of(
        st.sampled_from(["0F0", "1B0", "0F1", "2W3", "1I0", "0U0", "", " ", "0REDUCE_GRAD", "1SEND_F0", "x", "F0",
                         "(0F1;1B0)OVERLAP_F_B", "99999999999999999999F0", "0F-1"]),
        st.text(max_size=6)), max_size=8), max_size=5),
)
def test_schedule_csv_fuzz(tmp_path_factory: Any, cells: list[list[str]]) -> None:
    import csv
    import io

    out = io.StringIO()
    csv.writer(out).writerows(cells)
    try:
        from_csv(out.getvalue(), source="fuzz.csv")
    except PipesimError as error:
        assert "\n" not in str(error) and "fuzz.csv" in str(error), str(error)


SPEC = {
    "profile": {"uniform": {"layers": 16, "forward_ms": 1.0, "backward_ms": 2.0, "activation_bytes": 1000,
                            "param_bytes": 4000}},
    "bandwidth": ["10GB/s", "100GB/s"], "latency": ["5us"], "stages": [2, 4],
    "microbatches": {"range": [2, 16]}, "minibatches": [2], "schedule": ["gpipe", "2bw"],
    "where": "microbatches >= stages",
}


@FUZZ
@given(text=mutated_json(SPEC))
def test_sweep_spec_fuzz(tmp_path_factory: Any, text: str) -> None:
    from pipesim.sweep.spec import load_spec

    path = tmp_path_factory.mktemp("fuzz") / "spec.yaml"
    path.write_text(text, encoding="utf-8")  # JSON is YAML
    check_outcome(load_spec, path)


def _small_trace() -> dict[str, Any]:
    from pipesim import Topology, simulate
    from pipesim.spec.profile import uniform_profile

    profile = uniform_profile(num_layers=2, forward_s=1e-3, backward_s=2e-3, activation_bytes=1e3, param_bytes=1e3)
    result = simulate(profile, Topology.uniform(num_devices=2, bandwidth=1e9, latency=1e-6), schedule="2bw",
                      num_stages=2, num_microbatches=2, num_minibatches=2, engine="analytic")
    data: dict[str, Any] = json.loads(result.trace.to_json())
    return data


TRACE = _small_trace()


def read_trace_and_metrics(path: Path) -> None:
    """What ``pipesim plot`` and ``report`` do with a trace file: read it, then compute its metrics."""
    from pipesim.engine.trace import Trace
    from pipesim.metrics import compute_metrics

    compute_metrics(Trace.from_json(path.read_text(encoding="utf-8"), source=str(path)))


@FUZZ
@given(text=mutated_json(TRACE))
def test_trace_json_fuzz(tmp_path_factory: Any, text: str) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "trace.json"
    path.write_text(text, encoding="utf-8")
    try:
        read_trace_and_metrics(path)
    except PipesimError as error:  # the metrics' own checks name the column, not the file
        message = str(error)
        assert "\n" not in message and "=" in message, message
    except Exception as error:  # noqa: BLE001 - the point: nothing else may escape
        raise AssertionError(f"{type(error).__name__} escaped: {error}") from error
