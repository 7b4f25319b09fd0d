"""Where a sweep's wall time goes on W workers: the serial part, phase by phase (``bench_sweep.py --scaling``).

Runs ``run_sweep`` on the benchmark spec (or every N-th stage count of it, ``--every``) once per
worker count, the counts alternated (2 14 14 2 ...) so that drift of a shared machine's speed
falls on both, after numba's cache is filled in this process (its first compile is not timed).
Each run's phases come from ``SweepSummary.phases`` (this process) and its batches' start and end
on the workers (``SweepSummary.batches``):

- expand: spec read, points expanded and ordered, result store opened;
- cluster: the embedded cluster's start to its workers being warm (beside ``here``);
- here: points simulated in this process while the cluster started;
- first batch: from the first batch's submission to the median worker's first batch starting;
- busy / W: the workers' batch time summed, over W: the part that shrinks with workers;
- CPU / busy: the workers' CPU seconds on their batches over that time (below 1: other processes
  took their cores);
- tail: from the first worker running out of batches to the last batch's end (imbalance);
- merge: the table merged and written (``close``, the cluster's shutdown, runs beside it;
  ``close wait``: what is left of it after the merge).

The serial part is the wall minus ``busy / W``; fitting ``T = S + P / W`` to two counts gives
the same from walls alone. Every run's table must equal the first's (pandas ``equals``).

With a time budget (``--budget``, for a host lent for a few minutes), the counts run in the order
given and a run whose wall, predicted by that fit through the runs so far, would end past the
budget is skipped and named.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipesim.sweep import Resolved, SweepSummary, load_spec, parse_spec, read_table, run_sweep  # noqa: E402
from pipesim.sweep.batches import point_cost  # noqa: E402

SPEC = ROOT / "benchmarks" / "sweep_10k.yaml"


def subset(every: int) -> Any:
    """The benchmark spec, keeping the stage counts divisible by ``every`` (all for 1)."""
    spec = load_spec(SPEC)
    if every <= 1:
        return spec
    fields = spec.model_dump(by_alias=True, exclude_defaults=True)
    return parse_spec({**fields, "where": f"({spec.where}) and stages % {every} == 0"})


def fill_numba_cache(spec: Any) -> float:
    """Compile (or load) every kernel the sweep's points use, in this process; seconds taken."""
    from pipesim.sweep import PointRunner
    from pipesim.sweep.tasks import warm_points

    started = time.perf_counter()
    resolved = Resolved(spec)
    PointRunner(resolved, "always").run_batch(warm_points(resolved.points(), point_cost))
    return time.perf_counter() - started


def phases(summary: SweepSummary, workers: int) -> dict[str, float]:
    """The phases of one run (module docstring), in seconds."""
    row = {"wall": summary.wall_s, "expand": summary.phases.get("expand", 0.0),
           "cluster": summary.phases.get("cluster", 0.0), "here": summary.phases.get("here", 0.0),
           "merge": summary.phases.get("merge", 0.0), "close": summary.phases.get("close", 0.0),
           "close wait": summary.phases.get("close wait", 0.0)}
    batches = summary.batches
    if not batches:
        return {**row, "first batch": 0.0, "busy / W": 0.0, "CPU / busy": 0.0, "tail": 0.0, "serial": summary.wall_s,
                "points here": summary.num_here, "batches": 0}
    start = summary.started_epoch_s
    submitted = row["expand"] + row["here"]
    by_worker: dict[str, list[Any]] = {}
    for batch in batches:
        by_worker.setdefault(batch.worker, []).append(batch)
    firsts = [min(b.started_s for b in done) - start for done in by_worker.values()]
    lasts = [max(b.finished_s for b in done) - start for done in by_worker.values()]
    busy = sum(b.finished_s - b.started_s for b in batches)
    count = max(workers, len(by_worker))
    return {**row, "first batch": max(0.0, statistics.median(firsts) - submitted), "busy / W": busy / count,
            "CPU / busy": sum(b.cpu_s for b in batches) / busy if busy > 0 else 0.0,
            "tail": max(lasts) - min(lasts) if len(lasts) == count else max(lasts) - submitted,
            "serial": summary.wall_s - busy / count, "points here": summary.num_here, "batches": len(batches)}


def predicted_wall(rows: list[dict[str, Any]], count: int) -> float | None:
    """The wall of a run on ``count`` workers by ``T = S + P / W`` through the lowest and highest
    counts run so far (None before two counts, or where that fit has no parallel part)."""
    counts = sorted({row["workers"] for row in rows})
    if len(counts) < 2:
        return None
    low, high = counts[0], counts[-1]
    wall = {c: min(row["wall"] for row in rows if row["workers"] == c) for c in (low, high)}
    work = (wall[low] - wall[high]) / (1 / low - 1 / high)
    return None if work <= 0 else wall[high] - work / high + work / count


