"""``pipesim plan``: the best plan for a profile on a cluster (PipeDream or 2BW), checked by simulation."""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Any, cast

import click
from rich.console import Console
from rich.table import Table

from pipesim.cli.options import non_empty
from pipesim.cli.outputs import out_folder, writing
from pipesim.errors import ConfigError
from pipesim.export.strict_json import strict_dumps
from pipesim.plan.check import PLANNERS, CheckedPlan, plan_and_check
from pipesim.plan.costs import COST_MODELS
from pipesim.plan.partition import format_bytes
from pipesim import __version__
from pipesim.simulation import EngineName
from pipesim.spec.files import load_profile, write_text_atomic
from pipesim.spec.provenance import command_line, file_identity
from pipesim.spec.topology import Topology
from pipesim.spec.validation import FrozenModel
from pipesim.spec.units import parse_bandwidth, parse_size

# Devices N of ``plan``: the planners and the check grow with N (1,024 take about 30 s and 1.3 GB
# on VGG-16, 4,096 over 7 GB; 10**12 ran out of memory).
MAX_DEVICES = 1024


def build_cluster(num_devices: int, devices_per_server: int | None, bandwidth: str,
                  inter_server_bandwidth: str | None, memory: str | None) -> Topology:
    """A flat or two-level topology from the ``plan`` options.

    Raises:
        ConfigError: a count below 1, devices above ``MAX_DEVICES``, a bandwidth or size without
            a unit, or only one of --devices-per-server / --inter-server-bandwidth.
    """
    if not 1 <= num_devices <= MAX_DEVICES:
        raise ConfigError("devices", num_devices, f"must be from 1 to {MAX_DEVICES:,}")
    if (devices_per_server is None) != (inter_server_bandwidth is None):
        raise ConfigError("devices_per_server", devices_per_server,
                          "give --devices-per-server and --inter-server-bandwidth together")
    memory_bytes = parse_size(memory, "memory") if memory else math.inf
    intra = parse_bandwidth(bandwidth, "bandwidth")
    if devices_per_server is None or inter_server_bandwidth is None:
        return Topology.uniform(num_devices=num_devices, bandwidth=intra, memory_bytes=memory_bytes)
    if devices_per_server < 1:
        raise ConfigError("devices_per_server", devices_per_server, "must be >= 1")
    inter = parse_bandwidth(inter_server_bandwidth, "inter_server_bandwidth")
    return Topology.hierarchical(num_devices=num_devices, devices_per_server=devices_per_server,
                                 intra_bandwidth=intra, inter_bandwidth=inter, memory_bytes=memory_bytes)


@click.command("plan")
@click.option("--profile", "profile_path", required=True, help="Profile file: pipesim JSON or PipeDream graph.txt.")
@click.option("--devices", "num_devices", type=int, required=True, help="Devices N.")
@click.option("--devices-per-server", type=int, default=None, help="Devices per server (with --inter-server-bandwidth).")
@click.option("--bandwidth", required=True, help="Bandwidth between devices (inside a server), e.g. 10GB/s.")
@click.option("--inter-server-bandwidth", default=None, help="Bandwidth between servers, e.g. 10Gbit/s.")
@click.option("--memory", default=None, callback=non_empty, help="Memory per device, e.g. 16GB (default: unlimited).")
@click.option("--planner", type=click.Choice(PLANNERS), default="pipedream", show_default=True,
              help="pipedream: PipeDream's partitioner (SOSP'19); 2bw: PipeDream-2BW's planner (ICML'21).")
@click.option("--cost-model", type=click.Choice(COST_MODELS), default="simulated", show_default=True,
              help="simulated: the engine's ring all-reduce and full-duplex cuts; the simulation picks the fastest "
                   "candidate. pipedream: the released optimizer's recurrence (4(r-1)/r all-reduce, its "
                   "hierarchy and quirks), whose own choice is returned.")
