"""One self-contained HTML report: metrics tables and embedded figures, for a simulation, schedules
compared side by side, a search of parallel configurations, or a sweep.

Figures come in already rendered (PNG bytes, embedded as base64, or SVG text, inlined), so this
module needs no plotting library; ``pipesim.plots.report`` draws them.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Iterable, Sequence
from typing import Any

from pipesim.engine.trace import CATEGORIES
from pipesim.export.provenance import INNER_HOPS, describe, label
from pipesim.export.report import comparison_rows, verdict_text

# (title, rendered bytes, format: "png" or "svg")
Figure = tuple[str, bytes, str]

_STYLE = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1200px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th { background: #f4f4f4; } td.text, th.text { text-align: left; }
figure { margin: 1.5em 0; } figure img, figure svg { max-width: 100%; height: auto; }
figcaption { font-size: 0.85em; color: #555; } .note { color: #555; font-size: 0.85em; }
.wide { overflow-x: auto; max-width: 100%; } .wide td { white-space: nowrap; }
"""


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, text_columns: int = 0) -> str:
    """An HTML table; cells are escaped, the first ``text_columns`` are left-aligned."""
    def cell(tag: str, index: int, value: Any) -> str:
        css = ' class="text"' if index < text_columns else ""
        return f"<{tag}{css}>{html.escape(str(value))}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(headers))
    body = "\n".join("<tr>" + "".join(cell("td", i, v) for i, v in enumerate(row)) + "</tr>" for row in rows)
    return f"<table>\n<tr>{head}</tr>\n{body}\n</table>"


def figure(item: Figure) -> str:
    """A figure: PNG as a base64 data URI, SVG inlined (its XML header dropped)."""
    title, data, fmt = item
    if fmt == "svg":
        text = data.decode("utf-8")
        body = text[text.index("<svg"):] if "<svg" in text else text
    elif fmt == "png":
        body = f'<img alt="{html.escape(title)}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'
    else:
        raise ValueError(f"figure format must be png or svg, got {fmt!r}")
    return f"<figure>\n{body}\n<figcaption>{html.escape(title)}</figcaption>\n</figure>"


def page(title: str, sections: Sequence[str], *, version: str) -> str:
    """The whole document."""
    parts = "\n".join(sections)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
            f"<style>{_STYLE}</style>\n</head>\n<body>\n<h1>{html.escape(title)}</h1>\n{parts}\n"
            f'<p class="note">Written by pipesim {html.escape(version)}.</p>\n</body>\n</html>\n')


def _bytes(value: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value:.0f} B"