def measure(counts: list[int], every: int, repeats: int,
            deadline: float | None = None) -> tuple[list[dict[str, Any]], bool, Any, list[int]]:
    """Runs at each worker count, alternated; the rows, whether every table equals the first, the
    spec, and the counts skipped because they would have ended past ``deadline`` (perf_counter)."""
    spec = subset(every)
    rows: list[dict[str, Any]] = []
    skipped: list[int] = []
    first = None
    same = True
    order = [count for turn in range(repeats) for count in (counts if turn % 2 == 0 else counts[::-1])]
    with tempfile.TemporaryDirectory() as folder:
        for index, count in enumerate(order):
            guess = predicted_wall(rows, count)
            if deadline is not None and guess is not None and time.perf_counter() + guess > deadline:
                print(f"  {count} workers: skipped (about {guess:.0f} s, past the budget)", flush=True)
                skipped.append(count)
                continue
            out = Path(folder) / f"run-{index}.parquet"
            summary = run_sweep(spec, out, workers=count)
            frame = read_table(out)
            if first is None:
                first = frame
            else:
                same = same and bool(frame.equals(first))
            rows.append({"workers": count, **phases(summary, count)})
            print(f"  {count} workers: {summary.wall_s:.1f} s ({summary.where}, {summary.num_batches} batches)",
                  flush=True)
    return rows, same, spec, skipped


COLUMNS = ("wall", "expand", "cluster", "here", "first batch", "busy / W", "CPU / busy", "tail", "merge", "close",
           "close wait", "serial")


def table(rows: list[dict[str, Any]]) -> list[str]:
    """Median of each phase per worker count, as a Markdown table."""
    counts = sorted({row["workers"] for row in rows})
    lines = ["| workers | runs | " + " | ".join(name if name == "CPU / busy" else f"{name} s" for name in COLUMNS) +
             " | points here | batches |",
             "|---|---|" + "---|" * (len(COLUMNS) + 2)]
    for count in counts:
        mine = [row for row in rows if row["workers"] == count]
        cells = [f"{statistics.median(row[name] for row in mine):.2f}" for name in COLUMNS]
        lines.append(f"| {count} | {len(mine)} | " + " | ".join(cells) +
                     f" | {statistics.median(row['points here'] for row in mine):.0f} | "
                     f"{statistics.median(row['batches'] for row in mine):.0f} |")
    return lines


def fitted(rows: list[dict[str, Any]], spec: Any) -> list[str]:
    """``T = S + P / W`` through the median walls of the lowest and highest counts, and what it
    predicts for the whole 10,080-point spec (``P`` scaled by the predicted cost, ``S`` kept)."""
    counts = sorted({row["workers"] for row in rows})
    if len(counts) < 2:
        return []
    low, high = counts[0], counts[-1]
    wall = {count: statistics.median(row["wall"] for row in rows if row["workers"] == count) for count in (low, high)}
    work = (wall[low] - wall[high]) / (1 / low - 1 / high)
    serial = wall[high] - work / high
    if work <= 0:
        return [f"No fit: {high} workers took {wall[high]:.1f} s, not less than {low} workers' {wall[low]:.1f} s "
                "(the workers did not get cores of their own)."]
    scale = sum(map(point_cost, Resolved(load_spec(SPEC)).points())) / sum(map(point_cost, Resolved(spec).points()))
    full = {count: serial + work * scale / count for count in (low, high)}
    return [f"Fit T = S + P/W through {low} and {high} workers: S = {serial:.1f} s, P = {work:.1f} s; "
            f"{wall[low] / wall[high]:.2f}x measured from {low} to {high} workers. For the whole spec "
            f"(predicted cost {scale:.2f}x this one's, S kept): {full[low]:.1f} s and {full[high]:.1f} s, "
            f"{full[low] / full[high]:.2f}x."]


def report(counts: list[int], every: int, repeats: int,
           budget_s: float | None = None) -> tuple[list[str], dict[str, Any]]:
    """Fill numba's cache, measure (within ``budget_s`` seconds from now, when given), and the
    lines for RESULTS.md with the same as data (every run's phases, for a JSON file)."""
    deadline = None if budget_s is None else time.perf_counter() + budget_s
    spec = subset(every)
    print(f"filling numba's cache ({len(Resolved(spec).points())} points in the spec)", flush=True)
    compile_s = fill_numba_cache(spec)
    print(f"  {compile_s:.1f} s", flush=True)
    rows, same, spec, skipped = measure(counts, every, repeats, deadline)
    points = len(Resolved(spec).points())
    lines = [f"{points:,} points (`benchmarks/sweep_10k.yaml`{f', stages divisible by {every}' if every > 1 else ''}), "
             f"worker counts {', '.join(map(str, counts))} alternated, {repeats} runs each; numba's cache filled "
             f"first ({compile_s:.1f} s). Medians, seconds of wall time (module docstring of "
             "`benchmarks/sweep_scaling.py`):", "", *table(rows), "", *fitted(rows, spec),
             f"Every run's table equal to the first's (pandas `equals`): {'yes' if same else 'NO'}."]
    if skipped:
        lines.append(f"Skipped to stay within the {budget_s:g} s budget: {', '.join(map(str, skipped))} workers.")
    walls = {count: statistics.median(row["wall"] for row in rows if row["workers"] == count)
             for count in sorted({row["workers"] for row in rows})}
    data = {"points": points, "every": every, "repeats": repeats, "counts": counts, "compile_s": compile_s,
            "budget_s": budget_s, "skipped": skipped, "same_tables": same, "median_wall_s": walls,
            "speedups": {f"{high}/{low}": walls[low] / walls[high] for low in walls for high in walls if high > low},
            "runs": rows, "fit": fitted(rows, spec)}
    return lines, data