@click.option("--straight", is_flag=True, help="No data parallelism: one device per stage (2bw: width 1).")
@click.option("--overlap", is_flag=True,
              help="Stage time max(compute, all-reduce)/r as in the paper (a runtime that overlaps them), instead of "
                   "their sum (the engine runs updates on the compute stream).")
@click.option("--batch-size", type=int, default=None,
              help="2bw: samples per optimizer step over all pipelines (default devices x profile microbatch).")
@click.option("--optimizer-state", "optimizer_state_multiplier", type=float, default=1.0, show_default=True,
              help="Optimizer state bytes per weight byte (SGD+momentum 1, Adam 2).")
@click.option("--minibatches", "num_minibatches", type=int, default=4, show_default=True,
              help="Minibatches K the check simulates.")
@click.option("--engine", type=click.Choice(["des", "analytic", "auto"]), default="auto", show_default=True,
              help="Engine of the check: des (SimPy), analytic, or auto (analytic where it applies).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan, prediction and simulation as one JSON object.")
@click.option("--out", "out_dir", default=None, callback=non_empty,
              help="Write plan.json (for simulate --plan), topology.json and, if rescaled or reordered, profile.json.")
def plan_command(profile_path: str, num_devices: int, devices_per_server: int | None, bandwidth: str,
                 inter_server_bandwidth: str | None, memory: str | None, planner: str, cost_model: str, straight: bool, overlap: bool,
                 batch_size: int | None, optimizer_state_multiplier: float, num_minibatches: int, engine: str,
                 as_json: bool, out_dir: str | None) -> None:
    """Find the fastest plan for a profile on N devices: the cost model proposes, the simulation decides."""
    out = out_folder(out_dir) if out_dir else None
    topology = build_cluster(num_devices, devices_per_server, bandwidth, inter_server_bandwidth, memory)
    profile = load_profile(profile_path)
    checked = plan_and_check(
        profile, topology, planner="2bw" if planner == "2bw" else "pipedream",
        cost_model="pipedream" if cost_model == "pipedream" else "simulated",
        memory_bytes=topology.devices[0].memory_bytes, straight=straight, overlap=overlap,
        optimizer_state_multiplier=optimizer_state_multiplier, batch_size=batch_size, num_minibatches=num_minibatches,
        engine=cast(EngineName, engine),  # click.Choice checked it
    )
    rescaled = checked.profile is not profile
    run = {"command": command_line(), "pipesim_version": __version__, "profile": file_identity(profile_path),
           "planner": checked.planner, "engine": engine}
    written: list[str] = []
    if out is not None:
        with writing(out):
            written = write_plan(checked, out, profile_path, rescaled=rescaled, run=run)
    if as_json:
        click.echo(strict_dumps({**checked.to_dict(), "run": run}, indent=None))
        return
    print_plan(checked)
    for line in written:
        click.echo(line)


def _model_json(model: FrozenModel) -> str:
    """An input model as strict JSON: an infinite value (unlimited memory, free links) is left out,
    so reading the file back gives the field's default, infinity."""
    return strict_dumps(model.model_dump(mode="json", by_alias=True, exclude_none=True), drop=True)


def write_plan(checked: CheckedPlan, out_dir: Path, profile_path: str, *, rescaled: bool,
               run: dict[str, Any] | None = None) -> list[str]:
    """Write plan.json (with the ``run`` record), topology.json and (for a profile rescaled, or with
    its layers reordered for a plan that cuts a DAG off the file's order) profile.json, all strict
    JSON; return lines to print."""
    plan = checked.to_dict(timings=False)
    if run is not None:
        plan["run"] = run
    write_text_atomic(out_dir / "plan.json", strict_dumps(plan))
    write_text_atomic(out_dir / "topology.json", _model_json(checked.topology))
    files = [out_dir / "plan.json", out_dir / "topology.json"]
    profile_arg = profile_path
    if rescaled:
        write_text_atomic(out_dir / "profile.json", _model_json(checked.profile))
        files.append(out_dir / "profile.json")
        profile_arg = str(out_dir / "profile.json")
    command = ["pipesim", "simulate", "--plan", str(out_dir / "plan.json"), "--profile", profile_arg,
               "--topology", str(out_dir / "topology.json")]
    return [f"wrote {', '.join(str(path) for path in files)}", f"simulate it again: {shlex.join(command)}"]


