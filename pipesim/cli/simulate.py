"""``pipesim simulate``: run one schedule on a profile and print or write the metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import click
from rich.console import Console
from rich.table import Table

from pipesim.cli.options import build_topology, parse_partition, parse_uniform
from pipesim.errors import ConfigError
from pipesim.schedule.registry import SCHEDULES
from pipesim.simulation import EngineName, Result, simulate, simulate_plan
from pipesim.spec.files import load_plan, load_profile, load_topology


@click.command("simulate")
@click.option("--profile", "profile_path", type=str, default=None,
              help="Profile file: pipesim JSON or PipeDream graph.txt (told apart by content).")
@click.option("--uniform", type=str, default=None,
              help="Synthetic profile: layers=L,forward_ms=F,backward_ms=B,activation_bytes=A,param_bytes=W.")
@click.option("--plan", "plan_path", type=str, default=None,
              help="A plan file (pipesim.plan/1, or the output of pipesim plan) instead of --stages ... --schedule.")
@click.option("--stages", "num_stages", type=int, default=None, help="Pipeline stages P (one device each).")
@click.option("--microbatches", "num_microbatches", type=int, default=None, help="Microbatches per minibatch M.")
@click.option("--schedule", "schedule", default=None, help=f"One of: {', '.join(SCHEDULES)}.")
@click.option("--minibatches", "num_minibatches", type=int, default=None,
              help="Minibatches K (default 1 for gpipe/1f1b, 4 for asynchronous schedules).")
@click.option("--partition", type=str, default=None,
              help="Layer ranges per stage, START:END,... (default: balance forward+backward time).")
@click.option("--bandwidth", type=str, default=None, help="Link bandwidth with a unit, e.g. 25Gbit/s or 300GB/s.")
@click.option("--latency", type=str, default=None, help="Link latency with a unit, e.g. 5us.")
@click.option("--topology", "topology_path", type=str, default=None, help="Topology JSON (instead of --bandwidth).")
@click.option("--recompute/--no-recompute", default=False, help="Activation recomputation.")
@click.option("--optimizer-state", "optimizer_state_multiplier", type=float, default=1.0, show_default=True,
              help="Optimizer state bytes per weight byte (SGD+momentum 1, Adam 2).")
@click.option("--jitter", type=float, default=0.0, show_default=True,
              help="Per-op duration noise (coefficient of variation); needs the des engine.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the jitter.")
@click.option("--engine", type=click.Choice(["des", "analytic", "auto"]), default="auto", show_default=True,
              help="des: SimPy events; analytic: the same timeline by a longest-path pass (no jitter); "
                   "auto: analytic where it applies.")
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as one JSON object.")
@click.option("--out", "out_dir", type=str, default=None,
              help="Write a report folder: metrics.json, trace.json, trace.perfetto.json, timeline.png.")
def simulate_command(
    profile_path: str | None, uniform: str | None, plan_path: str | None, num_stages: int | None,
    num_microbatches: int | None, schedule: str | None,
    num_minibatches: int | None, partition: str | None, bandwidth: str | None, latency: str | None,
    topology_path: str | None, recompute: bool, optimizer_state_multiplier: float, jitter: float, seed: int,
    engine: str, as_json: bool, out_dir: str | None,
) -> None:
    """Simulate SCHEDULE on a profile cut into P stages and report time, bubbles, memory and staleness."""
    if (profile_path is None) == (uniform is None):
        raise ConfigError("profile", profile_path or uniform, "give exactly one of --profile FILE or --uniform ...")
    if topology_path and (bandwidth or latency):
        raise ConfigError("topology", topology_path, "give either --topology or --bandwidth/--latency, not both")
    profile = load_profile(profile_path) if profile_path else parse_uniform(uniform or "")
    if plan_path is not None:
        _check_plan_flags(click.get_current_context())
        plan = load_plan(plan_path)
        needed = max(plan.device_of(s) + plan.replicas_of(s) for s in range(plan.num_stages))
        topology = load_topology(topology_path) if topology_path else build_topology(needed, bandwidth, latency)
        result = simulate_plan(profile, topology, plan, jitter=jitter, seed=seed,
                               engine=cast(EngineName, engine))  # click.Choice checked it
    else:
        for flag, value in (("--stages", num_stages), ("--microbatches", num_microbatches), ("--schedule", schedule)):
            if value is None:
                raise click.UsageError(f"Missing option '{flag}'.", click.get_current_context())
        assert num_stages is not None and num_microbatches is not None and schedule is not None
        topology = load_topology(topology_path) if topology_path else build_topology(num_stages, bandwidth, latency)
        result = simulate(
            profile, topology, schedule=schedule, num_stages=num_stages, num_microbatches=num_microbatches,
            num_minibatches=num_minibatches, partition=parse_partition(partition) if partition else None,
            recompute=recompute, optimizer_state_multiplier=optimizer_state_multiplier, jitter=jitter, seed=seed,
            engine=cast(EngineName, engine),  # click.Choice checked it
        )
    if out_dir:
        written = write_outputs(result, Path(out_dir))
    if as_json:
        click.echo(json.dumps(result.to_dict(), sort_keys=True))
    else:
        print_table(result)
        if out_dir:
            click.echo(f"wrote {', '.join(str(path) for path in written)}")


def _check_plan_flags(context: click.Context) -> None:
    """With --plan, the options a plan holds must not be given too."""
    for name in ("num_stages", "num_microbatches", "schedule", "num_minibatches", "partition", "recompute",
                 "optimizer_state_multiplier"):
        if context.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE:
            flag = next(param.opts[0] for param in context.command.params if param.name == name)
            raise ConfigError(flag.lstrip("-"), context.params[name], "comes from the plan file; do not give it with --plan")


def write_outputs(result: Result, out_dir: Path) -> list[Path]:
    """The report folder: data files from pipesim.export, the timeline from pipesim.plots."""
    from pipesim.export.report import write_report
    from pipesim.plots import save_figure, timeline, use_headless_backend

    use_headless_backend()
    written = write_report(result, out_dir)
    written.append(save_figure(timeline(result.trace), out_dir / "timeline.png"))
    return written


def _bytes(value: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if value >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value:.0f} B"


def print_table(result: Result) -> None:
    """A readable summary and a per-stage table."""
    m = result.metrics
    console = Console(highlight=False, width=None if Console().is_terminal else 140)
    window = (f"steady state over minibatches {m.warmup_minibatches}..{m.num_minibatches - m.cooldown_minibatches - 1}"
              if m.warmup_minibatches else "whole run")
    console.print(
        f"[bold]{m.schedule}[/bold]  p={m.num_stages} m={m.num_microbatches} K={m.num_minibatches}  "
        f"engine={m.engine}  ops={m.num_ops}\n"
        f"iteration time {m.iteration_time_s * 1e3:.3f} ms ({window}), makespan {m.makespan_s * 1e3:.3f} ms, "
        f"throughput {m.throughput_samples_per_s:.2f} samples/s, bubble {m.bubble_fraction:.1%}, "
        f"peak memory {_bytes(m.peak_memory_bytes)}"
    )
    table = Table(show_edge=False)
    for header in ("stage", "layers", "util", "bubble", "exposed comm ms", "peak memory", "versions",
                   "in-flight", "fwd delay", "discrepancy"):
        table.add_column(header, justify="right")
    for stage in m.stages:
        start, end = result.plan.partition[stage.stage]
        table.add_row(
            str(stage.stage), f"{start}:{end}", f"{stage.utilization:.1%}", f"{stage.bubble_fraction:.1%}",
            f"{stage.exposed_communication_s * 1e3:.3f}", _bytes(stage.peak_memory_bytes),
            str(stage.weight_versions_max), str(stage.max_inflight_microbatches),
            str(stage.forward_delay_steps), str(stage.discrepancy_max),
        )
    console.print(table)
