"""``pipesim schedule``: print a schedule's per-rank order as text, JSON or PyTorch CSV."""

from __future__ import annotations

import json

import click

from pipesim.schedule.csv_format import to_csv
from pipesim.schedule.registry import SCHEDULES, build_schedule


@click.command("schedule")
@click.option("--schedule", "name", required=True, help=f"One of: {', '.join(SCHEDULES)}.")
@click.option("--stages", "num_stages", type=int, required=True, help="Pipeline stages P.")
@click.option("--microbatches", "num_microbatches", type=int, required=True, help="Microbatches per minibatch M.")
@click.option("--minibatches", "num_minibatches", type=int, default=None,
              help="Minibatches K (default 1 for gpipe/1f1b, 4 for asynchronous schedules).")
@click.option("--format", "output_format", type=click.Choice(["text", "json", "csv"]), default="text",
              show_default=True, help="text: one row per rank; csv: PyTorch's pipelining format (no U cells).")
def schedule_command(name: str, num_stages: int, num_microbatches: int, num_minibatches: int | None,
                     output_format: str) -> None:
    """Print the order of ops on every rank, in the "1F0" text form."""
    schedule = build_schedule(name, num_stages, num_microbatches, num_minibatches=num_minibatches)
    if output_format == "json":
        data = schedule.to_dict()
        click.echo(json.dumps({key: data[key] for key in
                               ("schedule", "num_stages", "num_microbatches", "num_minibatches", "ranks")}))
    elif output_format == "csv":
        click.echo(to_csv(schedule), nl=False)
    else:
        for rank, cells in enumerate(schedule.to_text()):
            click.echo(f"rank {rank}: {' '.join(cells)}")