def simulation_html(metrics: dict[str, Any], figures: Sequence[Figure], *, version: str,
                    title: str | None = None, notes: Sequence[str] = (), run: dict[str, Any] | None = None) -> str:
    """The report of one simulation from its ``simulate --json`` object (``Result.to_dict()``).

    ``run`` (the inputs: ``pipesim.export.provenance.run_record``) is the first section, and its
    profile and link settings are in the title, so two saved reports are told apart at a glance.
    """
    m = metrics
    window = (f"minibatches {m['warmup_minibatches']}..{m['num_minibatches'] - m['cooldown_minibatches'] - 1}"
              if m["warmup_minibatches"] else "whole run")
    summary = [
        ("schedule", m["schedule"]), ("engine", m["engine"]), ("stages p", m["num_stages"]),
        ("microbatches m", m["num_microbatches"]), ("minibatches K", m["num_minibatches"]),
        ("microbatch size", m.get("microbatch_size", "")), ("compute ops", m["num_ops"]),
        ("iteration time", f"{m['iteration_time_s'] * 1e3:.3f} ms ({window})"),
        ("makespan", f"{m['makespan_s'] * 1e3:.3f} ms"),
        *_throughput_rows(m),
        ("bubble fraction", f"{m['bubble_fraction']:.1%}"),
        ("peak memory", f"{_bytes(m['peak_memory_bytes'])} (the largest device)"),
        *([("memory budget", verdict_text(m))] if "fits" in m else []),
        ("weight staleness", _staleness_text(m["stages"])),
    ]
    partition = m.get("partition") or []
    rows = []
    for stage in m["stages"]:
        layers = partition[stage["stage"]] if stage["stage"] < len(partition) else None
        breakdown = stage["peak_breakdown_bytes"]
        rows.append([
            stage["stage"], stage["device"], f"{layers[0]}:{layers[1]}" if layers else "",
            f"{stage['utilization']:.1%}", f"{stage['bubble_fraction']:.1%}",
            f"{stage['exposed_communication_s'] * 1e3:.3f}", _bytes(stage["peak_memory_bytes"]),
            *(_bytes(breakdown.get(c, 0.0)) for c in CATEGORIES), stage["weight_versions_max"],
            stage["max_inflight_microbatches"], stage["forward_delay_steps"], f"{stage['forward_delay_mean']:.2f}",
            stage["discrepancy_max"],
        ])
    headers = ["stage", "device", "layers", "utilization", "bubble", "exposed comm (ms)", "peak memory",
               *(f"at peak: {c}" for c in CATEGORIES), "versions", "in flight", "fwd delay max",
               "fwd delay mean", "discrepancy max"]
    sections = [
        *([f'<p class="verdict"><strong>{html.escape(verdict_text(m))}</strong></p>'] if "fits" in m else []),
        *(['<h2 id="run">Run</h2>', table(["input", "value"], describe(run), text_columns=2)] if run else []),
        "<h2>Summary</h2>", table(["quantity", "value"], summary, text_columns=2),
        "<h2>Per device</h2>", _device_table(m),
        '<p class="note">A device holds the memory of every stage on it; its peak is the peak of their sum '
        "over time, which is what must fit on one GPU.</p>",
        "<h2>Per stage</h2>", table(headers, rows),
        *(f'<p class="note">{html.escape(note)}</p>' for note in notes),
        "<h2>Figures</h2>", *(figure(item) for item in figures),
    ]
    heading = title or f"pipesim: {m['schedule']}, p={m['num_stages']}, m={m['num_microbatches']}, K={m['num_minibatches']}"
    if run and not title:
        links = dict(describe(run))
        # A model's pipeline with hops inside a node: the run's link is its outer hops' (the Run table says how many).
        outer = " between nodes" if INNER_HOPS in str(run.get("topology", {}).get("name", "")) else ""
        heading += (f" — {run['profile']['name']}, {links[label('bandwidth_bytes_per_s')]}, "
                    f"{links[label('latency_s')]}{outer}")
    if "tokens_per_s" in m and not title:
        heading += f" — {m['num_gpus']} GPUs, {m['tokens_per_s']:,.0f} tokens/s, MFU {m['mfu']:.1%}"
    if "fits" in m and not title:
        budget = m.get("memory_budget") or f"{m['memory_budget_bytes'] / 1e9:.1f} GB"
        heading += f" — {'fits' if m['fits'] else 'does NOT fit'} in {budget}"
    return page(heading, sections, version=version)


def degrees_text(m: dict[str, Any]) -> str:
    """``32 GPUs: TP 2 x PP 4 x DP 4`` from a capacity run's object (``simulate --model --json``);
    the pipeline's ranks are its PP."""
    return f"{m['num_gpus']} GPUs: TP {m['tp']} x PP {m['num_ranks']} x DP {m['dp']}"


def _throughput_rows(m: dict[str, Any]) -> list[tuple[str, str]]:
    """The throughput of one pipeline, and for a capacity run (``tokens_per_s`` in ``m``) the
    whole job's beside it: samples/s over the DP pipelines, tokens/s, MFU and the parallel degrees."""
    pipeline = f"{m['throughput_samples_per_s']:.2f} samples/s"
    if "tokens_per_s" not in m:
        return [("throughput", pipeline)]
    rows = [("GPUs and parallel degrees", degrees_text(m)),
            ("throughput per pipeline", pipeline)]
    if "global_throughput_samples_per_s" in m:
        rows.append(("throughput, all DP pipelines", f"{m['global_throughput_samples_per_s']:.2f} samples/s"))
    rows += [("tokens/s, all GPUs", f"{m['tokens_per_s']:,.0f}"), ("MFU", f"{m['mfu']:.1%}")]
    return rows


