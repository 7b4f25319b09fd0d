"""Every plot rendered and checked for content: bars per op, stacked levels, bars per stage, curves."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import pipesim  # noqa: E402
from pipesim import plots  # noqa: E402
from pipesim.engine.trace import KINDS, Trace  # noqa: E402
from pipesim.errors import ConfigError  # noqa: E402
from pipesim.metrics import compute_metrics, memory_over_time  # noqa: E402
from pipesim.plots.timeline import idle_gaps  # noqa: E402
from pipesim.sweep import PointRunner, Resolved, parse_spec  # noqa: E402
from pipesim.sweep.analysis import closed_form_bubble, pareto_front  # noqa: E402


@pytest.fixture(autouse=True)
def no_show(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a plot called show()")

    monkeypatch.setattr(plt, "show", refuse)
    yield
    plt.close("all")


def run(schedule: str, p: int = 4, m: int = 6, k: int | None = 3) -> pipesim.Result:
    profile = pipesim.uniform_profile(num_layers=8, forward_s=1e-3, backward_s=2e-3, activation_bytes=2e6,
                                      param_bytes=1e6)
    topology = pipesim.Topology.uniform(num_devices=p, bandwidth="10GB/s", latency="5us")
    return pipesim.simulate(profile, topology, schedule=schedule, num_stages=p, num_microbatches=m,
                            num_minibatches=k)


@pytest.fixture(scope="module")
def trace() -> Trace:
    return run("2bw").trace


@pytest.fixture(scope="module")
def table() -> Any:
    resolved = Resolved(parse_spec({
        "profile": {"uniform": {"layers": 8, "forward_ms": 1, "backward_ms": 2, "param_bytes": 1e6,
                                "activation_bytes": 1e5}},
        "stages": [2, 4], "microbatches": [1, 2, 4, 8, 16], "minibatches": [1], "schedule": ["gpipe", "1f1b", "2bw"],
    }))
    return pd.DataFrame(PointRunner(resolved).run_batch(resolved.points()))


def collection(ax: Any, gid: str) -> Any:
    found = [c for c in ax.collections if c.get_gid() == gid]
    assert len(found) == 1, (gid, [c.get_gid() for c in ax.collections])
    return found[0]


def test_timeline_draws_one_bar_per_op(trace: Trace) -> None:
    ax = plots.timeline(trace, label_ops=True)
    s = trace.spans
    compute = s["stream"] == 0
    for code, kind in enumerate(KINDS):
        count = int((compute & (s["kind"] == code)).sum())
        gids = [c.get_gid() for c in ax.collections]
        if count:
            bars = collection(ax, f"compute:{kind}").get_paths()
            assert len(bars) == count, kind
        else:
            assert f"compute:{kind}" not in gids
    sends = len(collection(ax, "send:activations").get_paths()) + len(collection(ax, "send:gradients").get_paths())
    assert sends == int((s["stream"] == 1).sum()) > 0
    labelled = sorted(int(t.get_text()) for t in ax.texts)
    not_update = compute & (s["kind"] != KINDS.index("U"))
    assert labelled == sorted(s["microbatch"][not_update].tolist())
    assert ax.get_xlabel() == "time (ms)" and ax.get_ylabel() == "device"
    assert len(ax.get_yticklabels()) == trace.info.num_ranks
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[:3] == ["F", "B", "U"] and "idle (bubble)" in legend
    assert "2bw" in ax.get_title(loc="left")


def test_timeline_idle_shading_is_the_bubble(trace: Trace) -> None:
    ax = plots.timeline(trace, label_ops=False)
    assert not ax.texts
    idle = collection(ax, "idle").get_paths()
    assert len(idle) == sum(len(idle_gaps(trace, d)) for d in range(trace.info.num_ranks))
    s = trace.spans
    for device in range(trace.info.num_ranks):
        busy = s["end_s"][(s["stream"] == 0) & (s["device"] == device)] - s["start_s"][(s["stream"] == 0) &
                                                                                    (s["device"] == device)]
        gaps = sum(end - start for start, end in idle_gaps(trace, device))
        assert gaps + busy.sum() == pytest.approx(trace.makespan_s)


def test_memory_over_time_stacks_the_kinds_to_the_stage_level(trace: Trace) -> None:
    metrics = compute_metrics(trace)
    for stage in (0, 3):
        ax = plots.memory(trace, stage=stage)
        tops = collection(ax, "memory:activations").get_paths()[0].vertices[:, 1]
        assert tops.max() * 1e6 == pytest.approx(metrics.stages[stage].peak_memory_bytes)
        levels = memory_over_time(trace)
        assert ax.get_ylabel() == "memory (MB)" and ax.get_xlabel().startswith("time (")
        assert len(levels[levels["stage"] == stage]) > 2
        assert f"stage {stage}" in ax.get_title(loc="left")
    peaks = [s.peak_memory_bytes for s in metrics.stages]
    assert f"stage {peaks.index(max(peaks))} " in plots.memory(trace).get_title(loc="left")
    with pytest.raises(ValueError, match="stage must be in 0..3"):
        plots.memory(trace, stage=4)


def test_memory_breakdown_has_a_stacked_bar_per_stage(trace: Trace) -> None:
    metrics = compute_metrics(trace)
    ax = plots.memory_breakdown(metrics)
    assert [c.get_label() for c in ax.containers] == \
        ["weights", "gradients", "optimizer", "activations", "working"]
    totals = np.sum([[bar.get_height() for bar in container] for container in ax.containers], axis=0)
    assert totals * 1e6 == pytest.approx([s.peak_memory_bytes for s in metrics.stages])
    assert ax.get_xlabel() == "stage" and ax.get_ylabel() == "peak memory (MB)"


def test_memory_breakdown_axis_starts_at_zero_when_a_kind_is_tiny() -> None:
    """The demo's case (VGG-16 on 4 stages): stage 0's weights are 1e-5 of the tallest bar, and
    matplotlib's autoscaling took their top as the axis' lower limit, dropping the 0 tick."""
    profile = pipesim.load_profile(Path(__file__).resolve().parents[2] / "traces" / "vgg16.json")
    result = pipesim.simulate(profile, pipesim.Topology.uniform(num_devices=4, bandwidth="25Gbit/s", latency="5us"),
                              schedule="1f1b", num_stages=4, num_microbatches=8, engine="analytic")
    stages = result.metrics.stages
    assert min(s.peak_breakdown_bytes["weights"] for s in stages) < 1e-5 * max(s.peak_memory_bytes for s in stages)
    ax = plots.memory_breakdown(result.metrics)
    assert ax.get_ylim()[0] == 0.0
    assert 0.0 in list(ax.get_yticks())
    # ... and the tallest bar keeps headroom below the frame (an empty top segment's edge stopped the margin).
    tallest = max(s.peak_memory_bytes for s in stages) / 1e9
    assert ax.get_ylim()[1] == pytest.approx(1.05 * tallest)


def test_staleness_bars_match_the_metrics() -> None:
    metrics = run("pipedream", p=4, m=4).metrics
    ax = plots.staleness(metrics)
    versions, delay, discrepancy = ([bar.get_height() for bar in c] for c in ax.containers)
    assert versions == [s.weight_versions_max for s in metrics.stages] == [4, 3, 2, 1]
    assert delay == [s.forward_delay_steps for s in metrics.stages] == [3, 2, 1, 0]
    assert discrepancy == [0, 0, 0, 0]
    assert ax.get_xlabel() == "stage" and ax.get_ylabel() == "versions / updates"
    means = [line for line in ax.lines if line.get_gid() == "forward_delay_mean"][0]
    assert list(means.get_ydata()) == [s.forward_delay_mean for s in metrics.stages]


def test_bubble_against_m_follows_the_closed_form(table: Any) -> None:
    ax = plots.bubble(table, num_stages=4)
    lines = {line.get_gid(): line for line in ax.lines}
    assert set(lines) == {"bubble:gpipe", "bubble:1f1b", "bubble:2bw", "closed-form"}
    gpipe = lines["bubble:gpipe"]
    assert list(gpipe.get_xdata()) == [1, 2, 4, 8, 16]
    # Uniform stages and free links (the table gives no bandwidth): the closed form holds exactly.
    assert list(gpipe.get_ydata()) == pytest.approx(list(closed_form_bubble(4, gpipe.get_xdata())), abs=1e-9)
    closed = lines["closed-form"]
    assert list(closed.get_ydata()) == pytest.approx(list(closed_form_bubble(4, closed.get_xdata())))
    assert ax.get_xlabel() == "microbatches m" and ax.get_ylabel() == "bubble fraction"
    assert "p=4" in ax.get_title(loc="left")


def test_heatmap_cells_are_the_pivot(table: Any) -> None:
    ax = plots.heatmap(table[table["schedule"] == "1f1b"], value="iteration_time_s", aggregate="min")
    image = [i for i in ax.images if i.get_gid() == "heatmap"][0]
    rows = table[(table["schedule"] == "1f1b") & (table["error"] == "")]
    expected = rows.pivot_table(index="num_stages", columns="num_microbatches", values="iteration_time_s",
                                aggfunc="min")
    assert np.ma.getdata(image.get_array()) == pytest.approx(expected.to_numpy())
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "8", "16"]
    assert ax.get_xlabel() == "microbatches m" and ax.get_ylabel() == "stages p"


def test_pareto_front_and_plot(table: Any) -> None:
    literal = pd.DataFrame({"peak_memory_bytes": [1.0, 2.0, 2.0, 3.0, 4.0], "throughput_samples_per_s": [5, 4, 7, 7, 9],
                            "error": ["", "", "", "", ""], "schedule": ["a"] * 5})
    assert pareto_front(literal).index.tolist() == [0, 2, 4]
    ax = plots.pareto(table)
    front = pareto_front(table)
    line = [line for line in ax.lines if line.get_gid() == "pareto"][0]
    assert list(line.get_ydata()) == [*front["throughput_samples_per_s"].tolist(), front["throughput_samples_per_s"].max()]
    assert line.get_xdata()[-1] * 1e6 == pytest.approx(table["peak_memory_bytes"].max())
    groups = {c.get_gid(): len(c.get_offsets()) for c in ax.collections if (c.get_gid() or "").startswith("points:")}
    ok = table[table["error"] == ""]
    assert groups == {f"points:{s}": int((ok["schedule"] == s).sum()) for s in ("gpipe", "1f1b", "2bw")}
    assert ax.get_xlabel() == "peak memory (MB)" and ax.get_ylabel() == "throughput (samples/s)"
    # The front's points are ringed in black, and the legend says so (a ring alone is not "over budget").
    rings = [c for c in ax.collections if c.get_gid() == "front"][0]
    assert len(rings.get_offsets()) == len(front)
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert "black ring: on the front" in labels and not any("over budget" in label for label in labels)
    fitting = plots.pareto(table.assign(fits=table["peak_memory_bytes"] < table["peak_memory_bytes"].median()),
                           fits="fits")
    assert "hollow dot: over budget" in [text.get_text() for text in fitting.get_legend().get_texts()]


def test_pareto_of_rows_without_finite_values_is_refused(table: Any) -> None:
    blank = table.assign(throughput_samples_per_s=np.nan)
    with pytest.raises(ConfigError) as caught:
        plots.pareto(blank)
    assert str(caught.value) == (f"table={len(table)}: has no successful row with a finite peak_memory_bytes and "
                                 "throughput_samples_per_s to plot")


def test_plots_draw_on_a_given_axes_and_save_every_format(trace: Trace, table: Any, tmp_path: Path) -> None:
    for draw in (lambda ax: plots.timeline(trace, ax=ax), lambda ax: plots.memory(trace, ax=ax),
                 lambda ax: plots.staleness(trace, ax=ax), lambda ax: plots.bubble(table, ax=ax),
                 lambda ax: plots.heatmap(table, ax=ax), lambda ax: plots.pareto(table, ax=ax)):
        _, given = plt.subplots()
        assert draw(given) is given
    for suffix in ("png", "svg", "pdf"):
        first = plots.save_figure(plots.timeline(trace), tmp_path / f"a.{suffix}").read_bytes()
        second = plots.save_figure(plots.timeline(trace), tmp_path / f"b.{suffix}").read_bytes()
        assert first == second and len(first) > 1000, suffix


def test_matplotlib_is_only_imported_by_plots() -> None:
    code = ("import sys, pipesim, pipesim.sweep, pipesim.sweep.analysis, pipesim.export.html, pipesim.export.chrome; "
            "print('matplotlib' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr
