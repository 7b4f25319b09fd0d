"""Sweep specs: ranges, products, the where filter, validation errors, batching and rows (no Dask)."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

import pipesim
from pipesim.errors import ConfigError
from pipesim.spec.stages import balance_partition
from pipesim.sweep import (
    COLUMNS,
    Expression,
    PointRunner,
    Resolved,
    even_partition,
    load_spec,
    make_batches,
    parse_spec,
    read_table,
)
from pipesim.cli import main
from pipesim.sweep.batches import BATCHES_PER_WORKER, FIRST_PIECES_PER_WORKER, plan_batches, point_cost
from pipesim.sweep.points import SHARED_WORK, shared_work_order
from pipesim.sweep.store import read_run
from pipesim.spec.units import parse_duration

ROOT = Path(__file__).resolve().parents[2]

ISSUE_SPEC = {
    "profile": {"uniform": {"layers": 128, "forward_ms": 1.0, "backward_ms": 2.0, "activation_bytes": 1000000,
                            "param_bytes": 4000000}},
    "bandwidth": ["10GB/s", "100GB/s"],
    "latency": ["5us"],
    "stages": [2, 4, 8, 16, 32, 64],
    "microbatches": {"range": [2, 512]},
    "minibatches": [4],
    "schedule": ["gpipe", "1f1b", "pipedream", "2bw", "pipemare"],
    "where": "microbatches >= stages and microbatches <= 8 * stages",
}


def points_of(data: dict[str, object]) -> list[dict[str, object]]:
    return Resolved(parse_spec(data)).points()


def test_the_issue_spec_expands_to_the_filtered_product() -> None:
    points = points_of(ISSUE_SPEC)
    # m runs p..8p for each p: 7p + 1 values; times 5 schedules and 2 bandwidths.
    assert len(points) == sum(7 * p + 1 for p in (2, 4, 8, 16, 32, 64)) * 5 * 2
    assert [point["point"] for point in points] == list(range(len(points)))
    assert all(p["num_stages"] <= p["num_microbatches"] <= 8 * p["num_stages"] for p in points)
    first = points[0]
    assert (first["bandwidth_bytes_per_s"], first["latency_s"], first["num_stages"], first["num_microbatches"],
            first["num_minibatches"], first["schedule"]) == (1e10, parse_duration("5us"), 2, 2, 4, "gpipe")
    # The last axis varies fastest: schedules cycle first.
    assert [p["schedule"] for p in points[:6]] == ["gpipe", "1f1b", "pipedream", "2bw", "pipemare", "gpipe"]
    assert points[5]["num_microbatches"] == 3


def test_ranges_steps_scalars_and_defaults() -> None:
    spec = parse_spec({"profile": "traces/uniform32.json", "stages": {"range": [2, 8, 2]},
                       "microbatches": {"range": [4, 12], "step": 4}, "schedule": "gpipe", "seeds": [1, 2]})
    assert spec.stages == (2, 4, 6, 8)
    assert spec.microbatches == (4, 8, 12)
    assert spec.schedule == ("gpipe",)
    assert spec.seed == (1, 2)
    points = Resolved(spec, base_dir=ROOT).points()
    assert len(points) == 4 * 3 * 2
    assert {p["num_minibatches"] for p in points} == {1}
    assert {p["bandwidth_bytes_per_s"] for p in points} == {math.inf}
    mixed = points_of({**ISSUE_SPEC, "minibatches": None, "stages": [4], "microbatches": [8], "where": None})
    assert {p["schedule"]: p["num_minibatches"] for p in mixed} == {
        "gpipe": 1, "1f1b": 1, "pipedream": 4, "2bw": 4, "pipemare": 4}


@pytest.mark.parametrize(
    ("change", "field", "fragment"),
    [
        ({"stages": [0]}, "stages[0]", "greater than or equal to 1"),
        ({"stages": [2.5]}, "stages[0]", "integer"),
        ({"microbatches": {"range": [8, 2]}}, "microbatches", "first <= last"),
        ({"microbatches": {"range": [1, 8], "stride": 2}}, "microbatches", "range"),
        ({"schedule": ["gpipe", "zigzag"]}, "schedule[1]", "unknown schedule"),
        ({"bandwidth": ["10GBs"]}, "bandwidth[0]", "unknown unit"),
        ({"latency": ["fast"]}, "latency[0]", "unit"),
        ({"memory_limit": ["lots"]}, "memory_limit[0]", "unit"),
        ({"partition": ["random"]}, "partition[0]", "balanced"),
        ({"colour": "blue"}, "colour", "Extra inputs"),
        ({"where": "stages >"}, "where", "not a valid expression"),
        ({"where": "__import__('os').system('true')"}, "where", "is not allowed"),
        ({"where": "stages.bit_length() > 1"}, "where", "is not allowed"),
        ({"where": "layers > colour"}, "where", "unknown name"),
        ({"topology": "t.json"}, "topology", "not both"),
        # A misspelt required field: missing, and the unknown name beside it said.
        ({"stages": None, "stage": [2]}, "stages", "is required; 'stage' is not a field"),
    ],
)
def test_bad_specs_name_the_field(change: dict[str, object], field: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_spec({key: value for key, value in {**ISSUE_SPEC, **change}.items() if value is not None})
    assert caught.value.field == field
    assert fragment in str(caught.value)
    assert "\n" not in str(caught.value)


def test_where_on_axes_apart_keeps_exactly_the_product_filtered_in_order() -> None:
    """Axes read by ``where`` with unread ones between and after them: the points are the unfiltered
    product's, in its order, that the same condition written in Python keeps."""
    spec = {**ISSUE_SPEC, "stages": [2, 3, 4], "microbatches": {"range": [1, 12]}, "recompute": [False, True]}
    del spec["where"]
    every = points_of(spec)
    where = "microbatches % stages == 0 and (schedule != 'gpipe' or bandwidth > 5e10) and not recompute"
    kept = points_of({**spec, "where": where})
    expected = [p for p in every if p["num_microbatches"] % p["num_stages"] == 0 and not p["recompute"]
                and (p["schedule"] != "gpipe" or p["bandwidth_bytes_per_s"] > 5e10)]
    assert 0 < len(kept) < len(every)
    assert [{**p, "point": 0} for p in kept] == [{**p, "point": 0} for p in expected]
    assert [p["point"] for p in kept] == list(range(len(kept)))


