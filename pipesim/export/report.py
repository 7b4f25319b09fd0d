"""Report folders (metrics JSON, trace JSON and a Perfetto trace, each written atomically) and the
text that summarises runs: the memory verdict, the rows of a comparison of schedules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipesim.export.chrome import chrome_json
from pipesim.export.strict_json import strict_dumps
from pipesim.spec.files import write_text_atomic

if TYPE_CHECKING:
    from pipesim.simulation import Result


# The data files of a report folder, in the order ``write_report`` writes them.
REPORT_FILES = ("metrics.json", "trace.json", "trace.perfetto.json")


def metrics_dict(result: Result, run: dict[str, Any] | None) -> dict[str, Any]:
    """The ``simulate --json`` object: ``Result.to_dict()`` with the ``run`` record when given."""
    data = result.to_dict()
    if run is not None:
        data["run"] = run
    return data


def verdict_text(data: dict[str, Any]) -> str:
    """The memory verdict of a ``simulate --json`` object that has one (``fits``): fits or not in
    the budget per device, the least headroom or the worst overshoot, and the device it is on."""
    from pipesim.spec.units import format_size

    headroom = data["device_memory_headroom_bytes"]
    worst = min(headroom)
    verdict = "fits" if data["fits"] else "does NOT fit"
    unit = data.get("memory_budget_unit", "GB")  # the unit the budget was given in
    budget = data.get("memory_budget") or format_size(data["memory_budget_bytes"], unit)
    return (f"{verdict} in {budget} per device "
            f"({'least headroom' if data['fits'] else 'worst overshoot'} {format_size(abs(worst), unit)}, "
            f"device {headroom.index(worst)})")


def _gb(value: float) -> str:
    return f"{value / 1e9:.2f}"


def comparison_rows(runs: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The comparison's headers and rows: iteration time, throughput (of one pipeline; with
    ``--model`` also the whole job's tokens/s and MFU), bubble, peak device memory, fits and
    staleness per schedule (each run a ``simulate --json`` object). ``simulate`` prints them and
    ``report`` of its folder shows them."""
    capacity = any("tokens_per_s" in data for data in runs)
    headers = ["schedule", "ranks x V", "iteration ms", "samples/s per pipeline" if capacity else "samples/s",
               *(["tokens/s all GPUs", "MFU"] if capacity else []), "bubble", "peak device GB", "fits",
               "fwd delay max", "versions max"]
    rows = []
    for data in runs:
        stages = data["stages"]
        fits = "-" if "fits" not in data else ("yes" if data["fits"] else "NO")
        job = [f"{data['tokens_per_s']:,.0f}", f"{data['mfu']:.1%}"] if "tokens_per_s" in data else ["-", "-"]
        rows.append([
            data["schedule"], f"{data['num_ranks']} x {data['num_stages'] // data['num_ranks']}",
            f"{data['iteration_time_s'] * 1e3:.3f}", f"{data['throughput_samples_per_s']:.2f}",
            *(job if capacity else []),
            f"{data['bubble_fraction']:.1%}", _gb(max(data["device_peak_memory_bytes"])), fits,
            str(max(stage["forward_delay_steps"] for stage in stages)),
            str(max(stage["weight_versions_max"] for stage in stages)),
        ])
    return headers, rows


def trace_json(result: Result, run: dict[str, Any] | None) -> str:
    """``Trace.to_json()`` with a top-level ``run`` record beside ``meta`` (``Trace.from_json`` reads
    past it, so the round trip stays exact); strict JSON."""
    data = result.trace.to_dict()
    if run is not None:
        data["run"] = run
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n"


def write_report(result: Result, out_dir: str | Path, *, run: dict[str, Any] | None = None,
                 metrics: dict[str, Any] | None = None) -> list[Path]:
    """Write a Result's data files into ``out_dir``; return the paths written.

    Files: ``metrics.json`` (the ``simulate --json`` object: ``metrics`` when given, with the
    memory verdict and capacity keys the command added, else ``metrics_dict``; less the
    wall-clock timings, ``Result.TIMINGS``, so that one command writes the same bytes each
    time), ``trace.json`` (exact round
    trip through ``Trace.from_json``) and ``trace.perfetto.json`` (Chrome trace format), each
    holding ``run`` (``pipesim.export.provenance.run_record``) when given. Plots are drawn by the
    caller with ``pipesim.plots``.
    """
    out = Path(out_dir)
    written = []
    data = metrics if metrics is not None else metrics_dict(result, run)
    texts = (strict_dumps({key: value for key, value in data.items() if key not in result.TIMINGS}),
             trace_json(result, run), chrome_json(result.trace, run=run))
    for name, text in zip(REPORT_FILES, texts, strict=True):
        write_text_atomic(out / name, text)
        written.append(out / name)
    return written