def _staleness_text(stages: Sequence[dict[str, Any]]) -> str:
    """The most weight versions, forward delay and discrepancy over the stages, in words."""
    versions = max(stage["weight_versions_max"] for stage in stages)
    delay = max(stage["forward_delay_steps"] for stage in stages)
    discrepancy = max(stage["discrepancy_max"] for stage in stages)
    if versions <= 1 and delay == 0 and discrepancy == 0:
        return "none: one weight version, no forward delay or discrepancy (no staleness chart)"
    return f"up to {versions} weight versions, forward delay up to {delay} updates, discrepancy up to {discrepancy}"


def _device_table(m: dict[str, Any]) -> str:
    """Per device: its stages, utilization, peak memory and that peak by category, and its
    headroom under the memory budget when there is one."""
    headroom = m.get("device_memory_headroom_bytes")
    breakdowns = m.get("device_peak_breakdown_bytes") or []
    rows = []
    for device, peak in enumerate(m["device_peak_memory_bytes"]):
        breakdown = breakdowns[device] if device < len(breakdowns) else {}
        held = ",".join(str(stage["stage"]) for stage in m["stages"] if stage["device"] == device)
        utilization = m["device_utilization"][device] if device < len(m["device_utilization"]) else math.nan
        rows.append([device, held, f"{utilization:.1%}", _bytes(peak),
                     *(_bytes(breakdown.get(c, 0.0)) for c in CATEGORIES),
                     *([_bytes(headroom[device])] if headroom is not None else [])])
    headers = ["device", "stages", "utilization", "peak memory", *(f"at peak: {c}" for c in CATEGORIES),
               *(["headroom"] if headroom is not None else [])]
    return table(headers, rows)


def comparison_html(runs: Sequence[dict[str, Any]], figures: Sequence[Figure], *, version: str,
                    title: str | None = None) -> str:
    """The report of schedules compared side by side (``simulate --schedule A,B --out``): their
    shared inputs, one row per schedule (``comparison_rows``), each one's memory verdict, and the
    figures. ``runs`` are ``simulate --json`` objects (their ``run`` records included)."""
    names = [run["schedule"] for run in runs]
    first = runs[0].get("run")
    sections = []
    if first:
        shared = dict(first, schedule=", ".join(names),
                      stages_per_rank=", ".join(str(run.get("run", {}).get("stages_per_rank", "")) for run in runs))
        sections += ['<h2 id="run">Run</h2>', table(["input", "value"], describe(shared), text_columns=2)]
    headers, rows = comparison_rows(list(runs))
    sections += ["<h2>Schedules side by side</h2>", f'<div class="wide">{table(headers, rows, text_columns=1)}</div>']
    if any("tokens_per_s" in run for run in runs):
        sections.append(f'<p class="note">{html.escape(degrees_text(runs[0]))}; samples/s is one pipeline\'s, '
                        "tokens/s and MFU the whole job's.</p>")
    verdicts = [(run["schedule"], verdict_text(run)) for run in runs if "fits" in run]
    if verdicts:
        sections += ["<h2>Memory</h2>", table(["schedule", "verdict"], verdicts, text_columns=2)]
    sections += ["<h2>Figures</h2>", *(figure(item) for item in figures),
                 '<p class="note">Each schedule has its own folder here: <code>pipesim report FOLDER/SCHEDULE</code> '
                 "writes its full report.</p>"]
    heading = title or f"pipesim: {', '.join(names)} side by side, p={runs[0]['num_stages']}, " \
                       f"m={runs[0]['num_microbatches']}"
    if first and not title:
        heading += f" — {first['profile']['name']}"
    return page(heading, sections, version=version)


def _seconds(value: Any) -> str:
    """A breakdown cell: seconds to 3 decimals, blank where the search did not split the step."""
    try:
        return f"{float(value):.3f}"
    except (TypeError, ValueError):
        return ""


