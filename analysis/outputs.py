"""Shared plumbing of the studies: command-line options and deterministic table and figure files."""

from __future__ import annotations

import argparse
import os
import uuid
from pathlib import Path
from typing import Any

import pandas as pd

import pipesim.plots

ANALYSIS = Path(__file__).resolve().parent
TRACES = ANALYSIS.parent / "traces"
GB = 1e9


def parse_args(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    """The options every study takes: ``--out DIR`` (default: analysis/) and ``--quick``."""
    parser = argparse.ArgumentParser(description=description.strip().splitlines()[0])
    parser.add_argument("--out", type=Path, default=ANALYSIS,
                        help="folder that receives figures/ and tables/ (default: analysis/)")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny setting for smoke tests; the files are not the published ones")
    return parser.parse_args(argv)


def write_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    try:
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return path


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "" if value != value else f"{value:.4g}"
    return str(value)


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub markdown table of ``frame``, floats to 4 significant digits."""
    header = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "| " + " | ".join("---:" if pd.api.types.is_numeric_dtype(frame[c]) else "---"
                             for c in frame.columns) + " |"
    rows = ["| " + " | ".join(_cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows]) + "\n"


def write_table(frame: pd.DataFrame, out: Path, name: str) -> tuple[Path, Path]:
    """Write ``frame`` as ``out/tables/NAME.csv`` (6 significant digits) and ``NAME.md``."""
    tables = out / "tables"
    csv = write_atomic(tables / f"{name}.csv", frame.to_csv(index=False, float_format="%.6g", lineterminator="\n"))
    md = write_atomic(tables / f"{name}.md", markdown_table(frame))
    return csv, md


def write_figure(figure: Any, out: Path, name: str, *, dpi: int = 90) -> Path:
    """Save a matplotlib figure as ``out/figures/NAME.png`` with no timestamp, and close it."""
    path: Path = pipesim.plots.save_figure(figure.axes[0], out / "figures" / f"{name}.png", dpi=dpi)
    return path


def reference_values(frame: pd.DataFrame, keys: list[str], reference: str, column: str) -> Any:
    """For every row, ``column`` of the row with the same ``keys`` whose schedule is ``reference``."""
    rows = frame[frame["schedule"] == reference][[*keys, column]].rename(columns={column: "_reference"})
    return frame[keys].merge(rows, on=keys, how="left", validate="many_to_one")["_reference"].to_numpy()


def busy_fraction(result: pipesim.Result) -> float:
    """Steady-state pipeline utilization: compute work per minibatch over devices x iteration time.

    Unlike the engine's windowed ``bubble_fraction``, this stays exact when the pipeline is
    deeper than a minibatch (p > m), where the window cannot avoid the fill or the drain.
    """
    frame = result.trace.to_frame()
    compute = frame[frame["stream"] == "compute"]
    work = float((compute["end_s"] - compute["start_s"]).sum()) / result.metrics.num_minibatches
    devices = result.trace.info.num_ranks
    return work / (devices * result.metrics.iteration_time_s)


def activations_gb(breakdown: dict[str, float]) -> float:
    """What activations take in a peak's breakdown, GB: the stashed ones and what a recomputing
    backward re-creates (the ``working`` kind)."""
    return (breakdown["activations"] + breakdown["working"]) / GB
