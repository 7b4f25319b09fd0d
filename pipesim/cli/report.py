"""``pipesim report``: one self-contained HTML file of a simulation (its folder or a trace),
schedules side by side, a search, or a sweep (table)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from pipesim.cli.plot import load_table, load_trace
from pipesim.cli.options import non_empty
from pipesim.cli.outputs import out_file, writing
from pipesim.cli.search import read_candidates
from pipesim.errors import ConfigError
from pipesim.spec.files import read_json, write_text_atomic
from pipesim.spec.units import parse_size, size_unit

if TYPE_CHECKING:
    from pipesim.engine.trace import Trace
    from pipesim.metrics import Metrics

TABLE_SUFFIXES = (".parquet", ".pq", ".csv")
# The files that mark a folder of schedules side by side (simulate --schedule A,B --out) and of a search.
COMPARISON_FILE = "comparison.json"
SEARCH_TABLE = "candidates.csv"
# The columns a sweep's report reads: its tables and figures.
REPORT_COLUMNS = ("point", "schedule", "num_stages", "num_microbatches", "bubble_fraction", "throughput_samples_per_s",
                  "peak_memory_bytes")


@click.command("report")
@click.argument("source", metavar="SOURCE")
@click.option("--out", "out", type=str, required=True, help="The HTML file to write.")
@click.option("--figures", "fmt", type=click.Choice(["png", "svg"]), default="png", show_default=True,
              help="Embed figures as base64 PNG or inline SVG.")
@click.option("--title", type=str, default=None, help="Page title.")
@click.option("--memory", "memory", type=str, default=None, callback=non_empty,
              help="Memory budget per device (e.g. 80GB) for a simulation: the report says per device whether "
                   "it fits (default: the budget saved in metrics.json by simulate --memory, if any); for a "
                   "search, the budget line of its figure.")
def report_command(source: str, out: str, fmt: str, title: str | None, memory: str | None) -> None:
    """Write one HTML file of metrics tables and figures for SOURCE.

    SOURCE is a folder written by ``simulate --out`` (or its trace.json) for a simulation, one
    written by ``simulate --schedule A,B --out`` for schedules side by side, one written by
    ``search --out`` (or its candidates.csv) for a search, or a sweep table (.parquet or .csv).
    With a memory budget the simulation's report opens with the verdict: whether every device
    fits, and each device's headroom; a search's figure draws it.
    """
    target = out_file(out, (".html", ".htm"))
    budget = parse_size(memory, "memory") if memory is not None else None
    from pipesim import __version__
    from pipesim.export.html import comparison_html, search_html, simulation_html, sweep_html
    from pipesim.plots import use_headless_backend

    use_headless_backend()
    path = Path(source)
    if path.name == SEARCH_TABLE or (path.is_dir() and (path / SEARCH_TABLE).is_file()):
        from pipesim.plots.report import search_figures

        table = path if path.name == SEARCH_TABLE else path / SEARCH_TABLE
        frame = read_candidates(table)
        saved_run_file = table.with_name("run.json")
        if budget is None and saved_run_file.is_file():  # the search's own budget, as it recorded it
            saved_budget = read_object(saved_run_file, "run").get("budget")
            if isinstance(saved_budget, (int, float)) and not isinstance(saved_budget, bool) \
                    and math.isfinite(saved_budget) and saved_budget > 0:
                budget = float(saved_budget)
        text = search_html(frame, search_figures(frame, budget=budget, fmt=fmt), version=__version__, title=title,
                           budget=budget)
    elif path.is_dir() and (path / COMPARISON_FILE).is_file():
        from pipesim.plots.report import comparison_figures

        runs, traces = [], []
        for schedule in compared_schedules(path / COMPARISON_FILE):
            data, trace, _, _ = simulation_data(str(path / schedule), budget)
            runs.append(data)
            traces.append(trace)
        text = comparison_html(runs, comparison_figures(traces, fmt=fmt), version=__version__, title=title)
    elif source.lower().endswith(TABLE_SUFFIXES):
        if memory is not None:
            raise ConfigError("memory", memory, "applies to a simulation's or a search's report; a sweep table's "
                              "rows carry fits_memory against their own memory_limit")
        from pipesim.plots.report import sweep_figures
        from pipesim.sweep.analysis import pareto_front
        from pipesim.sweep.store import read_run

        frame = load_table(source, columns=REPORT_COLUMNS)
        text = sweep_html(frame, sweep_figures(frame, fmt=fmt), version=__version__, title=title,
                          front=pareto_front(frame), run=read_run(source))
    else:
        from pipesim.plots.report import simulation_figures

        data, trace, metrics, notes = simulation_data(source, budget, memory)
        text = simulation_html(data, simulation_figures(trace, metrics, fmt=fmt), version=__version__, title=title,
                               notes=notes, run=data.pop("run", None))
    with writing(target):
        write_text_atomic(target, text)
    click.echo(f"wrote {out}")


def simulation_data(source: str, budget: float | None,
                    budget_text: str | None = None) -> tuple[dict[str, Any], Trace, Metrics, list[str]]:
    """A simulation's ``simulate --json`` object as its report shows it, from its trace and the
    metrics.json beside it: metrics afresh, the saved partition, capacity keys, run record and
    memory budget (``budget`` when given, as ``budget_text`` wrote it, else the saved one in the
    unit simulate was given it) with its verdict; also the trace, its metrics and notes for the page.

    Raises:
        ConfigError: an unreadable trace, or a saved value of the wrong kind, naming the file.
    """
    from pipesim.metrics import compute_metrics, memory_verdict

    trace = load_trace(source)
    metrics = compute_metrics(trace)
    data = metrics.to_dict()
    data["num_ops"] = metrics.num_ops
    data["microbatch_size"] = trace.info.microbatch_size
    saved = Path(source) / "metrics.json" if Path(source).is_dir() else Path(source).with_name("metrics.json")
    notes = []
    shown: dict[str, str] = {}
    run = saved_run(source)
    if run is not None:
        data["run"] = run
    if saved.is_file():
        saved_metrics = read_object(saved, "metrics")
        data["partition"] = saved_partition(saved_metrics, trace.info.num_stages, saved)
        data.update(saved_capacity(saved_metrics, saved))
        saved_budget = saved_metrics.get("memory_budget_bytes")
        if saved_budget is not None:
            if isinstance(saved_budget, bool) or not isinstance(saved_budget, (int, float)) \
                    or not math.isfinite(saved_budget) or saved_budget <= 0:
                raise ConfigError("memory_budget_bytes", saved_budget, "must be a finite number > 0",
                                  source=str(saved))
            if budget is None:
                budget = float(saved_budget)
                shown = {key: saved_metrics[key] for key in ("memory_budget", "memory_budget_unit")
                         if isinstance(saved_metrics.get(key), str)}
    if budget_text is not None:
        shown = {"memory_budget": budget_text.strip(), "memory_budget_unit": size_unit(budget_text)}
    if budget is not None:
        data.update(memory_verdict(metrics.device_peak_memory_bytes, budget))
        data.update(shown)
    perfetto = saved.with_name("trace.perfetto.json")
    if perfetto.is_file():
        notes.append(f"The timeline opens in ui.perfetto.dev from {perfetto.name} beside this report.")
    return data, trace, metrics, notes


def compared_schedules(path: Path) -> list[str]:
    """The schedules of a comparison folder's comparison.json (``{"runs": [{"schedule": ...}, ...]}``),
    each the name of a folder beside it.

    Raises:
        ConfigError: another shape, or a schedule that is not a plain folder name, naming the file.
    """
    runs = read_object(path, "comparison").get("runs")
    if not isinstance(runs, list) or not runs or not all(isinstance(run, dict) for run in runs):
        raise ConfigError("runs", runs if not isinstance(runs, list) else f"{len(runs)} items",
                          "must be a non-empty list of run objects", source=str(path))
    names = [run.get("schedule") for run in runs]
    for name in names:
        if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name:
            raise ConfigError("runs[].schedule", name, "must name a schedule's folder beside comparison.json",
                              source=str(path))
    return [str(name) for name in names]


def saved_partition(saved: dict[str, Any], num_stages: int, path: Path) -> list[list[int]]:
    """metrics.json's ``partition``: a ``[start, end]`` layer range per stage of the trace, or none.

    Raises:
        ConfigError: anything else, naming the file.
    """
    partition = saved.get("partition", [])
    if partition == []:
        return []
    if not isinstance(partition, list) or len(partition) != num_stages or not all(
            isinstance(item, list) and len(item) == 2
            and all(isinstance(bound, int) and not isinstance(bound, bool) for bound in item) for item in partition):
        raise ConfigError("partition", partition, f"must be a [start, end] layer range per stage ({num_stages})",
                          source=str(path))
    return partition


# A capacity run's keys (simulate --model) that its report shows: integers >= 1, and numbers >= 0.
CAPACITY_COUNTS = ("num_gpus", "tp", "dp")
CAPACITY_NUMBERS = ("tokens_per_s", "mfu", "global_throughput_samples_per_s")


def saved_capacity(saved: dict[str, Any], path: Path) -> dict[str, Any]:
    """metrics.json's capacity keys (``simulate --model``: GPUs, TP, DP, tokens/s, MFU, the DP
    pipelines' samples/s), when it has ``tokens_per_s``; other keys are left alone.

    Raises:
        ConfigError: one of those keys missing or of the wrong type, naming the file.
    """
    if "tokens_per_s" not in saved:
        return {}
    found = {}
    for key in (*CAPACITY_COUNTS, *CAPACITY_NUMBERS):
        value = saved.get(key)
        if value is None and key == "global_throughput_samples_per_s":
            continue
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if key in CAPACITY_COUNTS and not (isinstance(value, int) and is_number and value >= 1):
            raise ConfigError(key, value, "must be an integer >= 1", source=str(path))
        if key in CAPACITY_NUMBERS and not (isinstance(value, (int, float)) and is_number and 0 <= value < math.inf):
            raise ConfigError(key, value, "must be a finite number >= 0", source=str(path))
        found[key] = value
    return found


def read_object(path: Path, field: str) -> dict[str, Any]:
    """A saved JSON file that must hold one object (metrics.json, trace.json).

    Raises:
        ConfigError: the file is unreadable, not JSON, or not an object.
    """
    data = read_json(path, field)
    if not isinstance(data, dict):
        raise ConfigError(field, str(path), f"must hold a JSON object, not {type(data).__name__}")
    return data


def saved_run(source: str) -> dict[str, Any] | None:
    """The ``run`` record saved with a simulation: in metrics.json (small), else in trace.json."""
    path = Path(source)
    trace_path = path / "trace.json" if path.is_dir() else path
    for candidate in (trace_path.with_name("metrics.json"), trace_path):
        if candidate.is_file():
            run = read_object(candidate, "metrics" if candidate.name == "metrics.json" else "trace").get("run")
            if isinstance(run, dict):
                return run
    return None