# A search's candidates as the report shows them: (column, header, how a value is written).
_SEARCH_COLUMNS: tuple[tuple[str, str, Any], ...] = (
    ("tp", "TP", str), ("cp", "CP", str), ("pp", "PP", str), ("dp", "DP", str), ("ep", "EP", str),
    ("microbatch_size", "b", str), ("num_microbatches", "m", str), ("schedule", "schedule", str),
    ("stages_per_rank", "V", str), ("sequence_parallel", "SP", str), ("recompute", "recompute", str),
    ("zero", "ZeRO", str), ("tokens_per_s", "tokens/s", lambda v: f"{v:,.0f}"),
    ("mfu", "MFU", lambda v: f"{v:.1%}"), ("iteration_time_s", "iteration time", lambda v: f"{v * 1e3:,.1f} ms"),
    ("peak_memory_bytes", "peak memory", _bytes), ("partition", "layers per stage", str),
)


def search_html(frame: Any, figures: Sequence[Figure], *, version: str, title: str | None = None,
                budget: float | None = None, top: int = 10) -> str:
    """The report of ``pipesim search --out`` from its candidates.csv: how many were dropped,
    simulated and fit, the fastest that fit and those that do not, why candidates were dropped,
    and the figures."""
    simulated = frame[frame["status"] == "simulated"]
    fitting = simulated[simulated["fits"]]
    pruned = frame[frame["status"] == "pruned"]
    by_memory = int((pruned["peak_memory_bytes"] > 0).sum())
    summary = [("rows", len(frame)), ("pruned by a memory bound", by_memory),
               ("pruned by a step-time bound", len(pruned) - by_memory),
               ("could not be formed or run", int((frame["status"] == "dropped").sum())),
               ("simulated", len(simulated)), ("fit", len(fitting)),
               ("memory budget per GPU", _bytes(budget) if budget is not None else "not recorded (report --memory)")]
    sections = ["<h2>Summary</h2>", table(["quantity", "value"], summary, text_columns=2)]

    parts = [(f"step_{part}_s", part.replace("_", " "), _seconds) for part in
             ("compute", "bubble", "tp_comm", "dp_comm", "pp_comm", "optimizer") if f"step_{part}_s" in frame.columns]
    columns = [column for column in _SEARCH_COLUMNS if column[0] in frame.columns] + parts

    def best(rows: Any) -> str:
        rows = rows.sort_values("tokens_per_s", ascending=False, kind="stable").head(top)
        cells = [[show(record[c]) for c, _, show in columns] for record in rows.to_dict(orient="records")]
        return f'<div class="wide">{table([h for _, h, _ in columns], cells)}</div>'

    if len(fitting):
        sections += [f"<h2>Fastest that fit ({min(top, len(fitting))} of {len(fitting)})</h2>", best(fitting)]
    else:
        sections.append('<p class="note">No simulated configuration fits the budget.</p>')
    over = simulated[~simulated["fits"]]
    if len(over):
        sections += [f"<h2>Fastest over the budget ({min(top, len(over))} of {len(over)})</h2>", best(over)]
    dropped = frame[frame["status"] != "simulated"]
    if len(dropped):
        # One row per kind of reason: its numbers (bounds, thresholds) as "…".
        counts = dropped["reason"].str.replace(r"\d[\d.,]*(?:st|nd|rd|th)?", "…", regex=True) \
            .value_counts(sort=True).head(top)
        sections += ["<h2>Why candidates were pruned or dropped</h2>",
                     table(["reason", "candidates"], list(counts.items()), text_columns=1)]
    sections += ["<h2>Figures</h2>", *(figure(item) for item in figures)]
    heading = title or f"pipesim search: {len(frame)} candidates, {len(fitting)} fit"
    return page(heading, sections, version=version)


