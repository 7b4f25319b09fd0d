"""Reading sweep tables: row filters, Pareto fronts and the closed-form bubble, as pure pandas."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipesim.errors import ConfigError
from pipesim.sweep.spec import AXES
from pipesim.sweep.where import Expression


def closed_form_bubble(num_stages: Any, num_microbatches: Any) -> Any:
    """GPipe's and 1F1B's bubble fraction with uniform stages and free links: (p-1)/(m+p-1)."""
    p = np.asarray(num_stages, dtype=np.float64)
    m = np.asarray(num_microbatches, dtype=np.float64)
    return (p - 1) / (m + p - 1)


def successful(frame: Any) -> Any:
    """Rows whose point simulated without an error."""
    if "error" not in frame.columns:
        return frame
    return frame[frame["error"].fillna("") == ""]


def usable(frame: Any, *columns: str) -> Any:
    """Successful rows whose ``columns`` (numeric) are all finite: the rows a figure can draw."""
    rows = successful(frame)
    keep = np.ones(len(rows), dtype=bool)
    for column in columns:
        keep &= np.isfinite(rows[column].to_numpy(dtype=float))
    return rows[keep]


def varying_inputs(frame: Any, *shown: str) -> list[str]:
    """Input columns (the spec's axes) other than ``shown`` that take more than one value among
    rows equal in ``shown``: what a figure with ``shown`` as its axes (and lines) aggregates
    over, and should say so. An input that only changes with a shown one (K with the schedule)
    is not aggregated over and is left out."""
    keys = [column for column in shown if column in frame.columns]
    found = []
    for column in AXES.values():
        if column not in frame.columns or column in shown or not len(frame):
            continue
        counts = frame.groupby(keys, dropna=False)[column].nunique(dropna=False) if keys else \
            frame[column].nunique(dropna=False)
        if int(counts.max() if keys else counts) > 1:
            found.append(column)
    return found


def filter_rows(frame: Any, where: str | None) -> Any:
    """Rows of ``frame`` for which the ``where`` expression (over its columns) holds.

    Raises:
        ConfigError: the expression is malformed or names a column the table lacks.
    """
    if not where:
        return frame
    expression = Expression(where, frame.columns, field="where")
    records = frame.to_dict(orient="records")
    keep = [expression(record) for record in records]
    return frame[np.asarray(keep, dtype=bool)] if len(frame) else frame


def require_columns(frame: Any, *columns: str, source: str | None = None) -> None:
    """Raise ConfigError naming the first of ``columns`` that ``frame`` lacks (and the table's file)."""
    for column in columns:
        if column not in frame.columns:
            raise ConfigError("column", column, f"is not in the table; columns: {', '.join(map(str, frame.columns))}",
                              source=source)


def pareto_front(frame: Any, *, x: str = "peak_memory_bytes", y: str = "throughput_samples_per_s") -> Any:
    """The rows no other row beats: none has ``x`` as low and ``y`` as high with one strictly better.

    Returned sorted by ``x`` rising (so ``y`` rises too); rows with an error or NaN are ignored.

    Raises:
        ConfigError: a column is missing.
    """
    require_columns(frame, x, y)
    rows = successful(frame)
    rows = rows[np.isfinite(rows[x].to_numpy(dtype=float)) & np.isfinite(rows[y].to_numpy(dtype=float))]
    ordered = rows.sort_values([x, y], ascending=[True, False], kind="stable")
    best = -np.inf
    keep = []
    for value in ordered[y].to_numpy(dtype=float).tolist():
        keep.append(value > best)
        best = max(best, value)
    return ordered[np.asarray(keep, dtype=bool)] if len(ordered) else ordered
