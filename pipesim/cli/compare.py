"""Schedules side by side in ``simulate``: names and torch aliases, one run per schedule, one table and report."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from pipesim.errors import ConfigError, PipesimError
from pipesim.export.report import comparison_rows
from pipesim.schedule.registry import SCHEDULES, unknown_schedule_rule
from pipesim.simulation import Result

# torch.distributed.pipelining's class names (with and without their "Schedule" prefix).
TORCH_ALIASES: dict[str, str] = {
    "gpipe": "gpipe", "schedulegpipe": "gpipe",
    "1f1b": "1f1b", "schedule1f1b": "1f1b",
    "interleaved1f1b": "interleaved-1f1b", "scheduleinterleaved1f1b": "interleaved-1f1b",
    "loopedbfs": "looped-bfs", "scheduleloopedbfs": "looped-bfs",
    "interleavedzerobubble": "interleaved-zb", "scheduleinterleavedzerobubble": "interleaved-zb",
    "zbvzerobubble": "zbv", "schedulezbvzerobubble": "zbv",
    "dualpipev": "dualpipev", "scheduledualpipev": "dualpipev",
}
# Schedules that put several stages on a rank; compared at the given V, or 2 when V is 1.
MULTI_STAGE = frozenset({"interleaved-1f1b", "looped-bfs", "interleaved-zb", "zbv", "dualpipev"})


def schedule_names(text: str) -> tuple[list[str], bool]:
    """``1f1b,ZBVZeroBubble`` or ``all`` to registry keys, and whether it was ``all``.

    Raises:
        ConfigError: an unknown name (the message lists the registry) or a repeated one.
    """
    if text.strip().lower() == "all":
        return list(SCHEDULES), True
    names = []
    for item in text.split(","):
        key = item.strip().lower()
        name = key if key in SCHEDULES else TORCH_ALIASES.get(key)
        if name is None:
            raise ConfigError("schedule", item, unknown_schedule_rule(item.strip()) + ", all, or torch's class names "
                              "(e.g. Schedule1F1B, ZBVZeroBubble)")
        if name in names:
            raise ConfigError("schedule", item, "is listed twice")
        names.append(name)
    return names, False


def stages_per_rank_for(name: str, given: int) -> int:
    """V for ``name`` in a comparison: 1 for single-stage schedules, at least 2 for the others."""
    return max(given, 2) if name in MULTI_STAGE else 1


def run_schedules(names: list[str], is_all: bool, given_per_rank: int,
                  run: Callable[[str, int], Result]) -> tuple[list[Result], list[dict[str, str]]]:
    """Run every schedule; with ``all``, one that does not apply to the case is skipped with its reason.

    Raises:
        PipesimError: a named schedule cannot run (with ``all``: none could).
    """
    results, skipped = [], []
    for name in names:
        try:
            results.append(run(name, stages_per_rank_for(name, given_per_rank)))
        except PipesimError as error:
            if not is_all:
                raise
            skipped.append({"schedule": name, "reason": str(error).splitlines()[0]})
    if not results:
        raise ConfigError("schedule", "all", f"no schedule applies: {skipped[0]['reason']}")
    return results, skipped


def print_comparison(runs: list[dict[str, Any]], skipped: list[dict[str, str]]) -> None:
    """One table of ``comparison_rows``, then the schedules skipped and why."""
    console = Console(highlight=False, width=None if Console().is_terminal else 160)
    table = Table(show_edge=False)
    headers, rows = comparison_rows(runs)
    for header in headers:
        table.add_column(header, justify="right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for item in skipped:
        console.print(f"skipped {item['schedule']}: {item['reason']}")


def comparison_files(results: list[Result]) -> list[str]:
    """The files ``write_comparison`` writes, relative to its folder."""
    from pipesim.export.report import REPORT_FILES

    return [*(f"{result.plan.schedule}/{name}" for result in results for name in REPORT_FILES),
            "comparison.json", "timelines.png"]


def write_comparison(results: list[Result], runs: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """``comparison.json`` (the runs), each run's report folder under its schedule's name (its
    metrics.json the run's object, memory verdict included), and
    ``timelines.png`` with every timeline on one time axis."""
    from pipesim.export.report import write_report
    from pipesim.plots import save_figure, use_headless_backend
    from pipesim.plots.compare import stacked_timelines
    from pipesim.spec.files import dumps, write_text_atomic

    use_headless_backend()
    written = []
    for result, run in zip(results, runs, strict=True):
        written += write_report(result, out_dir / result.plan.schedule, metrics=run)
    write_text_atomic(out_dir / "comparison.json", dumps({"runs": runs}))
    written.append(out_dir / "comparison.json")
    written.append(save_figure(stacked_timelines([result.trace for result in results]), out_dir / "timelines.png"))
    return written
