"""``pipesim sweep``: simulate every point of a YAML spec, here or on Dask, into a Parquet or CSV table."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from pipesim.cli.outputs import ProgressBar, out_file_option
from pipesim.errors import interrupted
from pipesim.sweep.runner import WORKER_TIMEOUT_S, run_sweep
from pipesim.sweep.store import SweepFailedError


@click.command("sweep")
@click.argument("spec_path", metavar="SPEC.yaml", type=str)
@click.option("--out", "out", type=str, required=True, callback=out_file_option((".parquet", ".pq", ".csv")),
              help="Results table: FILE.parquet or FILE.csv (one sweep at a time writes it: a second is refused).")
@click.option("--workers", type=int, default=None,
              help="Processes of the embedded Dask cluster, started only where it saves more than it costs "
              "(default: CPUs).")
@click.option("--scheduler", type=str, default=None,
              help="Address of an existing Dask scheduler, tcp://HOST:PORT (it must answer within 10 s).")
@click.option("--resume", is_flag=True,
              help="Continue an interrupted sweep from OUT.parts/, skipping finished points (a damaged chunk is named "
                   "and its points run again).")
@click.option("--batch-size", type=int, default=None, help="Points per batch (default: sized by predicted work, 4 to 24 batches per worker).")
@click.option("--progress/--no-progress", default=None,
              help="Show progress on stderr: a bar on a terminal, a line at every tenth elsewhere (default: when "
                   "stderr is a terminal).")
@click.option("--worker-timeout", "worker_timeout_s", type=float, default=WORKER_TIMEOUT_S, show_default=True,
              help="Seconds the cluster may have no worker before the sweep stops (finished points are kept).")
def sweep_command(spec_path: str, out: str, workers: int | None, scheduler: str | None, resume: bool,
                  batch_size: int | None, progress: bool | None, worker_timeout_s: float) -> None:
    """Simulate every point of SPEC.yaml (the product of its lists, filtered by where:) into one table.

    An embedded Dask cluster starts in the background where it saves more than it costs (about
    2 s); points run in this process until it is ready, the rest on it in batches by predicted
    work, heaviest first. --scheduler sends every point to that cluster. Rows stream to
    OUT.parts/ as batches finish; an interrupted sweep continues with --resume.
    """
    started = time.perf_counter()
    if workers is not None and scheduler is not None:
        raise click.UsageError("give either --workers (embedded cluster) or --scheduler, not both")
    bar = ProgressBar(sys.stderr.isatty() if progress is None else progress, label="sweep", unit="points",
                      started=started)
    try:
        summary = run_sweep(Path(spec_path), Path(out), workers=workers, scheduler=scheduler, resume=resume,
                            batch_size=batch_size, progress=bar, worker_timeout_s=worker_timeout_s,
                            warn=lambda line: click.echo(f"pipesim: warning: {line}", err=True))
    except SweepFailedError as error:  # the cluster or the disk failed, not the input: exit 1
        bar.stop()
        click.echo(f"pipesim: error: {error}", err=True)
        sys.exit(1)
    except BaseException as error:  # noqa: BLE001 - Ctrl-C may surface as another error (errors.interrupted)
        if not interrupted(error):
            raise
        bar.stop()
        click.echo(f"pipesim: interrupted; finished points are kept in {out}.parts (rerun with --resume)", err=True)
        sys.exit(130)
    finally:
        bar.stop()
    errors = f", {summary.num_errors} with errors (see the error column)" if summary.num_errors else ""
    rate = f", {summary.points_per_s:.1f} points/s {summary.where}" if summary.num_run else ""
    click.echo(f"wrote {summary.out}: {summary.num_points} points ({summary.num_run} simulated, "
               f"{summary.num_resumed} resumed{errors}) in {summary.wall_s:.1f} s{rate}")
