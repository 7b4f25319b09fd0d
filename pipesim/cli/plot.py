"""``pipesim plot timeline|memory|staleness|bubble|sweep``: one figure from a trace or a sweep table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from pipesim.cli.options import non_empty
from pipesim.cli.outputs import out_file_option, writing
from pipesim.engine.trace import Trace
from pipesim.errors import ConfigError
from pipesim.spec.files import MAX_TRACE_BYTES, read_text

FIGURE_SUFFIXES = (".png", ".svg", ".pdf")
BUBBLE_COLUMNS = ("schedule", "num_stages", "num_microbatches", "bubble_fraction")


def load_trace(source: str) -> Trace:
    """A trace from ``trace.json`` or from a report folder that holds one.

    Raises:
        ConfigError: no such file, or not a pipesim trace.
    """
    if not source.strip():
        raise ConfigError("trace", source, "must name a trace.json or a folder written by simulate --out")
    path = Path(source)
    if path.is_dir():
        path = path / "trace.json"
    return Trace.from_json(read_text(path, "trace", MAX_TRACE_BYTES), source=str(path))


def load_table(source: str, where: str | None = None, *, columns: tuple[str, ...] = (),
               numbers: tuple[str, ...] = ()) -> Any:
    """A sweep table (Parquet or CSV) that has ``columns``, its known columns and ``numbers``
    checked for their kind (``pipesim.sweep.store.read_table``), filtered by ``where``.

    Raises:
        ConfigError: an unreadable file, a missing column, a value of the wrong kind (naming the
            file, the column and the value), or a bad ``where``.
    """
    from pipesim.sweep.analysis import filter_rows
    from pipesim.sweep.store import read_table

    return filter_rows(read_table(source, columns=columns, numbers=numbers), where)


def require_rows(frame: Any, source: str, where: str | None, *numbers: str) -> None:
    """Refuse a table (after ``--where``) with no successful row whose ``numbers`` are finite.

    Raises:
        ConfigError: naming the table's file and the columns.
    """
    from pipesim.sweep.analysis import usable

    if usable(frame, *numbers).empty:
        kept = " that --where keeps" if where else ""
        raise ConfigError("table", source, f"has no successful row{kept} with a finite {' and '.join(numbers)} "
                          f"to plot ({len(frame)} rows)")


def _out_option(function: Any) -> Any:
    return click.option("--out", "out", type=str, required=True, callback=out_file_option(FIGURE_SUFFIXES),
                        help="Figure file: FILE.png, FILE.svg or FILE.pdf.")(function)


def _save(ax: Any, out: str) -> None:
    from pipesim.plots import save_figure

    with writing(out):
        click.echo(f"wrote {save_figure(ax, out)}")


def _agg() -> None:
    from pipesim.plots import use_headless_backend

    use_headless_backend()


@click.group("plot")
def plot_group() -> None:
    """Draw one figure from a trace (timeline, memory, staleness) or a sweep table (bubble, sweep)."""


@plot_group.command("timeline")
@click.argument("trace_path", metavar="TRACE")
@_out_option
@click.option("--labels/--no-labels", default=None, help="Microbatch numbers on bars (default: where they fit).")
def timeline_command(trace_path: str, out: str, labels: bool | None) -> None:
    """Gantt chart of TRACE (trace.json, or a folder written by simulate --out)."""
    _agg()
    from pipesim.plots import timeline

    _save(timeline(load_trace(trace_path), label_ops=labels), out)


@plot_group.command("memory")
@click.argument("trace_path", metavar="TRACE")
@_out_option
@click.option("--stage", type=int, default=None, help="Stage to draw over time (default: the highest peak).")
@click.option("--peaks", is_flag=True, help="Instead: every stage's peak, stacked by kind.")
def memory_command(trace_path: str, out: str, stage: int | None, peaks: bool) -> None:
    """Memory of a stage over time stacked by kind, or every stage's peak (--peaks)."""
    if peaks and stage is not None:
        raise ConfigError("stage", stage, "draws one stage over time; --peaks draws every stage's peak, "
                          "give one of them")
    trace = load_trace(trace_path)
    num_stages = trace.info.num_stages
    if stage is not None and not 0 <= stage < num_stages:
        raise ConfigError("stage", stage, f"must be in 0..{num_stages - 1}")
    _agg()
    from pipesim.plots import memory, memory_breakdown

    _save(memory_breakdown(trace) if peaks else memory(trace, stage=stage), out)


