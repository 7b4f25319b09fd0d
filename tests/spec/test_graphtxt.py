"""Tests of the PipeDream graph.txt reader and of the shipped traces converted from it."""

from __future__ import annotations

import importlib.util
import os
import random
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from pipesim.errors import ConfigError
from pipesim.spec.files import load_profile, model_to_json, save_model
from pipesim.spec.graphtxt import DEVICE, parse_graph_txt, reorder_layers

REPO = Path(__file__).resolve().parents[2]
PIPEDREAM = REPO / "traces" / "pipedream"  # PipeDream's graph.txt files as released

# A diamond behind an input: node1 feeds node2 and node10, both feed node11. Nodes are listed out
# of order, and node10 must come after node2 (numeric, not string, tie-break).
DIAMOND = """\
node11 -- Add -- forward_compute_time=4.000, backward_compute_time=8.000, activation_size=400.0, parameter_size=0.000
node2 -- Conv2d(3, 8) -- forward_compute_time=2.500, backward_compute_time=5.000, activation_size=[150.0; 50.0], parameter_size=1000.000
node12 -- Linear -- forward_compute_time=1.000, backward_compute_time=2.000, activation_size=500.0, parameter_size=2000.000
node1 -- Input -- forward_compute_time=50.000, backward_compute_time=0.000, activation_size=100.0, parameter_size=0.000
node10 -- ReLU(inplace) -- forward_compute_time=3.000, backward_compute_time=6.000, activation_size=300.0, parameter_size=0.000
\tnode2 -- node11
\tnode1 -- node10
\tnode11 -- node12
\tnode10 -- node11
\tnode1 -- node2"""


def test_diamond_order_and_cut_bytes() -> None:
    profile = parse_graph_txt(DIAMOND, source="models/diamond/graph.txt")
    table = [
        (layer.name, layer.forward_s, layer.backward_s, layer.activation_bytes, layer.stash_bytes, layer.param_bytes)
        for layer in profile.layers
    ]
    assert table == [
        ("node1 Input", 0.0, 0.0, 100.0, 100.0, 0.0),  # the input's 50 ms is data loading: dropped
        ("node2 Conv2d(3, 8)", 0.0025, 0.005, 300.0, 200.0, 1000.0),  # node1 -> node10 still open
        ("node10 ReLU(inplace)", 0.003, 0.006, 500.0, 300.0, 0.0),  # node2 and node10 both feed node11
        ("node11 Add", 0.004, 0.008, 400.0, 400.0, 0.0),
        ("node12 Linear", 0.001, 0.002, 0.0, 500.0, 2000.0),  # a sink sends nothing
    ]
    assert profile.name == "diamond"
    assert profile.microbatch_size == 1
    assert profile.device == DEVICE
    assert profile.source == "models/diamond/graph.txt"


def test_ties_break_on_id_number_then_id_string() -> None:
    line = "-- X -- forward_compute_time=1.0, backward_compute_time=1.0, activation_size=1.0, parameter_size=0.0"
    text = "\n".join(f"{node_id} {line}" for node_id in ("node1", "compressed_node0", "node0", "a", "node12"))
    names = [layer.name.split()[0] for layer in parse_graph_txt(text, source="t.txt").layers]
    assert names == ["a", "compressed_node0", "node0", "node1", "node12"]


def test_stage_id_is_ignored_and_keywords_override() -> None:
    with_stages = "\n".join(
        line if line.startswith("\t") else line + " -- stage_id=3" for line in DIAMOND.splitlines()
    )
    assert parse_graph_txt(with_stages, source="d/graph.txt") == parse_graph_txt(DIAMOND, source="d/graph.txt")
    profile = parse_graph_txt(DIAMOND, source="x/graph_compressed.txt", microbatch_size=7)
    assert (profile.name, profile.microbatch_size) == ("x_compressed", 7)
    assert parse_graph_txt(DIAMOND, source="x/graph.txt", name="mine").name == "mine"


def test_long_descriptions_are_collapsed_and_truncated() -> None:
    desc = "EmuBidirLSTM(  (bidir): LSTM(1024, 1024, bidirectional=True)  (layer1): LSTM(1024, 1024))"
    text = f"node5 -- {desc} -- forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=1"
    name = parse_graph_txt(text, source="g.txt").layers[0].name
    assert name == "node5 EmuBidirLSTM( (bidir): LSTM(1024, 1024, bidirectional=T..."
    assert len(name) == 64


def _replace_line(line_index: int, new_line: str) -> str:
    lines = DIAMOND.splitlines()
    lines[line_index] = new_line
    return "\n".join(lines)


