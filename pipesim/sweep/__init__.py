"""Sweeps: a grid of what-if points from a YAML spec, simulated on Dask into one table."""

from pipesim.spec.partition import even_partition
from pipesim.sweep.points import COLUMNS, METRIC_COLUMNS, METRIC_SCHEMA, MetricColumn, PointRunner, metrics_row
from pipesim.sweep.runner import SweepSummary, make_batches, run_sweep
from pipesim.sweep.spec import AXES, Resolved, SweepSpec, load_spec, parse_spec
from pipesim.sweep.store import SweepFailedError, read_table, write_table
from pipesim.sweep.where import Expression

__all__ = [
    "AXES",
    "COLUMNS",
    "METRIC_COLUMNS",
    "METRIC_SCHEMA",
    "MetricColumn",
    "Expression",
    "PointRunner",
    "Resolved",
    "SweepFailedError",
    "SweepSpec",
    "SweepSummary",
    "even_partition",
    "load_spec",
    "make_batches",
    "metrics_row",
    "parse_spec",
    "read_table",
    "run_sweep",
    "write_table",
]