@plot_group.command("staleness")
@click.argument("trace_path", metavar="TRACE")
@_out_option
def staleness_command(trace_path: str, out: str) -> None:
    """Weight versions held, forward delay and discrepancy per stage."""
    _agg()
    from pipesim.plots import staleness

    _save(staleness(load_trace(trace_path)), out)


@plot_group.command("bubble")
@click.argument("table_path", metavar="TABLE")
@_out_option
@click.option("--stages", "num_stages", type=int, default=None, help="p to draw (default: the table's middle p).")
@click.option("--where", type=str, default=None, callback=non_empty,
              help="Keep rows where this holds, e.g. \"bandwidth_bytes_per_s == 1e10\".")
def bubble_command(table_path: str, out: str, num_stages: int | None, where: str | None) -> None:
    """Bubble fraction against m from a sweep TABLE, with the closed form (p-1)/(m+p-1)."""
    _agg()
    from pipesim.plots import bubble

    frame = load_table(table_path, where, columns=BUBBLE_COLUMNS)
    require_rows(frame, table_path, where, "bubble_fraction")
    _save(bubble(frame, num_stages=num_stages), out)


@plot_group.command("sweep")
@click.argument("table_path", metavar="TABLE")
@_out_option
@click.option("--kind", type=click.Choice(["heatmap", "pareto"]), default="heatmap", show_default=True)
@click.option("--x", "x", type=str, default=None, callback=non_empty,
              help="Column across (heatmap: num_microbatches; pareto: peak_memory_bytes).")
@click.option("--y", "y", type=str, default=None, callback=non_empty,
              help="Column up (heatmap: num_stages; pareto: throughput_samples_per_s).")
@click.option("--value", type=str, default="throughput_samples_per_s", show_default=True, help="Heatmap cell value.")
@click.option("--aggregate", type=click.Choice(["max", "min", "mean", "median"]), default="max", show_default=True)
@click.option("--hue", type=str, default="schedule", show_default=True, help="Pareto point colors by this column.")
@click.option("--where", type=str, default=None, callback=non_empty,
              help="Keep rows where this holds, e.g. \"schedule == '1f1b'\".")
def sweep_plot_command(table_path: str, out: str, kind: str, x: str | None, y: str | None, value: str,
                       aggregate: str, hue: str, where: str | None) -> None:
    """A heatmap of VALUE over X by Y, or the Pareto front of low X and high Y, from a sweep TABLE."""
    context = click.get_current_context()
    for name, reader in (("hue", "pareto"), ("value", "heatmap"), ("aggregate", "heatmap")):
        if reader != kind and context.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE:
            raise ConfigError(name, context.params[name], f"applies to --kind {reader} only, not {kind}")
    _agg()
    from pipesim.plots import heatmap, pareto

    if kind == "heatmap":
        x, y = x or "num_microbatches", y or "num_stages"
        frame = load_table(table_path, where, columns=(x, y, value), numbers=(value,))
        require_rows(frame, table_path, where, value)
        ax = heatmap(frame, x=x, y=y, value=value, aggregate=aggregate)
    else:
        x, y = x or "peak_memory_bytes", y or "throughput_samples_per_s"
        frame = load_table(table_path, where, columns=(x, y, hue), numbers=(x, y))
        require_rows(frame, table_path, where, x, y)
        ax = pareto(frame, x=x, y=y, hue=hue)
    _save(ax, out)