NODE2 = DIAMOND.splitlines()[1]
MALFORMED = [
    ("node2 -- Conv2d forward_compute_time=2.5, backward_compute_time=5.0, activation_size=1.0, parameter_size=0",
     "line 2", "3 or 4 fields"),
    (NODE2 + " -- stage_id=0 -- extra", "line 2", "3 or 4 fields"),
    (NODE2.replace("forward_compute_time=2.500", "forward_compute_time=fast"), "line 2.forward_compute_time",
     "plain decimal"),
    (NODE2.replace("backward_compute_time=5.000", "backward_compute_time=-5.0"), "line 2.backward_compute_time",
     ">= 0"),
    (NODE2.replace("parameter_size=1000.000", "parameter_size=nan"), "line 2.parameter_size", "plain decimal"),
    (NODE2.replace("forward_compute_time=2.500", "forward_compute_time=inf"), "line 2.forward_compute_time",
     "plain decimal"),
    (NODE2.replace("forward_compute_time=2.500", "forward_compute_time=1e999"), "line 2.forward_compute_time",
     "finite"),
    (NODE2.replace("[150.0; 50.0]", "[150.0; oops]"), "line 2.activation_size", "plain decimal"),
    (NODE2.replace("[150.0; 50.0]", "[150.0, 50.0]"), "line 2.values", "key=value"),
    (NODE2.replace(", parameter_size=1000.000", ""), "line 2.parameter_size", "missing"),
    (NODE2.replace("parameter_size=", "params="), "line 2.values", "key=value"),
    (NODE2 + ", forward_compute_time=1.0", "line 2.forward_compute_time", "twice"),
    (NODE2 + " -- stage=1", "line 2.stage_id", "stage_id=<int>"),
    (NODE2.replace("node2 ", "node1 "), "line 4.node_id", "defined twice (first on line 2)"),
]


@pytest.mark.parametrize(("bad_line", "field", "rule"), MALFORMED)
def test_malformed_node_lines_name_the_line_and_field(bad_line: str, field: str, rule: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_graph_txt(_replace_line(1, bad_line), source="bad/graph.txt")
    assert caught.value.field == field
    assert rule in caught.value.rule
    assert caught.value.source == "bad/graph.txt"
    assert str(caught.value).startswith(f"bad/graph.txt: {field}=")


@pytest.mark.parametrize(
    ("bad_edge", "field", "value"),
    [
        ("\tnode1 node2", "line 6", "node1 node2"),
        ("\tnode1 -- node2 -- node3", "line 6", "node1 -- node2 -- node3"),
        ("\tnode1 -- node99", "line 6.dst", "node99"),
        ("\tghost -- node2", "line 6.src", "ghost"),
    ],
)
def test_malformed_edges_name_the_line(bad_edge: str, field: str, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_graph_txt(_replace_line(5, bad_edge), source="bad/graph.txt")
    assert (caught.value.field, caught.value.value, caught.value.source) == (field, value, "bad/graph.txt")


def test_no_nodes_is_an_error() -> None:
    with pytest.raises(ConfigError, match="at least one node"):
        parse_graph_txt("\n\n", source="empty/graph.txt")


def test_cycle_is_an_error_naming_the_cycle_and_its_edge() -> None:
    text = DIAMOND + "\n\tnode11 -- node2"  # line 11 closes node2 -> node11 -> node2
    with pytest.raises(ConfigError) as caught:
        parse_graph_txt(text, source="loop/graph.txt")
    assert caught.value.field == "line 11"
    assert caught.value.value == "node2 -> node11 -> node2"
    assert "cycle" in caught.value.rule
    assert caught.value.source == "loop/graph.txt"


def test_self_loop_is_a_cycle() -> None:
    with pytest.raises(ConfigError, match="cycle") as caught:
        parse_graph_txt(DIAMOND + "\n\tnode12 -- node12", source="loop/graph.txt")
    assert caught.value.value == "node12 -> node12"


def test_vgg16_matches_the_traces_readme_table() -> None:
    profile = load_profile(PIPEDREAM / "vgg16" / "graph.txt")
    assert profile.num_layers == 41
    assert profile.name == "vgg16"
    assert profile.microbatch_size == 128
    assert round(sum(layer.forward_s for layer in profile.layers) * 1e3, 2) == 233.90
    assert round(sum(layer.backward_s for layer in profile.layers) * 1e3, 2) == 438.63
    assert round(sum(layer.param_bytes for layer in profile.layers) / 1e6, 1) == 553.4
    assert profile.layers[0].name == "node1 Input" and profile.layers[0].forward_s == 0.0
    # The one diamond, MaxPool -> Size -> View plus MaxPool -> View: both outputs cross after Size.
    size_index = next(index for index, layer in enumerate(profile.layers) if "Size(0)" in layer.name)
    maxpool = profile.layers[size_index - 1].activation_bytes
    assert profile.layers[size_index].activation_bytes == maxpool + 4
    assert profile.layers[-1].activation_bytes == 0.0


@pytest.mark.parametrize("model", ["vgg16", "resnet50", "gnmt"])
def test_shuffled_lines_give_the_same_profile(model: str) -> None:
    lines = (PIPEDREAM / model / "graph.txt").read_text(encoding="utf-8").splitlines()
    node_lines = [line for line in lines if not line.startswith("\t")]
    edge_lines = [line for line in lines if line.startswith("\t")]
    generator = random.Random(2019)
    generator.shuffle(node_lines)
    generator.shuffle(edge_lines)
    shuffled = "\n".join(node_lines + edge_lines)
    original = "\n".join(lines)
    assert parse_graph_txt(shuffled, source=f"{model}/graph.txt") == parse_graph_txt(original, source=f"{model}/graph.txt")


def _converter() -> ModuleType:
    spec = importlib.util.spec_from_file_location("convert_traces", REPO / "traces" / "convert.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shipped_traces_equal_a_fresh_conversion() -> None:
    convert = _converter()
    profiles = convert.build_profiles(PIPEDREAM)
    shipped = {path.stem for path in (REPO / "traces").glob("*.json")}
    assert shipped == set(profiles)
    for stem, profile in profiles.items():
        text = (REPO / "traces" / f"{stem}.json").read_text(encoding="utf-8")
        assert text == model_to_json(profile), f"traces/{stem}.json drifted; run python traces/convert.py"
    for stem in set(convert.MODELS) - {"inception_v3"}:  # original files come out in node-number order
        numbers = [int(layer.name.split()[0].removeprefix("node")) for layer in profiles[stem].layers]
        assert numbers == sorted(numbers), stem
    readme = (REPO / "traces" / "README.md").read_text(encoding="utf-8")
    assert convert.render_table(profiles) in readme
    inferred = {stem: profile.microbatch_size for stem, profile in profiles.items()}
    assert inferred == {
        "alexnet": 256, "vgg16": 128, "resnet18": 256, "resnet50": 128, "resnet101": 64, "resnext50": 128,
        "resnext101": 64, "squeezenet1_0": 256, "densenet121": 64, "inception_v3": 128, "nasnetamobile": 128,
        "nasnetalarge": 16, "gnmt": 32, "gnmt_large": 128, "uniform32": 1,
    }


def test_converter_check_through_its_entry_point() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "traces" / "convert.py"), "--check"],
        capture_output=True, text=True, check=False,
    )
    assert (result.returncode, result.stdout.strip()) == (0, "up to date"), result.stderr