def print_plan(checked: CheckedPlan) -> None:
    """The plan as a table of stages, then predicted against simulated."""
    data = checked.to_dict()
    predicted, simulated, gap = data["predicted"], data["simulated"], data["gap"]
    console = Console(highlight=False, width=None if Console().is_terminal else 140)
    shape = f"depth {data['depth']} x width {data['width']}, " if checked.planner == "2bw" else ""
    console.print(
        f"[bold]{checked.planner}[/bold] plan for {checked.profile.name} on {data['num_devices']} devices: "
        f"{shape}{len(data['stages'])} stages, microbatch {data['microbatch_size']}, "
        f"m={data['num_microbatches']}, recompute {'on' if data['recompute'] else 'off'}\n"
        f"cost model: compute and all-reduce {data['cost_model']['compute_and_allreduce']} "
        f"({data['cost_model']['stage_time']})"
    )
    table = Table(show_edge=False)
    for header in ("stage", "layers", "replicas", "devices", "time ms", "compute ms (1 replica)", "all-reduce ms",
                   "transfer ms", "memory pred", "memory sim", "util sim"):
        table.add_column(header, justify="right")
    for index, stage in enumerate(data["stages"]):
        pred, sim = stage["predicted"], stage["simulated"]
        table.add_row(
            str(index), f"{stage['layers'][0]}:{stage['layers'][1]}", str(stage["replicas"]),
            f"{stage['devices'][0]}-{stage['devices'][1]}", f"{pred['time_s'] * 1e3:.3f}",
            f"{pred['compute_s'] * 1e3:.3f}", f"{pred['allreduce_s'] * 1e3:.3f}", f"{pred['transfer_s'] * 1e3:.3f}",
            format_bytes(pred["memory_bytes"]), format_bytes(sim["peak_memory_bytes"]), f"{sim['utilization']:.1%}",
        )
    console.print(table)
    console.print(
        f"throughput: predicted {predicted['throughput_samples_per_s']:.2f} samples/s "
        f"(bottleneck {predicted['bottleneck']}), simulated {simulated['throughput_samples_per_s']:.2f} "
        f"({gap['throughput_simulated_over_predicted']:.3f}x)\n"
        f"peak memory per device: predicted {format_bytes(predicted['peak_memory_bytes'])}, "
        f"simulated {format_bytes(simulated['peak_memory_bytes'])}"
    )
    candidates = Table(show_edge=False, title="candidates (predicted by the cost model, simulated by the engine)")
    for header in ("", "candidate", "replication", "predicted ms/sample", "simulated ms/sample", "sim/pred"):
        candidates.add_column(header, justify="right")
    for row in data["candidates"]:
        pred, sim = row["predicted"]["time_per_sample_s"], row["simulated"]["time_per_sample_s"]
        candidates.add_row("*" if row["chosen"] else "", row["label"], "-".join(map(str, row["replication"])),
                           f"{pred * 1e3:.4f}", f"{sim * 1e3:.4f}", f"{sim / pred:.3f}" if pred else "-")
    console.print(candidates)
    console.print(f"chosen by {data['cost_model']['chosen_by']}")
    if "data_parallel" in data:
        dp = data["data_parallel"]
        console.print(
            f"over data parallelism on all {data['num_devices']} devices: {dp['speedup_predicted']:.2f}x predicted, "
            f"{dp['speedup_simulated']:.2f}x simulated"
        )
    console.print(f"simulation model: {data['simulation_model']}")
