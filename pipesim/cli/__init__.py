"""The ``pipesim`` command: subcommands wired to the public API; bad input is one line and exit 2."""

from __future__ import annotations

import atexit
import gc
import importlib
import inspect
import sys
import textwrap
from typing import Any

import click

from pipesim.errors import PipesimError, ScheduleError, WriteFailedError


class PipesimGroup(click.Group):
    """A click group whose usage errors and PipesimErrors print one line and exit 2, and whose
    subcommands (``COMMANDS``) are imported when first asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:  # noqa: D102 - click's API
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:  # noqa: D102
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, name = COMMANDS[cmd_name]
            self.add_command(getattr(importlib.import_module(module), name), cmd_name)
        return super().get_command(ctx, cmd_name)

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
        except WriteFailedError as exc:  # the disk, not the input: exit 1
            click.echo(f"pipesim: error: {exc}", err=True)
            sys.exit(1)
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


#: Each subcommand and where it lives: a command's module is imported only when it runs (or for
#: ``--help``), so ``pipesim simulate`` does not pay for the planner's, the sweep's or the harness's
#: imports.
COMMANDS: dict[str, tuple[str, str]] = {
    "check": ("pipesim.cli.check", "check_command"),
    "cluster": ("pipesim.cli.device", "cluster_command"),
    "device": ("pipesim.cli.device", "device_group"),
    "model": ("pipesim.cli.model", "model_command"),
    "plan": ("pipesim.cli.plan", "plan_command"),
    "schedule": ("pipesim.cli.schedule", "schedule_command"),
    "search": ("pipesim.cli.search", "search_command"),
    "simulate": ("pipesim.cli.simulate", "simulate_command"),
    "sweep": ("pipesim.cli.sweep", "sweep_command"),
    "plot": ("pipesim.cli.plot", "plot_group"),
    "report": ("pipesim.cli.report", "report_command"),
    "profile": ("pipesim.cli.harness", "profile_command"),
    "linkbench": ("pipesim.cli.harness", "linkbench_command"),
    "run": ("pipesim.cli.harness", "run_command"),
    "validate": ("pipesim.cli.validate", "validate_command"),
}


def _describe_schedules() -> None:
    from pipesim.schedule.registry import SCHEDULES

    # \b keeps click from rewrapping the list, which would break names such as looped-bfs at the hyphen.
    names = textwrap.fill(f"Schedules: {', '.join(SCHEDULES)}.", width=76, break_on_hyphens=False)
    cli.help = f"{inspect.cleandoc(cli.help or '')}\n\n\b\n{names}"


_describe_schedules()


def main(argv: list[str] | None = None) -> None:
    """Run the CLI (the console script ``pipesim`` and ``python -m pipesim``)."""
    # The process ends with the command: what is alive then needs no last garbage collection
    # (over numba's objects, where a run loaded its kernels, that collection takes ~0.1 s).
    atexit.unregister(gc.freeze)  # once, however often main runs in one process
    atexit.register(gc.freeze)
    cli.main(args=argv, prog_name="pipesim")
