"""A capacity study a newcomer can read (issue 36): the report of a --model run shows the whole job
(tokens/s, MFU, GPUs and degrees beside one pipeline's samples/s), ``pipesim report`` reads every
folder pipesim writes (schedules side by side, a search), and the figures say what they show."""

from __future__ import annotations

import html.parser
import json
from pathlib import Path
from typing import Any

import matplotlib
import pandas as pd
import pytest

matplotlib.use("Agg")

import pipesim  # noqa: E402
from pipesim import plots  # noqa: E402
from pipesim.cli import main  # noqa: E402
from cli_runner import in_process  # noqa: E402

# Llama-3 8B on 32 H100s: TP 2, a pipeline of 4, DP 4. Its sequence is 8,192 tokens.
MODEL_RUN = ("simulate", "--model", "llama3-8b", "--device", "h100", "--tp", "2", "--dp", "4", "--stages", "4",
             "--microbatches", "8")
SEARCH = ("search", "--model", "llama3-8b", "--device", "h100", "--gpus", "8", "--global-batch", "16")


class _Page(html.parser.HTMLParser):
    """Headings, figure captions and table rows (as lists of cell texts) of a report."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.headings: list[str] = []
        self.captions: list[str] = []
        self.rows: list[list[str]] = []
        self._tag = ""
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._tag = tag
        if tag == "tr":
            self.rows.append([])

    def handle_endtag(self, tag: str) -> None:
        self._tag = ""

    def handle_data(self, data: str) -> None:
        if self._tag == "h2" and data.strip():
            self.headings.append(data.strip())
        elif self._tag == "figcaption":
            self.captions.append(data)
        elif self._tag in ("td", "th") and self.rows:
            self.rows[-1].append(data)

    def value(self, label: str) -> str:
        """The second cell of the two-cell row whose first cell is ``label``."""
        return next(row[1] for row in self.rows if len(row) == 2 and row[0] == label)


def report(source: Path, out: Path, *extra: str) -> _Page:
    done = in_process("report", str(source), "--out", str(out), *extra)
    assert done.returncode == 0, done.stderr
    return _Page(out.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def model_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("model") / "run"
    done = in_process(*MODEL_RUN, "--schedule", "1f1b", "--out", str(folder))
    assert done.returncode == 0, done.stderr
    return folder


@pytest.fixture(scope="module")
def search_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("search") / "found"
    done = in_process(*SEARCH, "--out", str(folder))
    assert done.returncode == 0, done.stderr
    return folder


def test_a_model_runs_report_shows_the_whole_job_beside_one_pipeline(model_run: Path, tmp_path: Path) -> None:
    saved = json.loads((model_run / "metrics.json").read_text(encoding="utf-8"))
    page = report(model_run, tmp_path / "r.html")
    per_pipeline = saved["throughput_samples_per_s"]
    assert page.value("GPUs and parallel degrees") == "32 GPUs: TP 2 x PP 4 x DP 4"  # 2 x 4 x 4 = 32
    assert page.value("throughput per pipeline") == f"{per_pipeline:.2f} samples/s"
    # DP 4 pipelines of 8,192-token sequences: 4 x samples/s and 4 x 8,192 x samples/s.
    assert page.value("throughput, all DP pipelines") == f"{4 * per_pipeline:.2f} samples/s"
    assert page.value("tokens/s, all GPUs") == f"{4 * 8192 * per_pipeline:,.0f}"
    assert page.value("MFU") == f"{saved['mfu']:.1%}"
    # The memory verdict against the device's budget (the H100's 81,559 MiB), as simulate printed it.
    verdict = "fits" if saved["fits"] else "does NOT fit"
    assert page.value("memory budget").startswith(f"{verdict} in 81,559 MiB (h100's memory) per device")
    assert "throughput" not in [row[0] for row in page.rows if row]  # no unlabelled samples/s


def test_the_comparison_table_shows_the_jobs_tokens_and_mfu(tmp_path: Path) -> None:
    folder = tmp_path / "compared"
    done = in_process(*MODEL_RUN, "--schedule", "1f1b,gpipe", "--out", str(folder))
    assert done.returncode == 0, done.stderr
    runs = json.loads((folder / "comparison.json").read_text(encoding="utf-8"))["runs"]
    lines = done.stdout.splitlines()
    assert "tokens/s all GPUs" in lines[0] and "MFU" in lines[0] and "samples/s per pipeline" in lines[0]
    for run in runs:
        line = next(line for line in lines if line.split()[:1] == [run["schedule"]])
        assert f"{run['tokens_per_s']:,.0f}" in line and f"{run['mfu']:.1%}" in line
    # pipesim report reads the folder: its inputs, the schedules side by side, each verdict, the timelines.
    page = report(folder, tmp_path / "compared.html")
    assert page.headings == ["Run", "Schedules side by side", "Memory", "Figures"]
    assert page.value("schedule") == "1f1b, gpipe"
    for run in runs:
        row = next(row for row in page.rows if row[:1] == [run["schedule"]] and len(row) > 2)
        assert f"{run['tokens_per_s']:,.0f}" in row and f"{run['mfu']:.1%}" in row
        verdict = "fits" if run["fits"] else "does NOT fit"
        assert page.value(run["schedule"]).startswith(f"{verdict} in 81,559 MiB (h100's memory)")
    assert page.captions == ["Timelines of the schedules on one time axis; grey is idle (the bubbles)"]


def test_a_search_folders_report_counts_what_the_table_holds(search_folder: Path, tmp_path: Path) -> None:
    table = pd.read_csv(search_folder / "candidates.csv")
    simulated = table[table["status"] == "simulated"]
    for source in (search_folder, search_folder / "candidates.csv"):
        page = report(source, tmp_path / "search.html", "--memory", "80GB")
        assert page.value("candidates") == str(len(table))
        assert page.value("simulated") == str(len(simulated))
        assert page.value("fit") == str(int(simulated["fits"].sum()))
        assert page.value("memory budget per GPU") == "80.00 GB"
        assert page.headings[:2] == ["Summary", f"Fastest that fit (10 of {int(simulated['fits'].sum())})"]
        fastest = simulated[simulated["fits"]].sort_values("tokens_per_s", ascending=False, kind="stable").iloc[0]
        first = page.rows[page.rows.index(next(row for row in page.rows if row[:2] == ["TP", "PP"])) + 1]
        assert first[:3] == [str(fastest["tp"]), str(fastest["pp"]), str(fastest["dp"])]
        assert f"{fastest['tokens_per_s']:,.0f}" in first
        assert len(page.captions) == 1


def test_the_search_pareto_draws_the_budget_and_rings_what_does_not_fit(search_folder: Path) -> None:
    table = pd.read_csv(search_folder / "candidates.csv")
    simulated = table[table["status"] == "simulated"]
    ax = plots.pareto(simulated, x="peak_memory_bytes", y="tokens_per_s", budget=80e9, fits="fits")
    budget = next(line for line in ax.get_lines() if line.get_gid() == "budget")
    assert list(budget.get_xdata()) == [80.0, 80.0] and budget.get_label() == "memory budget 80 GB"
    over = sum(len(c.get_offsets()) for c in ax.collections if str(c.get_gid()).startswith("over:"))
    filled = sum(len(c.get_offsets()) for c in ax.collections if str(c.get_gid()).startswith("points:"))
    assert (over, filled) == (int((~simulated["fits"]).sum()), int(simulated["fits"].sum()))
    assert over > 0 and filled > 0


def test_report_labels_are_words(model_run: Path, tmp_path: Path) -> None:
    page = report(model_run, tmp_path / "r.html")
    labels = [row[0] for row in page.rows if len(row) == 2]
    assert "link bandwidth" in labels and "stages per rank V" in labels
    assert [label for label in labels if "_" in label] == []


def test_a_staleness_chart_only_where_there_is_staleness(tmp_path: Path) -> None:
    for schedule, drawn in (("1f1b", False), ("gpipe", False), ("pipedream", True), ("2bw", True)):
        folder = tmp_path / schedule
        main(["simulate", "--uniform", "layers=4,forward_ms=1,backward_ms=2,param_bytes=1000", "--stages", "4",
              "--microbatches", "4", "--minibatches", "3", "--schedule", schedule, "--out", str(folder)])
        page = report(folder, tmp_path / f"{schedule}.html")
        has_chart = any(caption.startswith("Weight versions") for caption in page.captions)
        assert has_chart is drawn, schedule
        assert page.value("weight staleness").startswith("none") is not drawn, schedule


def _overlaps(a: Any, b: Any) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_legends_sit_beside_the_data() -> None:
    profile = pipesim.uniform_profile(num_layers=8, forward_s=1e-3, backward_s=2e-3, activation_bytes=2e6,
                                      param_bytes=1e6)
    result = pipesim.simulate(profile, pipesim.Topology.uniform(num_devices=4), schedule="2bw", num_stages=4,
                              num_microbatches=4, num_minibatches=3)
    rows = pd.DataFrame([{"schedule": s, "num_stages": 4, "num_microbatches": m, "bubble_fraction": 3 / (m + 3),
                          "throughput_samples_per_s": 1e3 * m / (m + 3), "peak_memory_bytes": 1e9 * m}
                         for s in ("gpipe", "1f1b") for m in (1, 2, 4, 8)])
    figures = [plots.memory(result.trace, stage=0), plots.memory_breakdown(result.trace),
               plots.staleness(result.trace), plots.bubble(rows, num_stages=4), plots.pareto(rows)]
    for ax in figures:
        ax.figure.canvas.draw()
        legend = ax.get_legend()
        assert legend is not None
        renderer = ax.figure.canvas.get_renderer()
        assert not _overlaps(legend.get_window_extent(renderer), ax.get_window_extent(renderer)), ax.get_title()


def test_a_bad_saved_value_is_one_line_and_exit_2(model_run: Path, tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "run"
    shutil.copytree(model_run, folder)
    saved = json.loads((folder / "metrics.json").read_text(encoding="utf-8"))
    (folder / "metrics.json").write_text(json.dumps(saved | {"tokens_per_s": "many"}), encoding="utf-8")
    done = in_process("report", str(folder), "--out", str(tmp_path / "r.html"))
    assert (done.returncode, done.stderr) == (
        2, f"pipesim: error: {folder}/metrics.json: tokens_per_s='many': must be a finite number >= 0\n")
    compared = tmp_path / "compared"
    compared.mkdir()
    (compared / "comparison.json").write_text(json.dumps({"runs": [{"schedule": "../run"}]}), encoding="utf-8")
    done = in_process("report", str(compared), "--out", str(tmp_path / "c.html"))
    assert (done.returncode, done.stderr) == (
        2, f"pipesim: error: {compared}/comparison.json: runs[].schedule='../run': must name a schedule's folder "
           "beside comparison.json\n")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["compared", "run"]
