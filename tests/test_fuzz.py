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
from pipesim.spec.plan import Plan
from pipesim.spec.profile import Profile
from pipesim.spec.topology import Topology

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


def finite_at_least_zero(value: Any) -> bool:
    return isinstance(value, float | int) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def positive_or_free(value: Any) -> bool:
    """A bandwidth or a memory size: above 0, inf meaning unlimited; never NaN."""
    return isinstance(value, float | int) and not isinstance(value, bool) and value > 0


def check_profile(profile: Profile) -> None:
    """What a profile a reader accepted must be, whatever text it came from: layers with finite,
    non-negative times and sizes, split backwards given in pairs, a microbatch of one sample or more."""
    assert profile.layers and isinstance(profile.microbatch_size, int) and profile.microbatch_size >= 1
    for layer in profile.layers:
        for value in (layer.forward_s, layer.backward_s, layer.activation_bytes, layer.param_bytes):
            assert finite_at_least_zero(value), layer
        for value in (layer.backward_input_s, layer.backward_weight_s, layer.stash_bytes, layer.weight_stash_bytes,
                      layer.recomputed_bytes, layer.update_s, layer.forward_std_s, layer.backward_std_s,
                      layer.gradient_allreduce_s):
            assert value is None or finite_at_least_zero(value), layer
        assert (layer.backward_input_s is None) == (layer.backward_weight_s is None), layer
        assert layer.weight_stash_bytes is None or layer.weight_stash_bytes <= layer.stashed_bytes, layer
        assert all(isinstance(i, int) and 0 <= i for i in layer.inputs or ()), layer
    for value in (profile.forward_overhead_s, profile.backward_overhead_s, profile.update_overhead_s,
                  profile.input_bytes, profile.loss_bytes):
        assert value is None or finite_at_least_zero(value), profile


def check_topology(topology: Topology) -> None:
    """Devices of positive memory and finite positive speed; links and levels of positive bandwidth
    and finite non-negative latency, each link between two devices that exist."""
    assert topology.devices
    for device in topology.devices:
        assert positive_or_free(device.memory_bytes) and positive_or_free(device.speed), device
        assert math.isfinite(device.speed), device
    assert positive_or_free(topology.bandwidth_bytes_per_s) and finite_at_least_zero(topology.latency_s)
    for link in topology.links:
        assert 0 <= link.src < topology.num_devices and 0 <= link.dst < topology.num_devices, link
        assert link.src != link.dst and positive_or_free(link.bandwidth_bytes_per_s), link
        assert finite_at_least_zero(link.latency_s), link
    sizes = [level.group_size for level in topology.levels]
    assert all(size >= 1 for size in sizes) and sizes == sorted(set(sizes)), sizes
    for level in topology.levels:
        assert positive_or_free(level.bandwidth_bytes_per_s) and finite_at_least_zero(level.latency_s), level


def check_plan(plan: Plan) -> None:
    """Counts of 1 or more; per-stage lists of one entry per stage; a partition of contiguous,
    non-empty layer ranges from layer 0; replicas of 1 or more on devices of index 0 or more."""
    assert plan.num_stages >= 1 and plan.num_microbatches >= 1 and plan.num_minibatches >= 1
    assert plan.stages_per_rank >= 1 and plan.num_stages % plan.stages_per_rank == 0
    for given in (plan.partition, plan.replicas, plan.placement, plan.recompute_stages):
        assert not given or len(given) == plan.num_stages, plan
    ends = [0, *(end for _, end in plan.partition)]
    assert all(start == ends[index] and end > start for index, (start, end) in enumerate(plan.partition)), plan
    assert all(r >= 1 for r in plan.replicas) and all(d >= 0 for d in plan.placement), plan
    assert finite_at_least_zero(plan.optimizer_state_multiplier), plan


def check_outcome(read: Any, path: Path, check: Any) -> None:
    """``read(path)`` gives a model that passes ``check``, or a one-line PipesimError naming the file."""
    try:
        model = read(path)
    except PipesimError as error:
        message = str(error)
        assert "\n" not in message, message
        assert str(path) in message, message
        assert "=" in message or ": " in message, message
        return
    except Exception as error:  # noqa: BLE001 - the point: nothing else may escape
        raise AssertionError(f"{type(error).__name__} escaped: {error}") from error
    check(model)


@FUZZ
@given(text=mutated_json(PROFILE))
def test_profile_json_fuzz(tmp_path_factory: Any, text: str) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "profile.json"
    path.write_text(text, encoding="utf-8")
    check_outcome(load_profile, path, check_profile)


@FUZZ
@given(text=mutated_json(TOPOLOGY))
def test_topology_json_fuzz(tmp_path_factory: Any, text: str) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "topology.json"
    path.write_text(text, encoding="utf-8")
    check_outcome(load_topology, path, check_topology)


@FUZZ
@given(text=mutated_json(PLAN))
def test_plan_json_fuzz(tmp_path_factory: Any, text: str) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "plan.json"
    path.write_text(text, encoding="utf-8")
    check_outcome(load_plan, path, check_plan)


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
    check_outcome(load_profile, path, check_profile)


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


def check_sweep_spec(spec: Any) -> None:
    """An accepted sweep spec's axes: each non-empty, counts of 1 or more, uniform profiles of
    finite non-negative times and sizes, spreads and optimizer multipliers finite and non-negative."""
    for axis in (spec.profile, spec.stages, spec.microbatches, spec.schedule, spec.jitter, spec.optimizer_state):
        assert len(axis) >= 1, spec
    assert all(isinstance(n, int) and n >= 1 for n in (*spec.stages, *spec.microbatches, *spec.stages_per_rank))
    assert all(k is None or k >= 1 for k in spec.minibatches)
    assert all(finite_at_least_zero(value) for value in (*spec.jitter, *spec.optimizer_state))
    for item in spec.profile:
        uniform = getattr(item, "uniform", None)
        if uniform is not None:
            assert uniform.layers >= 1 and uniform.microbatch_size >= 1, uniform
            assert all(finite_at_least_zero(v) for v in (uniform.forward_ms, uniform.backward_ms,
                                                         uniform.activation_bytes, uniform.param_bytes)), uniform


@FUZZ
@given(text=mutated_json(SPEC))
def test_sweep_spec_fuzz(tmp_path_factory: Any, text: str) -> None:
    from pipesim.sweep.spec import load_spec

    path = tmp_path_factory.mktemp("fuzz") / "spec.yaml"
    path.write_text(text, encoding="utf-8")  # JSON is YAML
    check_outcome(load_spec, path, check_sweep_spec)


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