def test_where_expressions() -> None:
    fields = ("stages", "microbatches", "schedule", "recompute")
    check = Expression("microbatches % stages == 0 and schedule in ['1f1b', '2bw'] and not recompute", fields)
    assert check({"stages": 4, "microbatches": 8, "schedule": "2bw", "recompute": False})
    assert not check({"stages": 4, "microbatches": 6, "schedule": "2bw", "recompute": False})
    assert not check({"stages": 4, "microbatches": 8, "schedule": "gpipe", "recompute": False})
    assert Expression("1 < stages <= 4 or microbatches // 2 - 1 == -1 * -3", fields)({"stages": 9, "microbatches": 8})
    with pytest.raises(ConfigError, match="fails on point"):
        Expression("microbatches / (stages - 4) > 1", fields)({"stages": 4, "microbatches": 8})
    for forbidden in ("(lambda: 1)()", "stages[0]", "[x for x in stages]", "stages if true else 1", "stages ** 2"):
        with pytest.raises(ConfigError, match="not allowed"):
            Expression(forbidden, fields)


def test_load_spec_reports_yaml_errors(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("stages: [2, 4\nschedule: gpipe\n")
    with pytest.raises(ConfigError, match="is not valid YAML") as caught:
        load_spec(path)
    assert "line" in str(caught.value)
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_spec(path)


def test_make_batches_runs_the_heaviest_first_and_keeps_shared_work_together() -> None:
    points = shared_work_order(points_of({**ISSUE_SPEC, "stages": [2, 4, 8, 16]}))
    batches = make_batches(points, 2)
    # Every point once; within a batch the sweep's order (points that share work side by side).
    assert sorted(p["point"] for batch in batches for p in batch) == sorted(p["point"] for p in points)
    order = {p["point"]: index for index, p in enumerate(points)}
    assert all([order[p["point"]] for p in batch] == sorted(order[p["point"]] for p in batch) for batch in batches)
    # Heaviest first, and none heavier than a quarter of a worker's share unless one group of shared work is.
    costs = [sum(point_cost(p) for p in batch) for batch in batches]
    total = sum(costs)
    # The tail is light: once a batch is under two of the smallest batches' share, every later one is.
    light = [cost < 2 * total / (BATCHES_PER_WORKER * 2) for cost in costs]
    first_light = light.index(True)
    assert all(light[first_light:]) and costs[:first_light] == sorted(costs[:first_light], reverse=True)
    heaviest_group = max(sum(point_cost(p) for p in points if all(p[a] == q[a] for a in SHARED_WORK))
                         for q in points)
    assert costs[0] <= max(total / (FIRST_PIECES_PER_WORKER * 2), heaviest_group)
    # The two points of a group (its two bandwidths) are never split: the batches are made of whole groups.
    for batch in batches:
        keys = [tuple(p[a] for a in SHARED_WORK) for p in batch]
        assert all(keys.count(key) == 2 for key in keys)
    assert make_batches([], 4) == []


def test_plan_batches_packs_light_pieces_and_cuts_heavy_families() -> None:
    # Two workers: pieces at most 1/8 of the work (22 / 8 = 2.75), batches at least 1/48 of it.
    families = [[[1, 2], [3]], [[10]], [[1, 1, 1, 1, 1, 1]]]
    assert plan_batches(families, float, 2) == [[10], [3], [2], [1, 1], [1, 1], [1, 1], [1]]
    # Groups kept whole where asked (a search configuration's recomputation modes).
    assert plan_batches(families, float, 2, split_groups=False) == [[10], [1, 1, 1, 1, 1, 1], [1, 2], [3]]
    # On one worker a family is cut into pieces of at most a quarter of the work.
    assert plan_batches([[[1] * 48]], float, 1) == [[1] * 12] * 4
    assert plan_batches([], float, 3) == [] and plan_batches([[[]]], float, 3) == []


@pytest.mark.parametrize("num_stages", [2, 4, 8, 16, 32, 64])
def test_balanced_partition_of_uniform_layers_is_even(num_stages: int) -> None:
    # Float prefix sums once made 128 uniform layers split 40/40/40/8 on 4 stages.
    profile = pipesim.uniform_profile(num_layers=128, forward_s=1e-3, backward_s=2e-3)
    assert balance_partition(profile, num_stages) == even_partition(128, num_stages)


def test_even_partition() -> None:
    assert even_partition(10, 4) == ((0, 3), (3, 6), (6, 8), (8, 10))
    with pytest.raises(ConfigError):
        even_partition(3, 4)


def test_a_row_holds_inputs_metrics_engine_seed_and_version() -> None:
    resolved = Resolved(parse_spec({**ISSUE_SPEC, "stages": [4], "microbatches": [2, 8], "bandwidth": ["10GB/s"],
                                    "schedule": ["2bw", "pipedream"], "where": None, "memory_limit": ["1GB"]}))
    points = resolved.points()
    rows = PointRunner(resolved).run_batch(points)
    assert [list(row) for row in rows] == [list(COLUMNS)] * len(rows)
    failed, ok = rows[0], rows[2]
    assert (failed["schedule"], failed["num_microbatches"]) == ("2bw", 2)
    assert "must be >= num_stages for 2bw" in failed["error"] and math.isnan(failed["iteration_time_s"])
    assert (ok["schedule"], ok["num_microbatches"], ok["error"]) == ("2bw", 8, "")
    profile = resolved.profiles[0][1]
    direct = pipesim.simulate(
        profile, pipesim.Topology.uniform(num_devices=4, bandwidth="10GB/s", latency="5us"), schedule="2bw",
        num_stages=4, num_microbatches=8, num_minibatches=4, engine="auto",
    ).metrics
    assert ok["iteration_time_s"] == direct.iteration_time_s
    assert ok["throughput_samples_per_s"] == direct.throughput_samples_per_s
    assert ok["peak_memory_bytes"] == direct.peak_memory_bytes
    assert ok["engine"] == direct.engine and ok["seed"] == 0 and ok["pipesim_version"] == pipesim.__version__
    assert ok["weight_versions_max"] == 2
    assert json.loads(ok["stage_weight_versions"]) == [2, 2, 2, 2]
    assert json.loads(ok["partition"]) == [[0, 32], [32, 64], [64, 96], [96, 128]]
    assert ok["memory_limit_bytes"] == 1e9 and ok["fits_memory"] == (direct.peak_memory_bytes <= 1e9)
    assert all(not isinstance(value, list | dict) for value in ok.values())


def test_rows_across_bandwidths_and_recomputation_match_direct_simulation() -> None:
    resolved = Resolved(parse_spec({**ISSUE_SPEC, "stages": [4], "microbatches": [8], "schedule": ["1f1b"],
                                    "where": None, "recompute": [False, True]}))
    rows = PointRunner(resolved).run_batch(resolved.points())
    assert len(rows) == 4
    for row in rows:
        direct = pipesim.simulate(
            resolved.profiles[0][1], pipesim.Topology.uniform(num_devices=4, bandwidth=row["bandwidth_bytes_per_s"],
                                                              latency=row["latency_s"]),
            schedule="1f1b", num_stages=4, num_microbatches=8, num_minibatches=4, recompute=row["recompute"],
            engine="auto",
        ).metrics
        assert (row["iteration_time_s"], row["peak_memory_bytes"]) == (direct.iteration_time_s,
                                                                       direct.peak_memory_bytes)
    assert len({row["iteration_time_s"] for row in rows}) == 4


def test_cli_reports_a_bad_spec_in_one_line(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("profile: {uniform: {layers: 8, forward_ms: 1, backward_ms: 2}}\nstages: [2]\n"
                    "microbatches: [4]\nschedule: [gpipe]\nwhere: \"open('x')\"\n")
    done = subprocess.run([sys.executable, "-m", "pipesim", "sweep", str(spec), "--out", str(tmp_path / "r.parquet")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "where" in done.stderr and "not allowed" in done.stderr
    assert not (tmp_path / "r.parquet.parts").exists()


@pytest.mark.parametrize(
    ("where", "fragment"),
    [
        ("'a' * 999999999 * 999 == 'b'", "builds a value too large"),
        ("[stages] * 99999999 * 99999999 == []", "builds a value too large"),
    ],
)
def test_cli_where_cannot_exhaust_memory(tmp_path: Path, where: str, fragment: str) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("profile: {uniform: {layers: 8, forward_ms: 1, backward_ms: 2}}\nstages: [2]\n"
                    f"microbatches: [4]\nschedule: [gpipe]\nwhere: {json.dumps(where)}\n")
    done = subprocess.run([sys.executable, "-m", "pipesim", "sweep", str(spec), "--out", str(tmp_path / "r.parquet")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "where=" in done.stderr and fragment in done.stderr
    assert not (tmp_path / "r.parquet").exists() and not (tmp_path / "r.parquet.parts").exists()


@pytest.mark.parametrize(
    ("where", "fragment"),
    [
        ("stages * 2**300 > 1", "not allowed"),
        (f"stages * {10 ** 100} > 1", "has a number too large"),
        ("stages * 99999999999999999999 * 99999999999999999999 * 99999999999999999999 * 99999999999999999999 > 1",
         "builds a value too large"),
        ("'%0999999999d' % stages == 'b'", "% formats a string"),
        ("schedule % 2 == 'b'", "fails on point {'schedule': 'gpipe'}"),
        ("[[stages] * 10000] * 10000 == [[stages] * 10000] * 10000", "builds a value too large"),
        ("[['a' * 5000, 'b' * 5000, 'c']] == []", "builds a value too large"),
    ],
)
def test_where_bounds_every_value(where: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Expression(where, ("stages", "schedule"))({"stages": 2, "schedule": "gpipe"})
    assert caught.value.field == "where" and fragment in str(caught.value) and "\n" not in str(caught.value)


def test_where_bounds_keep_small_values_working() -> None:
    fields = ("stages", "schedule")
    check = Expression("'ab' * stages == 'abab' and [stages] * 3 == [2, 2, 2] and stages * 4611686018427387904 > 0 "
                       "and stages % 2 == 0", fields)
    assert check({"stages": 2, "schedule": "gpipe"})
    assert not check({"stages": 3, "schedule": "gpipe"})
    with pytest.raises(ConfigError, match="too large"):
        Expression("'x' * stages == ''", fields)({"stages": 10_001, "schedule": "gpipe"})
    assert not Expression("'x' * stages == ''", fields)({"stages": 10_000, "schedule": "gpipe"})


def test_cli_sweep_sets_stages_per_rank_and_reads_profiles_beside_the_spec(tmp_path: Path) -> None:
    folder = tmp_path / "study"
    folder.mkdir()
    (folder / "model.json").write_bytes((ROOT / "traces" / "vgg16.json").read_bytes())
    (folder / "spec.yaml").write_text("profile: [model.json]\nstages: [4]\nstages_per_rank: [1, 2]\n"
                                      "microbatches: [8]\nschedule: [1f1b, interleaved-1f1b]\n")
    out = tmp_path / "rows.csv"
    done = subprocess.run([sys.executable, "-m", "pipesim", "sweep", str(folder / "spec.yaml"), "--out", str(out),
                           "--workers", "1"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    rows = {(row["schedule"], row["stages_per_rank"]): row for row in read_table(out).to_dict(orient="records")}
    assert {row["profile"] for row in rows.values()} == {"model.json"}
    assert "one stage per rank" in rows[("1f1b", 2)]["error"]
    interleaved = rows[("interleaved-1f1b", 2)]
    direct = pipesim.simulate(pipesim.load_profile(folder / "model.json"), pipesim.Topology.uniform(num_devices=2),
                              schedule="interleaved-1f1b", num_stages=4, num_microbatches=8, stages_per_rank=2,
                              engine="analytic")
    assert pd.isna(interleaved["error"]) and interleaved["iteration_time_s"] == direct.metrics.iteration_time_s
    assert pd.isna(rows[("1f1b", 1)]["error"])
    run = read_run(out)  # what produced the table, kept beside a CSV (in a Parquet table's metadata)
    assert run is not None and run["command"] == "pipesim sweep spec.yaml"
    assert run["spec"]["sha256"] == hashlib.sha256((folder / "spec.yaml").read_bytes()).hexdigest()
    assert run["profiles"] == [{"name": "model.json",
                                "sha256": hashlib.sha256((folder / "model.json").read_bytes()).hexdigest()}]


BASE_SPEC = "profile: {uniform: {layers: 8, forward_ms: 1, backward_ms: 2}}\nstages: [2]\nmicrobatches: [4]\n"


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        # A where nested past the parser's stack, or deeper than compiling it may recurse.
        ("schedule: [gpipe]\nwhere: \"" + "not " * 5000 + "1\"\n",
         "where='" + "not " * 19 + "...: is nested too deeply (at most 100 levels of operators and lists)"),
        ("schedule: [gpipe]\nwhere: \"" + "-" * 5000 + "1\"\n",
         "where='" + "-" * 76 + "...: is nested too deeply (at most 100 levels of operators and lists)"),
        ("schedule: [gpipe]\nwhere: \"" + "not " * 150 + "1\"\n",
         "where='" + "not " * 19 + "...: is nested too deeply (at most 100 levels of operators and lists)"),
        # A seed the table's int64 column cannot hold.
        ("schedule: [gpipe]\njitter: [0.1]\nseeds: [99999999999999999999999999999999999999]\n",
         "seeds[0]=99999999999999999999999999999999999999: Input should be less than or equal to 9223372036854775807"),
        # A key given twice: YAML would keep the last silently.
        ("schedule: [gpipe]\nstages: [4]\n", "stages=[4]: is given twice in one mapping (lines 2 and 5)"),
        ("schedule: [gpipe]\nrecompute: {a: 1, a: 2}\n", "a=2: is given twice in one mapping (line 5)"),
        # A value listed twice in one axis: each of its points would be simulated twice.
        ("schedule: [1f1b, 1f1b]\n", "schedule[1]='1f1b': is listed twice"),
        ("schedule: [gpipe]\njitter: [1000]\n", "jitter[0]=1000: Input should be less than or equal to 100"),
        ("schedule: [gpipe]\nrecompute: [\"yes\"]\n", "recompute[0]='yes': must be true or false, not a string"),
        ("schedule: [gpipe]\nbandwidth: [10GB/s, 10000MB/s]\n", "bandwidth[1]='10000MB/s': is listed twice"),
        ("schedule: [gpipe]\nseeds: [3, 3]\n", "seeds[1]=3: is listed twice"),
        # A bad uniform profile names its field, not the file name the union also tried.
        ("schedule: [gpipe]\nprofile: [{uniform: {layers: 8, forward_ms: -1, backward_ms: 2}}]\n",
         "profile[0].uniform.forward_ms=-1: Input should be greater than or equal to 0"),
        ("schedule: [gpipe]\nprofile: [{uniform: {layers: 8, forward_ms: .nan, backward_ms: 2}}]\n",
         "profile[0].uniform.forward_ms=nan: Input should be a finite number"),
        ("schedule: [gpipe]\nprofile: [{uniform: {layers: true, forward_ms: 1, backward_ms: 2}}]\n",
         "profile[0].uniform.layers=True: Input should be a valid integer"),
        ("schedule: [gpipe]\nprofile: [{uniform: {layers: 8, forward_ms: 1, backward_ms: 2, colour: 1}}]\n",
         "profile[0].uniform.colour=1: Extra inputs are not permitted"),
        ("schedule: [gpipe]\nprofile: [3]\n", "profile[0]=3: must be a file name, {uniform: {...}} or {model: {...}}"),
        ("schedule: [gpipe]\nprofile: [{model: {preset: nope}}]\n", "profile[0].model.preset='nope': must be one of "
         "gpt3-175b, llama2-7b, llama2-70b, llama3-8b, llama3-70b, llama3-405b, bert-large"),
        ("schedule: [gpipe]\nprofile: [{model: {preset: llama3-8b, tp: 3}}]\n",
         "profile[0].model.tp=3: must divide the KV heads (8) or be a multiple of them"),
    ],
)
def test_cli_refuses_a_bad_spec_in_one_line_naming_the_field(lines: str, expected: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    text = BASE_SPEC + lines
    if "\nprofile:" in lines:  # the case's own profile in place of the base one
        text = text.split("\n", 1)[1]
    spec.write_text(text)
    with pytest.raises(SystemExit) as caught:
        main(["sweep", str(spec), "--out", str(tmp_path / "r.csv")])
    assert caught.value.code == 2
    assert capsys.readouterr().err == f"pipesim: error: {spec}: {expected}\n"
    assert not (tmp_path / "r.csv").exists() and not (tmp_path / "r.csv.parts").exists()


def test_yaml_merge_keys_may_be_overridden() -> None:
    from pipesim.sweep.spec import _UniqueKeyLoader

    data = yaml.load("base: &b {stages: [2], schedule: gpipe}\nspec:\n  <<: *b\n  stages: [4]\n",
                     Loader=_UniqueKeyLoader)
    assert data["spec"] == {"stages": [4], "schedule": "gpipe"}
