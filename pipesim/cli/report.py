"""``pipesim report``: one self-contained HTML file for a simulation (trace) or a sweep (table)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click

from pipesim.cli.plot import load_table, load_trace
from pipesim.cli.options import non_empty
from pipesim.cli.outputs import out_file, writing
from pipesim.errors import ConfigError
from pipesim.spec.files import read_json, write_text_atomic
from pipesim.spec.units import parse_size, size_unit

TABLE_SUFFIXES = (".parquet", ".pq", ".csv")
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
                   "it fits (default: the budget saved in metrics.json by simulate --memory, if any).")
def report_command(source: str, out: str, fmt: str, title: str | None, memory: str | None) -> None:
    """Write one HTML file of metrics tables and figures for SOURCE.

    SOURCE is a folder written by ``simulate --out`` (or its trace.json) for a simulation,
    or a sweep table (.parquet or .csv) for a sweep. With a memory budget the simulation's
    report opens with the verdict: whether every device fits, and each device's headroom.
    """
    target = out_file(out, (".html", ".htm"))
    budget = parse_size(memory, "memory") if memory is not None else None
    from pipesim import __version__
    from pipesim.export.html import simulation_html, sweep_html
    from pipesim.plots import use_headless_backend

    use_headless_backend()

    if source.lower().endswith(TABLE_SUFFIXES):
        if memory is not None:
            raise ConfigError("memory", memory, "applies to a simulation's report; a sweep table's rows carry "
                              "fits_memory against their own memory_limit")
        from pipesim.plots.report import sweep_figures
        from pipesim.sweep.analysis import pareto_front
        from pipesim.sweep.store import read_run

        frame = load_table(source, columns=REPORT_COLUMNS)
        text = sweep_html(frame, sweep_figures(frame, fmt=fmt), version=__version__, title=title,
                          front=pareto_front(frame), run=read_run(source))
    else:
        from pipesim.metrics import compute_metrics, memory_verdict
        from pipesim.plots.report import simulation_figures

        trace = load_trace(source)
        metrics = compute_metrics(trace)
        data = metrics.to_dict()
        data["num_ops"] = metrics.num_ops
        data["microbatch_size"] = trace.info.microbatch_size
        saved = Path(source) / "metrics.json" if Path(source).is_dir() else Path(source).with_name("metrics.json")
        notes = []
        shown: dict[str, str] = {}
        run = saved_run(source)
        if saved.is_file():
            saved_metrics = read_object(saved, "metrics")
            data["partition"] = saved_partition(saved_metrics, trace.info.num_stages, saved)
            saved_budget = saved_metrics.get("memory_budget_bytes")
            if saved_budget is not None:
                if isinstance(saved_budget, bool) or not isinstance(saved_budget, (int, float)) \
                        or not math.isfinite(saved_budget) or saved_budget <= 0:
                    raise ConfigError("memory_budget_bytes", saved_budget, "must be a finite number > 0",
                                      source=str(saved))
                if budget is None:  # the saved budget, as simulate was given it
                    budget = float(saved_budget)
                    shown = {key: saved_metrics[key] for key in ("memory_budget", "memory_budget_unit")
                             if isinstance(saved_metrics.get(key), str)}
        if memory is not None:
            shown = {"memory_budget": memory.strip(), "memory_budget_unit": size_unit(memory)}
        if budget is not None:
            data.update(memory_verdict(metrics.device_peak_memory_bytes, budget))
            data.update(shown)
        perfetto = saved.with_name("trace.perfetto.json")
        if perfetto.is_file():
            notes.append(f"The timeline opens in ui.perfetto.dev from {perfetto.name} beside this report.")
        text = simulation_html(data, simulation_figures(trace, metrics, fmt=fmt), version=__version__, title=title,
                               notes=notes, run=run)
    with writing(target):
        write_text_atomic(target, text)
    click.echo(f"wrote {out}")


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