def sweep_html(frame: Any, figures: Sequence[Figure], *, version: str, title: str | None = None,
               front: Any = None, max_rows: int = 25, run: dict[str, Any] | None = None) -> str:
    """The report of a sweep table: what produced it (``run``, from the table's metadata), what it
    covers, the best point per schedule, the Pareto front, the errors, and the figures."""
    ok = frame[frame["error"].fillna("") == ""] if "error" in frame.columns else frame
    summary: list[tuple[str, Any]] = [("points", len(frame)), ("with errors", len(frame) - len(ok))]
    for column in ("schedule", "engine", "profile"):
        if column in frame.columns:
            summary.append((column, ", ".join(sorted(map(str, set(frame[column].tolist()) - {""})))))
    for column in ("num_stages", "num_microbatches", "num_minibatches"):
        if column in frame.columns and len(frame):
            summary.append((column, f"{frame[column].min()} .. {frame[column].max()}"))
    columns = [c for c in ("point", "schedule", "num_stages", "num_microbatches", "num_minibatches",
                           "bandwidth_bytes_per_s", "recompute", "throughput_samples_per_s", "iteration_time_s",
                           "bubble_fraction", "peak_memory_bytes", "weight_versions_max", "forward_delay_steps_max")
               if c in frame.columns]
    sections = [*(['<h2 id="run">Run</h2>', table(["input", "value"], describe(run), text_columns=2)] if run else []),
                "<h2>Summary</h2>", table(["quantity", "value"], summary, text_columns=2)]
    if len(ok) and "throughput_samples_per_s" in ok.columns and "schedule" in ok.columns:
        best = ok.sort_values(["throughput_samples_per_s", "point"], ascending=[False, True], kind="stable")
        best = best.drop_duplicates("schedule").sort_values("throughput_samples_per_s", ascending=False, kind="stable")
        sections += ["<h2>Best throughput per schedule</h2>", _frame_table(best, columns)]
    if front is not None and len(front):
        sections += [f"<h2>Pareto front: throughput against peak memory ({len(front)} points)</h2>",
                     _frame_table(front.head(max_rows), columns)]
    if len(frame) > len(ok):
        errors = frame[frame["error"].fillna("") != ""]
        counts = errors["error"].value_counts(sort=True).head(10)
        sections += ["<h2>Errors</h2>", table(["error", "points"], list(counts.items()), text_columns=1)]
    sections += ["<h2>Figures</h2>", *(figure(item) for item in figures)]
    if not figures:
        sections.append('<p class="note">No figures: no successful row of the table has a finite bubble '
                        "fraction, throughput and peak memory.</p>")
    return page(title or f"pipesim sweep: {len(frame)} points", sections, version=version)


# Sweep columns as a reader wants them: (header, how a value is written).
_COLUMN_LOOKS: dict[str, tuple[str, Any]] = {
    "num_stages": ("p", str), "num_microbatches": ("m", str), "num_minibatches": ("K", str),
    "bandwidth_bytes_per_s": ("bandwidth", lambda v: "free" if not math.isfinite(v) else f"{v / 1e9:.4g} GB/s"),
    "latency_s": ("latency", lambda v: f"{v * 1e6:.4g} us"),
    "throughput_samples_per_s": ("throughput", lambda v: f"{v:,.1f} samples/s"),
    "iteration_time_s": ("iteration time", lambda v: f"{v * 1e3:,.3f} ms"),
    "bubble_fraction": ("bubble", lambda v: f"{v:.1%}"),
    "weight_versions_max": ("versions", str), "forward_delay_steps_max": ("fwd delay", str),
}


def _show(column: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if column in _COLUMN_LOOKS:
        return str(_COLUMN_LOOKS[column][1](value))
    if column.endswith("_bytes"):
        return _bytes(float(value))
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _frame_table(frame: Any, columns: Sequence[str]) -> str:
    """Rows of a sweep table with readable headers and units; scrolls sideways rather than overflow."""
    headers = [_COLUMN_LOOKS.get(c, (c.removesuffix("_bytes").replace("_", " "), None))[0] for c in columns]
    rows = [[_show(c, record[c]) for c in columns] for record in frame[list(columns)].to_dict(orient="records")]
    return f'<div class="wide">{table(headers, rows, text_columns=2)}</div>'
