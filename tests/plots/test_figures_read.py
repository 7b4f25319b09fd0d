"""Figures that read at any size (issue 20 items 3 and 5): outputs made through the CLI, then the
figures drawn from them checked through matplotlib's artists."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from pipesim import plots  # noqa: E402
from pipesim.cli import main  # noqa: E402
from pipesim.cli.plot import load_trace  # noqa: E402
from pipesim.plots.style import SCHEDULE_COLORS  # noqa: E402
from pipesim.plots.timeline import MAX_LABELS  # noqa: E402
from pipesim.sweep import PointRunner, Resolved, parse_spec  # noqa: E402
from pipesim.sweep.points import COLUMNS  # noqa: E402
from pipesim.sweep.store import read_table, rows_frame, write_table  # noqa: E402
from cli_runner import pipesim  # noqa: E402

UNIFORM = "layers=32,forward_ms=1,backward_ms=2,activation_bytes=1e6,param_bytes=1e6"


@pytest.fixture(autouse=True)
def close_figures() -> Any:
    yield
    plt.close("all")


def simulated(tmp_path: Path, *args: str) -> Path:
    """``pipesim simulate ... --out`` through the CLI's entry point, in this process (no interpreter start-up)."""
    out = tmp_path / "run"
    main(["simulate", "--uniform", UNIFORM, "--bandwidth", "25GB/s", *args, "--out", str(out)])
    assert (out / "trace.json").is_file()
    return out


def labels_by_device(ax: Any) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for text in ax.texts:
        found.setdefault(round(text.get_position()[1]), []).append(text.get_text())
    return found


def faces(ax: Any, gid: str) -> list[str]:
    collection = next(c for c in ax.collections if c.get_gid() == gid)
    return [to_hex(color) for color in collection.get_facecolors()]


def test_several_stages_per_rank_label_whole_ops_and_darken_later_stages(tmp_path: Path) -> None:
    out = simulated(tmp_path, "--ranks", "4", "--stages-per-rank", "2", "--microbatches", "4", "--schedule",
                    "interleaved-1f1b")
    ax = plots.timeline(load_trace(str(out)))
    labels = labels_by_device(ax)
    assert sorted(labels[0]) == sorted(f"{stage}{kind}{mb}" for stage in (0, 4) for kind in "FB" for mb in range(4))
    assert "7F3" in labels[3] and "3B0" in labels[3]
    forward = faces(ax, "compute:F")
    assert len(set(forward)) == 2  # the device's first stages full, its later stages darker
    assert any("darker: device's later stages" == text.get_text() for text in ax.get_legend().get_texts())


def test_p8_m32_labels_every_row_and_one_stage_per_rank_keeps_microbatch_numbers(tmp_path: Path) -> None:
    out = simulated(tmp_path, "--stages", "8", "--microbatches", "32", "--schedule", "1f1b")
    ax = plots.timeline(load_trace(str(out)))
    labels = labels_by_device(ax)
    assert sorted(labels) == list(range(8))
    for device in range(8):  # every B (2 ms) is wide enough for its number; the 1 ms F only where they fit
        assert set(labels[device]) == {str(mb) for mb in range(32)} and 32 <= len(labels[device]) <= 64


def test_too_many_labels_thin_every_row_alike_not_whole_rows(tmp_path: Path) -> None:
    out = simulated(tmp_path, "--stages", "8", "--microbatches", "256", "--schedule", "1f1b")
    ax = plots.timeline(load_trace(str(out)), label_ops=True)
    labels = labels_by_device(ax)
    assert sum(map(len, labels.values())) <= MAX_LABELS
    assert sorted(labels) == list(range(8))
    counts = [len(labels[device]) for device in range(8)]
    assert min(counts) >= 256 and max(counts) - min(counts) <= 1


def test_the_steady_state_window_is_marked(tmp_path: Path) -> None:
    out = simulated(tmp_path, "--stages", "4", "--microbatches", "8", "--schedule", "2bw", "--minibatches", "4")
    metrics = json.loads((out / "metrics.json").read_text())
    ax = plots.timeline(load_trace(str(out)))
    lines = [line for line in ax.lines if line.get_gid() == "window"]
    assert [line.get_xdata()[0] for line in lines] == pytest.approx(
        [metrics["window_start_s"] * 1e3, metrics["window_end_s"] * 1e3])  # the axis is in ms
    assert any(text.get_text() == "iteration time window (minibatches 1..2)" for text in ax.get_legend().get_texts())
    flush = plots.timeline(load_trace(str(simulated(tmp_path / "f", "--stages", "4", "--microbatches", "8",
                                                    "--schedule", "1f1b"))))
    assert not [line for line in flush.lines if line.get_gid() == "window"]  # K=1: the whole run is the window