def test_load_profile_reads_graph_txt_and_shipped_json(tmp_path: Path) -> None:
    folder = tmp_path / "diamond"
    folder.mkdir()
    (folder / "graph.txt").write_text(DIAMOND, encoding="utf-8")
    assert load_profile(folder / "graph.txt") == parse_graph_txt(DIAMOND, source=str(folder / "graph.txt"))
    vgg16 = load_profile(REPO / "traces" / "vgg16.json")
    assert (vgg16.name, vgg16.num_layers, vgg16.microbatch_size) == ("vgg16", 41, 128)
    assert vgg16.source == "traces/pipedream/vgg16/graph.txt"
    assert load_profile(PIPEDREAM / "vgg16" / "graph.txt").layers == vgg16.layers


def test_saved_profile_round_trips_and_follows_the_umask(tmp_path: Path) -> None:
    profile = parse_graph_txt(DIAMOND, source="models/diamond/graph.txt")
    previous = os.umask(0o022)
    try:
        save_model(profile, tmp_path / "diamond.json")
    finally:
        os.umask(previous)
    assert (tmp_path / "diamond.json").stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600
    assert load_profile(tmp_path / "diamond.json") == profile
    assert [path.name for path in tmp_path.iterdir()] == ["diamond.json"]  # no temporary left behind


def test_reordered_layers_cut_as_the_graph_read_in_that_order() -> None:
    """The diamond with its ReLU before its Conv2d: as if the file had numbered them that way."""
    reordered = reorder_layers(parse_graph_txt(DIAMOND, source="diamond/graph.txt"), [0, 2, 1, 3, 4])
    relu_first = "\n".join([
        "node1 -- Input -- forward_compute_time=50.000, backward_compute_time=0.000, activation_size=100.0, parameter_size=0.000",
        "node2 -- ReLU(inplace) -- forward_compute_time=3.000, backward_compute_time=6.000, activation_size=300.0, parameter_size=0.000",
        "node10 -- Conv2d(3, 8) -- forward_compute_time=2.500, backward_compute_time=5.000, activation_size=[150.0; 50.0], parameter_size=1000.000",
        "node11 -- Add -- forward_compute_time=4.000, backward_compute_time=8.000, activation_size=400.0, parameter_size=0.000",
        "node12 -- Linear -- forward_compute_time=1.000, backward_compute_time=2.000, activation_size=500.0, parameter_size=2000.000",
        "\tnode1 -- node2", "\tnode1 -- node10", "\tnode2 -- node11", "\tnode10 -- node11", "\tnode11 -- node12",
    ])
    expected = parse_graph_txt(relu_first, source="diamond/graph.txt")
    # input 100 (both still read it); + ReLU 300; ReLU 300 + Conv 200; Add 400; the sink sends nothing
    assert [layer.activation_bytes for layer in reordered.layers] == [100.0, 400.0, 500.0, 400.0, 0.0]
    assert [layer.model_copy(update={"name": ""}) for layer in reordered.layers] == [
        layer.model_copy(update={"name": ""}) for layer in expected.layers]
    assert [layer.inputs for layer in reordered.layers] == [(), (0,), (0,), (1, 2), (3,)]
    with pytest.raises(ConfigError, match="after the layers it reads"):
        reorder_layers(reordered, [1, 0, 2, 3, 4])
