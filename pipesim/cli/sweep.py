"""``pipesim sweep``: simulate every point of a YAML spec, here or on Dask, into a Parquet or CSV table."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click

from pipesim.cli.outputs import out_file_option
from pipesim.sweep.runner import WORKER_TIMEOUT_S, run_sweep
from pipesim.sweep.store import SweepFailedError


class _ProgressBar:
    """A rich progress bar on stderr, saying where the points run (``here`` or ``on Dask``):
    ``sweep here ━━━ 40/100 points 12.5 points/s elapsed 0:00:03 · 0:00:05 left``.

    The rate is the points simulated now over the seconds since the command started (reading the
    spec, starting a cluster and writing chunks included), so that it matches the run's wall time.
    """

    def __init__(self, enabled: bool, started: float) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        from rich.progress import TimeRemainingColumn

        self.progress = Progress(
            TextColumn("sweep {task.fields[where]}"), BarColumn(bar_width=None), MofNCompleteColumn(),
            TextColumn("points"), TextColumn("{task.fields[rate]}"), TextColumn("elapsed"),
            TimeElapsedColumn(), TextColumn("·"), TimeRemainingColumn(), TextColumn("left"),
            console=Console(stderr=True), disable=not enabled,
        )
        self.task: Any = None
        self.start_done = 0
        self.started = started

    def __call__(self, done: int, total: int, where: str) -> None:
        if self.task is None:
            self.progress.start()
            self.start_done = done
            self.task = self.progress.add_task("sweep", total=total, completed=done, rate="", where=where)
            return
        elapsed = time.perf_counter() - self.started
        rate = (done - self.start_done) / elapsed if elapsed > 0 else 0.0
        self.progress.update(self.task, completed=done, rate=f"{rate:.1f} points/s", where=where)

    def stop(self) -> None:
        self.progress.stop()


@click.command("sweep")
@click.argument("spec_path", metavar="SPEC.yaml", type=str)
@click.option("--out", "out", type=str, required=True, callback=out_file_option((".parquet", ".pq", ".csv")),
              help="Results table: FILE.parquet or FILE.csv.")
@click.option("--workers", type=int, default=None,
              help="Processes of the embedded Dask cluster, started only where it saves more than it costs "
              "(default: CPUs).")
@click.option("--scheduler", type=str, default=None, help="Address of an existing Dask scheduler, tcp://HOST:PORT.")
@click.option("--resume", is_flag=True, help="Continue an interrupted sweep from OUT.parts/, skipping finished points.")
@click.option("--batch-size", type=int, default=None, help="Points per batch (default: about 32 batches per worker).")
@click.option("--progress/--no-progress", default=None, help="Show a progress bar (default: when stderr is a terminal).")
@click.option("--worker-timeout", "worker_timeout_s", type=float, default=WORKER_TIMEOUT_S, show_default=True,
              help="Seconds the cluster may have no worker before the sweep stops (finished points are kept).")
def sweep_command(spec_path: str, out: str, workers: int | None, scheduler: str | None, resume: bool,
                  batch_size: int | None, progress: bool | None, worker_timeout_s: float) -> None:
    """Simulate every point of SPEC.yaml (the product of its lists, filtered by where:) into one table.

    Points run in this process while a cluster would cost more than it saves (about 2 s to start),
    the rest on an embedded Dask cluster, or all on --scheduler. Rows stream to OUT.parts/ as
    batches finish; an interrupted sweep continues with --resume.
    """
    started = time.perf_counter()
    if workers is not None and scheduler is not None:
        raise click.UsageError("give either --workers (embedded cluster) or --scheduler, not both")
    bar = _ProgressBar(sys.stderr.isatty() if progress is None else progress, started)
    try:
        summary = run_sweep(Path(spec_path), Path(out), workers=workers, scheduler=scheduler, resume=resume,
                            batch_size=batch_size, progress=bar, worker_timeout_s=worker_timeout_s)
    except KeyboardInterrupt:
        bar.stop()
        click.echo(f"pipesim: interrupted; finished points are kept in {out}.parts (rerun with --resume)", err=True)
        sys.exit(130)
    except SweepFailedError as error:  # the cluster or the disk failed, not the input: exit 1
        bar.stop()
        click.echo(f"pipesim: error: {error}", err=True)
        sys.exit(1)
    finally:
        bar.stop()
    errors = f", {summary.num_errors} with errors (see the error column)" if summary.num_errors else ""
    rate = f", {summary.points_per_s:.1f} points/s {summary.where}" if summary.num_run else ""
    click.echo(f"wrote {summary.out}: {summary.num_points} points ({summary.num_run} simulated, "
               f"{summary.num_resumed} resumed{errors}) in {summary.wall_s:.1f} s{rate}")
