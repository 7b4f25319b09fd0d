"""``pipesim schedule``: print a schedule's per-rank order as text, JSON or PyTorch CSV."""

from __future__ import annotations

import json

import click

from pipesim.cli.options import resolve_stages
from pipesim.schedule.csv_format import to_csv
from pipesim.schedule.registry import SCHEDULES, build_schedule, default_num_minibatches
from pipesim.simulation import DEFAULT_MAX_OPS, check_num_ops, count_ops


@click.command("schedule")
@click.option("--schedule", "name", required=True, help=f"One of: {', '.join(SCHEDULES)}.")
@click.option("--stages", "num_stages", type=int, default=None,
              help="Pipeline stages P, one per rank (or give --ranks).")
@click.option("--ranks", "num_ranks", type=int, default=None, help="Ranks (devices) R.")
@click.option("--stages-per-rank", "stages_per_rank", type=int, default=None,
              help="Model stages V on each rank, R x V in all (interleaved and V schedules); default 1.")
@click.option("--microbatches", "num_microbatches", type=int, required=True, help="Microbatches per minibatch M.")
@click.option("--minibatches", "num_minibatches", type=int, default=None,
              help="Minibatches K (default 1 for flush schedules, 4 for asynchronous schedules).")
@click.option("--format", "output_format", type=click.Choice(["text", "json", "csv"]), default="text",
              show_default=True, help="text: one row per rank; csv: PyTorch's pipelining format (no U cells).")
@click.option("--max-ops", type=click.IntRange(min=1), default=DEFAULT_MAX_OPS, show_default=True,
              help="Refuse schedules estimated to have more ops than this (as simulate does).")
def schedule_command(name: str, num_stages: int | None, num_ranks: int | None, stages_per_rank: int | None,
                     num_microbatches: int, num_minibatches: int | None, output_format: str, max_ops: int) -> None:
    """Print the order of ops on every rank, in the "1F0" text form (global stage indices)."""
    total, per_rank = resolve_stages(num_stages, num_ranks, stages_per_rank)
    check_num_ops(count_ops(name, total, num_microbatches, num_minibatches if num_minibatches is not None
                            else default_num_minibatches(name)), max_ops)
    schedule = build_schedule(name, total, num_microbatches, num_minibatches=num_minibatches,
                              num_ranks=total // per_rank)
    if output_format == "json":
        data = schedule.to_dict()
        keys = ["schedule", "num_stages", "num_microbatches", "num_minibatches", "ranks"]
        if schedule.num_ranks != schedule.num_stages:
            keys[2:2] = ["num_ranks", "stage_to_rank"]
            data["num_ranks"] = schedule.num_ranks
        click.echo(json.dumps({key: data[key] for key in keys}))
    elif output_format == "csv":
        click.echo(to_csv(schedule), nl=False)
    else:
        for rank, cells in enumerate(schedule.to_text()):
            click.echo(f"rank {rank}: {' '.join(cells)}")