@pytest.fixture(scope="module")
def sweep_table(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A finished sweep table, its rows run in this process and written by the sweep's own store
    (a Dask cluster would add ~10 s; tests/sweep/test_sweep_dask.py covers that path)."""
    resolved = Resolved(parse_spec({
        "profile": {"uniform": {"layers": 16, "forward_ms": 1, "backward_ms": 2, "activation_bytes": 1e6,
                                "param_bytes": 1e6}},
        "bandwidth": ["10GB/s", "100MB/s"], "stages": [2, 4], "microbatches": [2, 4, 8],
        "schedule": ["gpipe", "zb-h1", "2bw"],
    }))
    path = tmp_path_factory.mktemp("sweep") / "table.parquet"
    write_table(rows_frame(PointRunner(resolved).run_batch(resolved.points()), COLUMNS), path,
                digest=resolved.digest())
    return read_table(path)


def test_a_schedule_has_one_color_in_every_figure(sweep_table: Any) -> None:
    bubble = plots.bubble(sweep_table, num_stages=2)
    pareto = plots.pareto(sweep_table)
    only_zb = plots.bubble(sweep_table[sweep_table["schedule"] == "zb-h1"], num_stages=2)
    line_color = {line.get_gid(): to_hex(line.get_color()) for line in bubble.lines + only_zb.lines}
    point_color = {c.get_gid(): to_hex(c.get_facecolors()[0]) for c in pareto.collections
                   if (c.get_gid() or "").startswith("points:")}
    for schedule in ("gpipe", "zb-h1", "2bw"):
        assert line_color[f"bubble:{schedule}"] == point_color[f"points:{schedule}"] == \
            SCHEDULE_COLORS[schedule].lower()


def test_sweep_figures_say_what_they_aggregate_and_format_cells_alike(sweep_table: Any) -> None:
    ax = plots.heatmap(sweep_table[sweep_table["schedule"] == "gpipe"], value="iteration_time_s")
    assert ax.get_title(loc="left").endswith("(max over bandwidth (B/s))")
    cells = [text.get_text() for text in ax.texts]
    assert len(cells) == 6 and not any("e+" in cell or "e-" in cell for cell in cells)
    assert len({len(cell.split(".")[1]) if "." in cell else 0 for cell in cells}) == 1  # one number of decimals
    one_bandwidth = sweep_table[sweep_table["bandwidth_bytes_per_s"] == 1e10]
    assert "over" not in plots.heatmap(one_bandwidth[one_bandwidth["schedule"] == "gpipe"]).get_title(loc="left")
    # K differs by schedule (1 for gpipe, 4 for 2bw) but never within one: the bubble plot does not average it.
    assert plots.bubble(sweep_table, num_stages=4).get_title(loc="left") == \
        "bubble fraction against m at p=4 (mean over bandwidth (B/s))"


def test_sweep_report_tables_have_units_and_null_errors(sweep_table: Any, tmp_path: Path) -> None:
    failed = sweep_table[sweep_table["error"].notna()]  # 2bw needs m >= p: p=4, m=2 at both bandwidths
    assert len(failed) == 2 and set(failed["schedule"]) == {"2bw"} and (failed["error"] != "").all()
    table = tmp_path / "t.parquet"
    sweep_table.to_parquet(table)
    done = pipesim("report", str(table), "--out", str(tmp_path / "r.html"))
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "r.html").read_text()
    best = page[page.index("Best throughput"):page.index("Pareto front")]
    assert "<th>bandwidth</th>" in best and "bandwidth_bytes_per_s" not in best
    assert re.search(r"<td>(10|0\.1) GB/s</td>", best) and re.search(r"<td>[\d,.]+ samples/s</td>", best)
    assert '<div class="wide">' in best
    assert not np.any(["e+" in cell for cell in re.findall(r"<td>([^<]*)</td>", best)])
