"""The ``pipesim`` command: subcommands wired to the public API; bad input is one line and exit 2."""

from __future__ import annotations

import inspect
import sys
import textwrap
from typing import Any

import click

from pipesim.errors import PipesimError, ScheduleError


class PipesimGroup(click.Group):
    """A click group whose usage errors and PipesimErrors print one line and exit 2."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Each command with its whole first sentence, wrapped (click cuts it at about 45 characters)."""
        rows = [(name, command.get_short_help_str(limit=10_000)) for name in self.list_commands(ctx)
                if (command := self.get_command(ctx, name)) is not None and not command.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def main(self, *args: Any, **kwargs: Any) -> Any:  # noqa: D102 - click's entry point
        kwargs["standalone_mode"] = False
        try:
            return super().main(*args, **kwargs)
        except click.exceptions.NoArgsIsHelpError as exc:
            click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
            sys.exit(0)
        except click.UsageError as exc:
            command = exc.ctx.command_path if exc.ctx else "pipesim"
            click.echo(f"{command}: error: {exc.format_message()}", err=True)
            sys.exit(2)
        except click.exceptions.Abort:
            click.echo("pipesim: aborted", err=True)
            sys.exit(130)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except ScheduleError as exc:
            click.echo(f"pipesim: error: {exc.reason}", err=True)
            if exc.grid:
                click.echo(exc.grid, err=True)
            sys.exit(2)
        except PipesimError as exc:
            click.echo(f"pipesim: error: {exc}", err=True)
            sys.exit(2)


@click.group(cls=PipesimGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pipesim")
def cli() -> None:
    """Simulate and analyze pipeline-parallel training schedules.

    Inputs: a measured per-layer profile (our JSON or PipeDream's graph.txt), link bandwidth
    and latency, and a schedule. Outputs: iteration time, bubbles, per-stage memory and weight
    staleness, as tables, JSON, traces and plots.
    """


def _register() -> None:
    from pipesim.schedule.registry import SCHEDULES

    # \b keeps click from rewrapping the list, which would break names such as looped-bfs at the hyphen.
    names = textwrap.fill(f"Schedules: {', '.join(SCHEDULES)}.", width=76, break_on_hyphens=False)
    cli.help = f"{inspect.cleandoc(cli.help or '')}\n\n\b\n{names}"
    from pipesim.cli.check import check_command
    from pipesim.cli.harness import linkbench_command, profile_command, run_command
    from pipesim.cli.model import model_command
    from pipesim.cli.plan import plan_command
    from pipesim.cli.plot import plot_group
    from pipesim.cli.report import report_command
    from pipesim.cli.schedule import schedule_command
    from pipesim.cli.search import search_command
    from pipesim.cli.simulate import simulate_command
    from pipesim.cli.sweep import sweep_command
    from pipesim.cli.validate import validate_command

    cli.add_command(check_command)
    cli.add_command(model_command)
    cli.add_command(plan_command)
    cli.add_command(schedule_command)
    cli.add_command(search_command)
    cli.add_command(simulate_command)
    cli.add_command(sweep_command)
    cli.add_command(plot_group)
    cli.add_command(report_command)
    for command in (profile_command, linkbench_command, run_command, validate_command):
        cli.add_command(command)


_register()


def main(argv: list[str] | None = None) -> None:
    """Run the CLI (the console script ``pipesim`` and ``python -m pipesim``)."""
    cli.main(args=argv, prog_name="pipesim")
