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
        assert set(by_kind[0]["args"]) == {"weights", "gradients", "optimizer", "activations"}
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
    assert figures_in(html) == 1 + 4 + 1 + 1  # timeline, memory of each stage, peak breakdown, staleness
    assert html.count("<table>") == 4 and "iteration time" in html and "<td>25:41</td>" in html  # run, summary, devices, stages
    svg = tmp_path / "svg.html"
    main(["report", str(folder / "trace.json"), "--out", str(svg), "--figures", "svg"])
    text = svg.read_text()
    assert "data:image/png" not in text and text.count("<svg") == 7
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
