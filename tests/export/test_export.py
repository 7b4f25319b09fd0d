"""The Perfetto trace's structure, the HTML reports, and the plot command, through the CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import pipesim
from pipesim.cli import main
from pipesim.export.chrome import chrome_json, to_chrome
from pipesim.sweep import PointRunner, Resolved, parse_spec, write_table

ROOT = Path(__file__).resolve().parents[2]


def ns(microseconds: float) -> int:
    return round(microseconds * 1000)  # as Perfetto's JSON importer reads a float of microseconds


@pytest.fixture(scope="module")
def result() -> pipesim.Result:
    profile = pipesim.uniform_profile(num_layers=8, forward_s=1e-3, backward_s=2e-3, activation_bytes=4e7,
                                      param_bytes=1e6)
    topology = pipesim.Topology.uniform(num_devices=4, bandwidth="10GB/s", latency="5us")
    return pipesim.simulate(profile, topology, schedule="2bw", num_stages=4, num_microbatches=4, num_minibatches=3)


def test_perfetto_trace_has_processes_threads_slices_and_counters(result: pipesim.Result) -> None:
    trace = result.trace
    text = chrome_json(trace)
    assert text == chrome_json(trace)
    data = json.loads(text)
    assert list(data)[0] == "traceEvents"
    events = data["traceEvents"]
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events if e["ph"] == "M" and "name" in e["args"]}
    slices = [e for e in events if e["ph"] == "X"]
    assert all(e["pid"] >= 1 and e["tid"] >= 1 for e in slices)
    for device in range(4):
        assert names[(device + 1, None)] == f"device {device}"
        assert names[(device + 1, 1)] == "compute"
    # Stage 1 sends activations to device 2 and gradients to device 0: one thread per link.
    assert names[(2, 2)] == "send -> device 0" and names[(2, 4)] == "send -> device 2"
    assert {(e["pid"], e["tid"]) for e in slices} <= set(names)
    s = trace.spans
    compute = [e for e in slices if e["tid"] == 1]
    assert len(compute) == int((s["stream"] == 0).sum()) and len(slices) - len(compute) == int((s["stream"] == 1).sum())
    assert {e["name"] for e in compute} >= {"0F0", "3B11", "0U0"}
    by_thread: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for event in slices:
        by_thread[(event["pid"], event["tid"])].append(event)
    for thread in by_thread.values():
        thread.sort(key=lambda e: (ns(e["ts"]), ns(e["dur"])))
        for before, after in zip(thread, thread[1:], strict=False):
            assert ns(before["ts"]) + ns(before["dur"]) <= ns(after["ts"]), (before, after)
    counters = [e for e in events if e["ph"] == "C"]
    for stage in result.metrics.stages:
        totals = [e["args"]["total"] for e in counters if e["name"] == f"memory stage {stage.stage} total (bytes)"]
        assert max(totals) == pytest.approx(stage.peak_memory_bytes)
        by_kind = [e for e in counters if e["name"] == f"memory stage {stage.stage} (bytes)"]
        assert set(by_kind[0]["args"]) == {"weights", "gradients", "optimizer", "activations", "working"}
        assert [e["ts"] for e in by_kind] == sorted({e["ts"] for e in by_kind})
    assert to_chrome(trace)["otherData"]["schedule"] == "2bw"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipesim", *args], capture_output=True, text=True, timeout=180,
                          cwd=ROOT)


def figures_in(html: str) -> int:
    return len(re.findall(r'src="data:image/png;base64,', html)) + html.count("<svg")


def assert_self_contained(html: str) -> None:
    assert not re.search(r'(src|href)="(?!data:|#)', html) and "<script" not in html and "<link" not in html


def test_simulation_report_is_one_self_contained_file(tmp_path: Path) -> None:
    folder = tmp_path / "report"
    done = cli("simulate", "--profile", "traces/vgg16.json", "--stages", "4", "--microbatches", "8", "--schedule",
               "1f1b", "--bandwidth", "25Gbit/s", "--latency", "5us", "--out", str(folder))
    assert done.returncode == 0, done.stderr
    done = cli("report", str(folder), "--out", str(folder / "a.html"))
    assert done.returncode == 0, done.stderr
    main(["report", str(folder), "--out", str(folder / "b.html")])
    html = (folder / "a.html").read_text()
    assert (folder / "a.html").read_bytes() == (folder / "b.html").read_bytes()
    assert_self_contained(html)
    # timeline, memory of each stage, peak breakdown; no staleness chart (1f1b's is all 0 and 1)
    assert figures_in(html) == 1 + 4 + 1
    assert html.count("<table>") == 4 and "iteration time" in html and "<td>25:41</td>" in html  # run, summary, devices, stages
    svg = tmp_path / "svg.html"
    main(["report", str(folder / "trace.json"), "--out", str(svg), "--figures", "svg"])
    text = svg.read_text()
    assert "data:image/png" not in text and text.count("<svg") == 6
    assert_self_contained(text.replace('xmlns:xlink="http://www.w3.org/1999/xlink"', "").replace(
        'xmlns="http://www.w3.org/2000/svg"', ""))


@pytest.fixture(scope="module")
def table_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    resolved = Resolved(parse_spec({
        "profile": {"uniform": {"layers": 8, "forward_ms": 1, "backward_ms": 2, "param_bytes": 1e6}},
        "stages": [2, 4], "microbatches": [2, 4, 8], "schedule": ["gpipe", "1f1b", "2bw"],
    }))
    path = tmp_path_factory.mktemp("table") / "results.csv"
    write_table(pd.DataFrame(PointRunner(resolved).run_batch(resolved.points())), path)
    return path


def test_sweep_report(table_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "sweep.html"
    main(["report", str(table_path), "--out", str(out)])
    html = out.read_text()
    assert_self_contained(html)
    for heading in ("Summary", "Best throughput per schedule", "Pareto front", "Errors", "Figures"):
        assert f"<h2>{heading}" in html
    assert "must be &gt;= num_stages for 2bw" in html
    assert figures_in(html) == 2 + 3 + 1  # bubble at p=2 and p=4, a heatmap per schedule, the Pareto front


def test_plot_command_writes_each_kind(result: pipesim.Result, table_path: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    trace_path = tmp_path / "trace.json"
    trace_path.write_text(result.trace.to_json())
    for args in (["timeline", str(trace_path), "--out", str(tmp_path / "t.svg")],
                 ["memory", str(trace_path), "--stage", "2", "--out", str(tmp_path / "m.png")],
                 ["memory", str(trace_path), "--peaks", "--out", str(tmp_path / "peaks.pdf")],
                 ["staleness", str(trace_path), "--out", str(tmp_path / "s.png")],
                 ["bubble", str(table_path), "--stages", "2", "--out", str(tmp_path / "b.png")],
                 ["sweep", str(table_path), "--where", "schedule == '1f1b'", "--out", str(tmp_path / "h.png")],
                 ["sweep", str(table_path), "--kind", "pareto", "--out", str(tmp_path / "p.png")]):
        main(["plot", *args])
        target = Path(args[args.index("--out") + 1])
        assert target.stat().st_size > 1000 and f"wrote {target}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["plot", "sweep", "TABLE", "--where", "colour == 1", "--out", "x.png"], "where='colour': unknown name"),
        (["plot", "bubble", "TABLE", "--stages", "3", "--out", "x.png"], "num_stages=3: no successful row"),
        (["plot", "timeline", "no/such/trace.json", "--out", "x.png"], "file does not exist"),
        (["plot", "staleness", "TABLE", "--out", "x.png"], "trace"),
        (["plot", "sweep", "TABLE", "--value", "speed", "--out", "x.png"], "column='speed': is not in the table"),
        (["plot", "sweep", "TABLE", "--out", "x.gif"], "x.gif': must end in .png, .svg, .pdf"),
        (["report", "TABLE", "--out", "x.txt"], "x.txt': must end in .html"),
    ],
)
def test_plot_and_report_errors_are_one_line(args: list[str], expected: str, table_path: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    argv = [str(table_path) if a == "TABLE" else str(tmp_path / a) if a.startswith("x.") else a for a in args]
    with pytest.raises(SystemExit) as caught:
        main(argv)
    err = capsys.readouterr().err
    assert caught.value.code == 2 and err.count("\n") == 1 and expected in err, err


def _table_text(table_path: Path, column: str, value: str) -> str:
    """The fixture's CSV with ``column`` set to ``value`` in every row (``value`` prefixed by
    ``first:`` in the first row only)."""
    frame = pd.read_csv(table_path, keep_default_na=False)
    if value.startswith("first:"):
        frame[column] = frame[column].astype(str)
        frame.loc[0, column] = value.removeprefix("first:")
    else:
        frame[column] = value
    return frame.to_csv(index=False)


COMMANDS = {"bubble": ["plot", "bubble", "T", "--out", "x.png"], "sweep": ["plot", "sweep", "T", "--out", "x.png"],
            "report": ["report", "T", "--out", "x.html"]}


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("empty.csv", b"", {"*": "table=FILE: is empty, expected a CSV header and rows"}),
        ("utf16.csv", b"\xff\xfea\x00,\x00b\x00", {"*": "table=FILE: is not UTF-8 text (invalid start byte at byte 0)"}),
        ("ragged.csv", b"a,b\n1,2\n1,2,3,4\n", {"*": "table=FILE: is not a valid CSV table (Error tokenizing data. "
                                                     "C error: Expected 2 fields in line 3, saw 4)"}),
        ("text.parquet", b"hello\n", {"*": "table=FILE: is not a readable Parquet table (Parquet file size is 6 bytes, "
                                           "smaller than the minimum file footer (8 bytes))"}),
        ("bubble.csv", ("bubble_fraction", "first:x"),
         {"*": "FILE: bubble_fraction='x': must be a number (row 1 of 18)"}),
        ("stages.csv", ("num_stages", "first:x"), {"*": "FILE: num_stages='x': must be an integer (row 1 of 18)"}),
        ("ab.csv", b"a,b\n1,2\n", {"bubble": "FILE: column='schedule': is not in the table; columns: a, b",
                                   "sweep": "FILE: column='num_microbatches': is not in the table; columns: a, b",
                                   "report": "FILE: column='point': is not in the table; columns: a, b"}),
        ("nan.csv", ("throughput_samples_per_s", "nan"),
         {"sweep": "table=FILE: has no successful row with a finite throughput_samples_per_s to plot (18 rows)"}),
        ("header.csv", "header", {"bubble": "table=FILE: has no successful row with a finite bubble_fraction to plot "
                                            "(0 rows)"}),
        ("folder", "folder", {"bubble": "table=FILE: must end in .parquet, .pq, .csv",
                              "sweep": "table=FILE: must end in .parquet, .pq, .csv"}),
        ("folder.csv", "folder", {"*": "table=FILE: is a directory, expected a file"}),
    ],
)
def test_a_bad_sweep_table_is_refused_in_one_line_naming_file_and_column(
        name: str, content: Any, expected: dict[str, str], table_path: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / name
    if content == "folder":
        bad.mkdir()
    elif content == "header":
        bad.write_text(table_path.read_text().splitlines()[0] + "\n")
    elif isinstance(content, tuple):
        bad.write_text(_table_text(table_path, *content))
    else:
        bad.write_bytes(content)
    for command, args in COMMANDS.items():
        message = expected.get(command, expected.get("*"))
        if message is None:
            continue
        with pytest.raises(SystemExit) as caught:
            main([str(bad) if a == "T" else str(tmp_path / a) if a.startswith("x.") else a for a in args])
        assert caught.value.code == 2, command
        line = message.replace("table=FILE", f"table={str(bad)!r}").replace("FILE", str(bad))
        assert capsys.readouterr().err == f"pipesim: error: {line}\n", command
        assert not list(tmp_path.glob("x.*")), command


def test_a_report_of_a_table_with_nothing_to_draw_says_so(table_path: Path, tmp_path: Path) -> None:
    for name, column in (("nan.csv", "throughput_samples_per_s"), ("header.csv", None)):
        table = tmp_path / name
        text = _table_text(table_path, column, "nan") if column else table_path.read_text().splitlines()[0] + "\n"
        table.write_text(text)
        main(["report", str(table), "--out", str(tmp_path / "r.html")])
        html = (tmp_path / "r.html").read_text()
        assert figures_in(html) == 0
        assert "No figures: no successful row of the table has a finite bubble fraction, throughput and peak " \
               "memory." in html


def test_plot_where_nested_too_deeply_is_refused(table_path: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    for command, where in (("bubble", "not " * 5000 + "1"), ("sweep", "-" * 5000 + "1")):
        with pytest.raises(SystemExit) as caught:
            main(["plot", command, str(table_path), "--where", where, "--out", str(tmp_path / "x.png")])
        assert caught.value.code == 2
        assert capsys.readouterr().err == \
            f"pipesim: error: where={repr(where)[:77]}...: is nested too deeply (at most 100 levels of operators and lists)\n"


@pytest.mark.parametrize(("content", "rule"), [
    ("{bad", "is not valid JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
    ("[1]", "must hold a JSON object, not list"),
    ('{"partition": "zz"}', "partition='zz': must be a [start, end] layer range per stage (4)"),
    ('{"partition": [[0, 2], [2, 4], [4, 6], [6, "8"]]}',
     "partition=[[0, 2], [2, 4], [4, 6], [6, '8']]: must be a [start, end] layer range per stage (4)"),
    ('{"memory_budget_bytes": true}', "memory_budget_bytes=True: must be a finite number > 0"),
    ('{"memory_budget_bytes": -5}', "memory_budget_bytes=-5: must be a finite number > 0"),
    ('{"memory_budget_bytes": NaN}', "memory_budget_bytes=nan: must be a finite number > 0"),
])
def test_a_damaged_metrics_json_beside_the_trace_is_one_line(
        result: pipesim.Result, content: str, rule: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "trace.json").write_text(result.trace.to_json())
    (tmp_path / "metrics.json").write_text(content)
    with pytest.raises(SystemExit) as caught:
        main(["report", str(tmp_path), "--out", str(tmp_path / "r.html")])
    assert caught.value.code == 2
    saved = str(tmp_path / "metrics.json")
    where = f"metrics={saved!r}: " if rule.startswith(("is not", "must hold")) else f"{saved}: "
    assert capsys.readouterr().err == f"pipesim: error: {where}{rule}\n"
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize(("args", "line"), [
    (["--x", "num_stages", "--y", "num_stages"], "y='num_stages': must differ from x, which names the same column"),
    (["--value", "num_stages"], "value='num_stages': must differ from y, which names the same column"),
    (["--kind", "pareto", "--y", "peak_memory_bytes"],
     "y='peak_memory_bytes': must differ from x, which names the same column"),
])
def test_plot_sweep_refuses_one_column_on_two_axes(args: list[str], line: str, table_path: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["plot", "sweep", str(table_path), "--out", str(tmp_path / "x.png"), *args])
    assert caught.value.code == 2
    assert capsys.readouterr().err == f"pipesim: error: {line}\n"
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize(("args", "line"), [
    (["memory", "TRACE", "--stage", "1", "--peaks"],
     "stage=1: draws one stage over time; --peaks draws every stage's peak, give one of them"),
    (["timeline", ""], "trace='': must name a trace.json or a folder written by simulate --out"),
    (["sweep", "TABLE", "--hue", "num_stages"], "hue='num_stages': applies to --kind pareto only, not heatmap"),
    (["sweep", "TABLE", "--kind", "pareto", "--aggregate", "min"],
     "aggregate='min': applies to --kind heatmap only, not pareto"),
    (["sweep", "TABLE", "--kind", "pareto", "--value", "bubble_fraction"],
     "value='bubble_fraction': applies to --kind heatmap only, not pareto"),
    (["sweep", "TABLE", "--x", ""], "x='': must not be empty"),
    (["bubble", "TABLE", "--where", " "], "where=' ': must not be empty"),
])
def test_plot_refuses_options_its_figure_does_not_read(args: list[str], line: str, result: pipesim.Result,
                                                       table_path: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    trace_path = tmp_path / "trace.json"
    trace_path.write_text(result.trace.to_json())
    argv = [str(trace_path) if a == "TRACE" else str(table_path) if a == "TABLE" else a for a in args]
    with pytest.raises(SystemExit) as caught:
        main(["plot", *argv, "--out", str(tmp_path / "x.png")])
    assert caught.value.code == 2
    assert capsys.readouterr().err == f"pipesim: error: {line}\n"
    assert not (tmp_path / "x.png").exists()
