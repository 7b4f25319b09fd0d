"""Outputs a person can trust (issue 20), through the real CLI: every file records its inputs,
bad --out paths are one line and exit 2, JSON is strict, and Perfetto traces carry message flows."""

from __future__ import annotations

import hashlib
import html.parser
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cli_runner import ROOT, VGG, in_process, pipesim

RUN_KEYS = {"command", "pipesim_version", "profile", "bandwidth_bytes_per_s", "latency_s", "schedule", "num_stages",
            "num_microbatches", "num_minibatches", "stages_per_rank", "engine"}
SMALL = ("--uniform", "layers=8,forward_ms=1,backward_ms=2,activation_bytes=1000,param_bytes=4000",
         "--microbatches", "4", "--bandwidth", "10GB/s", "--latency", "5us")


def strict_load(path: Path) -> Any:
    """json.loads that rejects NaN and Infinity, as strict parsers (browsers, jq, Go) do."""
    def refuse(constant: str) -> Any:
        raise ValueError(f"{path.name}: {constant} is not JSON")

    return json.loads(path.read_text(encoding="utf-8"), parse_constant=refuse)


class _Text(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.title = ""
        self.headings: list[str] = []
        self.cells: list[str] = []
        self._tag = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._tag = tag

    def handle_data(self, data: str) -> None:
        if self._tag == "title":
            self.title += data
        elif self._tag == "h2" and data.strip():
            self.headings.append(data.strip())
        elif self._tag == "td":
            self.cells.append(data)


def test_every_simulate_output_records_its_inputs(tmp_path: Path) -> None:
    out = tmp_path / "report"
    args = ("simulate", "--profile", VGG, "--stages", "4", "--microbatches", "8", "--schedule", "1f1b",
            "--bandwidth", "25Gbit/s", "--latency", "5us", "--out", str(out))
    done = pipesim(*args)
    assert done.returncode == 0, done.stderr
    digest = hashlib.sha256(Path(VGG).read_bytes()).hexdigest()
    run = strict_load(out / "metrics.json")["run"]
    assert RUN_KEYS <= set(run)
    assert run["profile"] == {"name": "vgg16.json", "sha256": digest}
    assert run["command"].startswith("pipesim simulate --profile") and run["command"].endswith(f"--out {out}")
    assert (run["schedule"], run["num_stages"], run["num_microbatches"], run["num_minibatches"],
            run["stages_per_rank"], run["engine"]) == ("1f1b", 4, 8, 1, 1, "analytic")
    assert run["bandwidth_bytes_per_s"] == 25e9 / 8 and run["latency_s"] == pytest.approx(5e-6)
    assert strict_load(out / "trace.json")["run"] == run
    perfetto = strict_load(out / "trace.perfetto.json")
    assert perfetto["metadata"]["run"] == run
    assert perfetto["otherData"]["run.profile"] == json.dumps(run["profile"], sort_keys=True)

    report = in_process("report", str(out), "--out", str(out / "report.html"))
    assert report.returncode == 0, report.stderr
    page = _Text()
    page.feed((out / "report.html").read_text(encoding="utf-8"))
    assert "vgg16.json" in page.title and "3.125 GB/s" in page.title
    assert page.headings[0] == "Run"
    assert digest in " ".join(page.cells) and run["command"] in page.cells


def test_two_saved_runs_are_told_apart_by_their_records(tmp_path: Path) -> None:
    records = []
    for schedule, bandwidth in (("1f1b", "10GB/s"), ("gpipe", "1GB/s")):
        done = in_process("simulate", *SMALL[:-4], "--stages", "4", "--schedule", schedule, "--bandwidth", bandwidth,
                       "--json")
        assert done.returncode == 0, done.stderr
        records.append(json.loads(done.stdout)["run"])
    assert records[0]["profile"] == records[1]["profile"]
    assert records[0]["profile"]["name"].startswith("uniform:layers=8")
    assert (records[0]["schedule"], records[1]["schedule"]) == ("1f1b", "gpipe")
    assert (records[0]["bandwidth_bytes_per_s"], records[1]["bandwidth_bytes_per_s"]) == (1e10, 1e9)
    assert records[1]["latency_s"] == 0.0


@pytest.mark.parametrize(
    ("make", "out", "rule"),
    [
        (lambda d: (d / "afile").write_text("keep"), "afile", "out='{d}/afile': must be a folder, but it is a file"),
        (lambda d: (d / "afile").write_text("keep"), "afile/sub",
         "out='{d}/afile/sub': cannot be written: {d}/afile is a file, not a folder"),
        (lambda d: None, "result.json", "out='{d}/result.json': must be a folder, not a file name ending in .json"),
    ],
)
def test_bad_out_folders_are_one_line_exit_2(tmp_path: Path, make: Any, out: str, rule: str) -> None:
    make(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    done = in_process("simulate", *SMALL, "--stages", "2", "--schedule", "1f1b", "--out", str(tmp_path / out))
    assert done.returncode == 2
    assert done.stderr == f"pipesim: error: {rule.format(d=tmp_path)}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    if (tmp_path / "afile").exists():
        assert (tmp_path / "afile").read_text() == "keep"


def test_an_unwritable_out_is_one_line_exit_2(tmp_path: Path) -> None:
    done = in_process("simulate", *SMALL, "--stages", "2", "--schedule", "1f1b", "--out", "/proc/pipesim-out")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("pipesim: error: out='/proc/pipesim-out': cannot be created or written")
    (tmp_path / "afile").write_text("keep")
    for command in (("plan", "--profile", VGG, "--devices", "2", "--bandwidth", "10GB/s", "--out",
                     str(tmp_path / "afile")),
                    ("report", str(ROOT / "no-such-folder"), "--out", str(tmp_path / "afile" / "r.html"))):
        done = in_process(*command)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith("pipesim: error: out=")
    assert (tmp_path / "afile").read_text() == "keep"


def test_plan_files_are_strict_json_and_read_back(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    done = pipesim("plan", "--profile", VGG, "--devices", "4", "--bandwidth", "10GB/s", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "compute ms (1 replica)" in done.stdout and "compute ms/replica" not in done.stdout  # the table's header
    plan, topology = strict_load(out / "plan.json"), strict_load(out / "topology.json")
    assert plan["run"]["profile"]["name"] == "vgg16.json" and plan["run"]["planner"] == "pipedream"
    assert all("memory_bytes" not in device for device in topology["devices"])  # unlimited: left out
    again = pipesim("simulate", "--plan", str(out / "plan.json"), "--profile", VGG, "--topology",
                    str(out / "topology.json"), "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["run"]["topology"]["name"] == "topology.json"
    as_json = pipesim("plan", "--profile", VGG, "--devices", "4", "--bandwidth", "10GB/s", "--json")
    assert as_json.returncode == 0 and "Infinity" not in as_json.stdout and "NaN" not in as_json.stdout


def test_perfetto_flows_follow_each_message_to_its_receiver(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = in_process("simulate", *SMALL, "--stages", "3", "--schedule", "1f1b", "--out", str(out))
    assert done.returncode == 0, done.stderr
    events = strict_load(out / "trace.perfetto.json")["traceEvents"]
    slices = [e for e in events if e["ph"] == "X" and e["tid"] == 1]
    flows: dict[int, dict[str, Any]] = {}
    for event in events:
        if event["ph"] in "sf":
            flows.setdefault(event["id"], {})[event["ph"]] = event
    sends = [e for e in events if e["ph"] == "X" and e.get("cat") == "send"]
    assert len(flows) == len(sends) == 2 * 2 * 4  # 2 boundaries, F and B, 4 microbatches

    def enclosing(event: dict[str, Any]) -> str:
        found = [s["name"] for s in slices if s["pid"] == event["pid"] and s["ts"] <= event["ts"] <= s["ts"] + s["dur"]]
        assert len(found) == 1, (event, found)
        return str(found[0])

    pairs = {(enclosing(f["s"]), enclosing(f["f"])) for f in flows.values()}
    assert ("0F2", "1F2") in pairs and ("1F3", "2F3") in pairs and ("2B0", "1B0") in pairs and ("1B1", "0B1") in pairs
    for flow in flows.values():
        sender, receiver = flow["s"]["name"].split(" -> ")
        assert (enclosing(flow["s"]), enclosing(flow["f"])) == (sender, receiver)
        assert flow["f"]["bp"] == "e" and flow["f"]["ts"] > flow["s"]["ts"]


def test_check_reads_standard_input() -> None:
    csv = pipesim("schedule", "--schedule", "1f1b", "--stages", "2", "--microbatches", "2", "--format", "csv")
    assert csv.returncode == 0, csv.stderr
    done = subprocess.run([sys.executable, "-m", "pipesim", "check", "-"], input=csv.stdout, capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("<stdin>: valid (2 ranks, 2 stages, 2 microbatches")
    bad = subprocess.run([sys.executable, "-m", "pipesim", "check", "-", "--json"], input="0F0,0B0\n1B0,1F0\n",
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert bad.returncode == 1 and json.loads(bad.stdout)["violations"][0]["op"] == "1B0"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--schedule", "1fb1"], "schedule='1fb1': unknown schedule; did you mean 1f1b? known: gpipe, 1f1b,"),
        (["--schedule", "zb-h3"], "schedule='zb-h3': unknown schedule; did you mean zb-h2 or zb-h1? known:"),
        (["--schedule", "1f1b", "--partition", "0:3,4:41"],
         "partition='0:3,4:41': must be contiguous non-empty ranges from layer 0; stage 1 is 4:41 but should start at 3"),
        (["--schedule", "1f1b", "--partition", "0:3,3:9"],
         "partition='0:3,3:9': must end at the profile's last layer (41), ends at 9"),
        (["--schedule", "1f1b", "--partition", "0:41"], "partition='0:41': must give one range per stage (1 ranges, 2 stages)"),
    ],
)
def test_schedule_and_partition_mistakes_are_named_briefly(args: list[str], expected: str) -> None:
    done = in_process("simulate", "--profile", VGG, "--stages", "2", "--microbatches", "2", *args)
    assert done.returncode == 2
    assert done.stderr.startswith(f"pipesim: error: {expected}") and done.stderr.count("\n") == 1, done.stderr
    assert "{" not in done.stderr  # not the whole model dict


def test_top_level_help_shows_every_schedule_and_whole_summaries() -> None:
    from pipesim.schedule.registry import SCHEDULES

    done = pipesim("--help")
    assert done.returncode == 0
    words = done.stdout.replace(",", " ").replace(".", " ").split()
    assert all(name in words for name in SCHEDULES)
    assert "..." not in done.stdout.split("Commands:")[1]
    assert "Simulate SCHEDULE on a profile cut into P stages and report time, bubbles, memory and staleness." in \
        " ".join(done.stdout.split())


def test_sweep_progress_reads_as_elapsed_and_remaining(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("profile: {uniform: {layers: 8, forward_ms: 1, backward_ms: 2}}\nstages: [2]\n"
                    "microbatches: [4, 8]\nschedule: [gpipe]\n")
    done = pipesim("sweep", str(spec), "--out", str(tmp_path / "r.parquet"), "--progress", "--workers", "1")
    assert done.returncode == 0, done.stderr
    assert re.search(r"2/2 points .* elapsed \d+:\d\d:\d\d · \d+:\d\d:\d\d left", done.stderr), done.stderr


def test_simulate_warns_when_the_profile_has_no_memory_figures() -> None:
    bare = in_process("simulate", "--uniform", "layers=4,forward_ms=1,backward_ms=2", "--stages", "2",
                   "--microbatches", "2", "--schedule", "1f1b", "--json")
    assert bare.returncode == 0
    assert json.loads(bare.stdout)["peak_memory_bytes"] == 0
    assert bare.stderr == ("pipesim: warning: profile 'uniform' has no memory figures (activation, stash and "
                           "parameter bytes are all 0), so peak memory reads 0 B\n")
    sized = in_process("simulate", *SMALL, "--stages", "2", "--schedule", "1f1b", "--json")
    assert sized.returncode == 0 and sized.stderr == ""


def test_file_outputs_are_checked_before_any_work(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("keep")
    (tmp_path / "folder.png").mkdir()
    spec = tmp_path / "spec.yaml"
    spec.write_text("profile: {uniform: {layers: 8, forward_ms: 1, backward_ms: 2}}\nstages: [2]\n"
                    "microbatches: [4]\nschedule: [gpipe]\n")
    cases = [
        (("plot", "timeline", "no-such-trace", "--out", str(tmp_path / "afile" / "t.png")),
         f"out='{tmp_path}/afile/t.png': cannot be written: {tmp_path}/afile is a file, not a folder"),
        (("plot", "timeline", "no-such-trace", "--out", str(tmp_path / "folder.png")),
         f"out='{tmp_path}/folder.png': is a folder, expected a file name"),
        (("sweep", str(spec), "--out", str(tmp_path / "afile" / "r.parquet")),
         f"out='{tmp_path}/afile/r.parquet': cannot be written: {tmp_path}/afile is a file, not a folder"),
        (("sweep", str(spec), "--out", str(tmp_path / "r.json")), f"out='{tmp_path}/r.json': must end in .parquet"),
    ]
    for args, message in cases:
        done = in_process(*args)
        assert done.returncode == 2 and done.stderr.startswith(f"pipesim: error: {message}"), done.stderr
        assert done.stderr.count("\n") == 1
    assert (tmp_path / "afile").read_text() == "keep" and not (tmp_path / "r.json.parts").exists()


def test_a_run_that_fails_leaves_no_out_folder(tmp_path: Path) -> None:
    out = tmp_path / "new" / "report"
    done = in_process("simulate", *SMALL, "--stages", "50", "--schedule", "1f1b", "--out", str(out))
    assert done.returncode == 2 and "num_stages=50" in done.stderr
    assert list(tmp_path.iterdir()) == []
