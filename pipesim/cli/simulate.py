"""``pipesim simulate``: run one schedule on a profile and print or write the metrics."""

from __future__ import annotations

from pathlib import Path
from collections.abc import Callable
from typing import Any, cast

import click
from rich.console import Console
from rich.table import Table

from pipesim.cli.capacity import Capacity, capacity_fields, capacity_headline, capacity_options, capacity_setup
from pipesim.cli.compare import (
    comparison_files,
    print_comparison,
    run_schedules,
    schedule_names,
    write_comparison,
)
from pipesim.cli.options import (
    build_topology,
    check_partition,
    non_empty,
    parse_partition,
    parse_recompute_stages,
    parse_uniform,
    resolve_stages,
)
from pipesim.cli.outputs import check_out_files, out_folder, write_together
from pipesim.engine.noise import DISTRIBUTIONS, Distribution
from pipesim.engine.trace import CATEGORIES
from pipesim.errors import ConfigError
from pipesim.schedule.csv_format import from_csv
from pipesim.export.report import REPORT_FILES, metrics_dict
from pipesim.export.strict_json import strict_dumps
from pipesim.schedule.ir import Schedule
from pipesim.schedule.registry import SCHEDULES
from pipesim.spec.profile import Profile
from pipesim.spec.topology import Topology
from pipesim.simulation import (
    DEFAULT_MAX_OPS,
    EngineName,
    Result,
    SampleSummary,
    check_num_samples,
    check_num_stages,
    simulate,
    simulate_plan,
    simulate_samples,
    simulate_schedule,
)
from pipesim.spec.files import load_plan, load_profile, load_topology, read_text
from pipesim.spec.plan import CUSTOM_SCHEDULE


@click.command("simulate")
@click.option("--profile", "profile_path", type=str, default=None,
              help="Profile file: pipesim JSON or PipeDream graph.txt (told apart by content).")
@click.option("--uniform", type=str, default=None,
              help="Synthetic profile: layers=L,forward_ms=F,backward_ms=B,activation_bytes=A,param_bytes=W "
                   "[,backward_input_ms=I,backward_weight_ms=W2,forward_std_ms=,backward_std_ms=,input_bytes=,loss_bytes=] "
                   "(input_bytes: the model input stage 0 keeps; loss_bytes: the loss buffer the last stage keeps).")
@click.option("--plan", "plan_path", type=str, default=None,
              help="A plan file (pipesim.plan/1, or the output of pipesim plan) instead of --stages ... --schedule.")
@click.option("--stages", "num_stages", type=int, default=None, help="Pipeline stages P, one per device.")
@click.option("--ranks", "num_ranks", type=int, default=None, help="Ranks (devices) R.")
@click.option("--stages-per-rank", "stages_per_rank", type=int, default=None,
              help="Model stages V on each rank, R x V in all; default 1.")
@click.option("--microbatches", "num_microbatches", type=int, default=None,
              help="Microbatches per minibatch M (with --schedule-csv: default the largest index + 1).")
@click.option("--schedule", "schedule", default=None,
              help=f"One of: {', '.join(SCHEDULES)} (or torch's class names); a comma-separated list or 'all' "
                   "compares them side by side. Default with --model: 1f1b, or interleaved-1f1b with "
                   "--stages-per-rank above 1 (Megatron's schedules).")
@click.option("--schedule-csv", "schedule_csv", type=str, default=None,
              help="Simulate the schedule in this file (PyTorch's pipelining CSV) instead of --schedule.")
@click.option("--minibatches", "num_minibatches", type=int, default=None,
              help="Minibatches K (default 1 for flush schedules, 4 for asynchronous schedules).")
@click.option("--partition", type=str, default=None, callback=non_empty,
              help="Layer ranges per stage, START:END,... (default: balance forward+backward time).")
@click.option("--bandwidth", type=str, default=None, callback=non_empty,
              help="Link bandwidth with a unit, e.g. 25Gbit/s or 300GB/s.")
@click.option("--latency", type=str, default=None, callback=non_empty, help="Link latency with a unit, e.g. 5us.")
@click.option("--speeds", type=str, default=None, help="Relative speed per device, e.g. 1,1,0.5,1.")
@click.option("--shared-nics", is_flag=True,
              help="Flows leaving or entering a device share its NIC's bandwidth (des engine only).")
@click.option("--topology", "topology_path", type=str, default=None, callback=non_empty,
              help="Topology JSON (instead of --bandwidth).")
@click.option("--recompute/--no-recompute", default=False,
              help="Full activation recomputation on every stage: it keeps its input, and a backward holds the "
                   "activations it re-creates while it runs.")
@click.option("--recompute-stages", "recompute_stages", type=str, default=None,
              help="Recomputation per stage: one of none|full|selective, or one per stage (full,none,...).")
@click.option("--optimizer-state", "optimizer_state_multiplier", type=float, default=1.0, show_default=True,
              help="Optimizer state bytes per weight byte (SGD+momentum 1, Adam 2).")
@click.option("--pipemare-model", "pipemare_model", type=click.Choice(["1f1b", "paper"]), default="1f1b",
              show_default=True,
              help="pipemare's device: 1f1b, a stage alternating F and B; paper, the PipeMare paper's pipeline, "
                   "one forward and one backward at once in every time step.")
@click.option("--pipemare-update", "pipemare_update", type=click.Choice(["minibatch", "microbatch"]),
              default="minibatch", show_default=True, help="pipemare's weight update: once per minibatch or per microbatch.")
@click.option("--fb-chunks", "fb_chunks", type=click.Choice(["dualpipe", "torch"]), default="dualpipe",
              show_default=True,
              help="dualpipev's paired forward and backward: one overlapped chunk waiting for both inputs "
                   "(DualPipe), or one after the other (torch's runtime for OVERLAP_F_B).")
@click.option("--fb-overlap", "fb_overlap", type=float, default=0.0, show_default=True,
              help="Share (0..1) of the shorter op of an overlapped F&B chunk hidden under the longer: "
                   "the chunk takes F + B - share x min(F, B).")
@click.option("--zb-memory-limit", "zb_memory_limit", type=float, default=None,
              help="zb-auto: activations a stage may hold, in microbatches (units of the most one microbatch "
                   "keeps on any stage); default the stage count P (ZB-1p), 2P is ZB-2p.")
@click.option("--jitter", type=float, default=0.0, show_default=True,
              help="Per-op duration noise (coefficient of variation).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the jitter and of --samples.")
@click.option("--samples", "num_samples", type=int, default=None,
              help="Stochastic DES runs: iteration time median, p5, p95 and straggler sensitivity.")
@click.option("--distribution", type=click.Choice(DISTRIBUTIONS), default="normal", show_default=True,
              help="Distribution of each op's duration in --samples runs.")
@click.option("--cv", type=float, default=None,
              help="Coefficient of variation of every op in --samples runs (default: the profile's measured spread).")
@click.option("--engine", type=click.Choice(["des", "analytic", "auto"]), default="auto", show_default=True,
              help="des: SimPy events; analytic: the same timeline by a longest-path pass (jitter too); "
                   "auto: analytic where it applies.")
@click.option("--max-ops", type=click.IntRange(min=1), default=DEFAULT_MAX_OPS, show_default=True,
              help="Refuse runs estimated to have more ops than this (about 0.5 KiB of memory each).")
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as one JSON object.")
@click.option("--out", "out_dir", type=str, default=None, callback=non_empty,
              help="Write a report folder: metrics.json, trace.json, trace.perfetto.json, timeline.png.")
@capacity_options
def simulate_command(
    profile_path: str | None, uniform: str | None, plan_path: str | None, num_stages: int | None,
    num_ranks: int | None, stages_per_rank: int | None, num_microbatches: int | None, schedule: str | None,
    schedule_csv: str | None,
    num_minibatches: int | None, partition: str | None, bandwidth: str | None, latency: str | None,
    speeds: str | None, shared_nics: bool, topology_path: str | None, recompute: bool,
    recompute_stages: str | None, optimizer_state_multiplier: float, pipemare_model: str, pipemare_update: str,
    fb_chunks: str, fb_overlap: float, zb_memory_limit: float | None,
    jitter: float, seed: int, num_samples: int | None, distribution: Distribution, cv: float | None, engine: str,
    max_ops: int,
    as_json: bool, out_dir: str | None, **capacity_flags: Any,
) -> None:
    """Simulate SCHEDULE on a profile cut into P stages and report time, bubbles, memory and staleness."""
    if recompute and recompute_stages is not None:
        raise ConfigError("recompute_stages", recompute_stages, "give either --recompute (full on every stage) or "
                          "--recompute-stages, not both")
    capacity = capacity_setup(click.get_current_context(), capacity_flags, profile_path=profile_path, uniform=uniform,
                              num_microbatches=num_microbatches, recompute=recompute, recompute_stages=recompute_stages,
                              optimizer_state_multiplier=optimizer_state_multiplier, bandwidth=bandwidth,
                              latency=latency, num_ranks=num_stages if num_ranks is None else num_ranks)
    profile, num_microbatches, bandwidth = capacity.profile, capacity.num_microbatches, capacity.bandwidth
    latency = capacity.latency
    recompute, recompute_stages = capacity.recompute, capacity.recompute_stages
    optimizer_state_multiplier = capacity.optimizer_state_multiplier
    if topology_path and (bandwidth or latency or speeds or shared_nics):
        raise ConfigError("topology", topology_path, "give either --topology or --bandwidth/--latency/--speeds/"
                          "--shared-nics, not both")
    if num_samples is not None:
        check_num_samples(num_samples)
    else:
        _check_needs_samples(click.get_current_context())
    out = out_folder(out_dir) if out_dir else None
    given: Schedule | None = None
    compared: tuple[list[Result], list[dict[str, str]]] | None = None
    chosen = cast(EngineName, engine)  # click.Choice checked it
    if plan_path is not None:
        _check_plan_flags(click.get_current_context())
        plan = load_plan(plan_path)
        check_num_stages(profile, plan.num_stages, plan_path)
        topology = load_topology(topology_path) if topology_path else _links(
            capacity, plan.num_devices, bandwidth, latency, speeds=speeds, shared=shared_nics)
        result = simulate_plan(profile, topology, plan, jitter=jitter, seed=seed, engine=chosen, max_ops=max_ops)
    else:
        if schedule is not None and schedule_csv is not None:
            raise ConfigError("schedule", schedule, "give exactly one of --schedule NAME or --schedule-csv FILE")
        if schedule is None and schedule_csv is None:
            if capacity.record is None:
                raise click.UsageError("Missing option '--schedule' (or --schedule-csv FILE).",
                                       click.get_current_context())
            from pipesim.training import megatron_schedule  # noqa: PLC0415 - only where a model is named

            schedule = megatron_schedule(stages_per_rank)
        if schedule_csv is not None:
            given = from_csv(read_text(schedule_csv, "schedule_csv"), name=CUSTOM_SCHEDULE,
                             num_microbatches=num_microbatches, source=schedule_csv)
            if any(value is not None for value in (num_stages, num_ranks, stages_per_rank, num_minibatches)):
                raise ConfigError("schedule_csv", schedule_csv, "sets the stages, ranks and minibatches; drop "
                                  "--stages/--ranks/--stages-per-rank/--minibatches")
            total, per_rank, ranks = given.num_stages, 1, given.num_ranks
        else:
            for flag, value in (("--stages", num_stages if num_ranks is None else num_ranks),
                                ("--microbatches", num_microbatches)):
                if value is None:
                    hint = " (or --ranks R [--stages-per-rank V])" if flag == "--stages" else \
                        " (or --global-batch G, which sets it with --model)" if capacity.record is not None else ""
                    raise click.UsageError(f"Missing option '{flag}'{hint}.", click.get_current_context())
            total, per_rank = resolve_stages(num_stages, num_ranks, stages_per_rank)
            ranks = total // per_rank
            if ranks > profile.num_layers:  # no schedule can run; refused before a device per rank is built
                check_num_stages(profile, total)
        topology = load_topology(topology_path) if topology_path else _links(
            capacity, ranks, bandwidth, latency, speeds=speeds, shared=shared_nics)
        ranges = parse_partition(partition) if partition else None
        if ranges is not None and partition is not None:
            check_partition(ranges, partition, total, profile.num_layers)
        options: dict[str, Any] = {
            "partition": ranges,
            "recompute": recompute, "optimizer_state_multiplier": optimizer_state_multiplier,
            "fb_chunks": fb_chunks, "fb_overlap": fb_overlap,
            "pipemare_model": pipemare_model, "pipemare_update": pipemare_update,
            "zb_memory_limit": zb_memory_limit,
        }

        def run(name: str, per_rank_of: int) -> Result:
            if recompute_stages is not None:
                options["recompute_stages"] = parse_recompute_stages(recompute_stages, ranks * per_rank_of)
            cut = {"partition": ranges or capacity.default_partition(ranks * per_rank_of)}
            return simulate(
                profile, topology, schedule=name, num_stages=ranks * per_rank_of,
                num_microbatches=num_microbatches or 0, num_minibatches=num_minibatches, stages_per_rank=per_rank_of,
                engine=chosen, jitter=jitter, seed=seed, max_ops=max_ops, **{**options, **cut},
            )

        if given is not None:
            _check_schedule_flags(click.get_current_context(), ["custom"])
            if recompute_stages is not None:
                options["recompute_stages"] = parse_recompute_stages(recompute_stages, total)
            result = simulate_schedule(profile, topology, given, engine=chosen, jitter=jitter, seed=seed,
                                       max_ops=max_ops, **options)
        else:
            names, is_all = schedule_names(schedule or "")
            _check_schedule_flags(click.get_current_context(), names)
            if len(names) == 1 and not is_all:
                result = run(names[0], per_rank)
            else:
                if num_samples is not None:
                    raise ConfigError("samples", num_samples, "runs one schedule; drop it when comparing schedules")
                compared = run_schedules(names, is_all, per_rank, run)
    if compared is not None:
        _report_comparison(
            *compared, capacity_of=lambda data: capacity_fields(data, capacity), as_json=as_json, out=out,
            run_of=lambda result: simulation_run(result, profile_path, uniform, topology, topology_path,
                                                 capacity.record))
        return
    summary = None
    if num_samples is not None:
        summary = simulate_samples(profile, topology, result.plan, num_samples=num_samples, seed=seed,
                                   distribution=distribution, cv=cv, schedule=given)
    warn_without_memory(profile)
    if num_samples is not None and cv is None:
        warn_without_spread(profile)
    provenance = simulation_run(result, profile_path, uniform, topology, topology_path, capacity.record)
    data = metrics_dict(result, provenance)
    data.update(capacity_fields(data, capacity))
    if out is not None:
        check_out_files(out, OUTPUT_FILES)
        written = write_together(out, lambda folder: write_outputs(result, folder, provenance, data))
    if as_json:
        if summary is not None:
            data["samples"] = summary.to_dict()
        click.echo(strict_dumps(data, indent=None))
    else:
        print_table(result, data.get("device_memory_headroom_bytes"))
        if capacity_headline(data):
            click.echo(capacity_headline(data))
        if summary is not None:
            print_samples(summary)
        if out is not None:
            click.echo(f"wrote {', '.join(str(path) for path in written)}")


def _report_comparison(results: list[Result], skipped: list[dict[str, str]], *,
                       capacity_of: Callable[[dict[str, Any]], dict[str, Any]], as_json: bool,
                       out: Path | None, run_of: Callable[[Result], dict[str, Any]]) -> None:
    """Print (and with ``out`` write) schedules compared side by side; each run records its inputs."""
    runs = [data | capacity_of(data) for data in (metrics_dict(result, run_of(result)) for result in results)]
    written: list[Path] = []
    if out is not None:
        check_out_files(out, comparison_files(results))
        written = write_together(out, lambda folder: write_comparison(results, runs, folder))
    if as_json:
        click.echo(strict_dumps({"runs": runs, "skipped": skipped}, indent=None))
        return
    print_comparison(runs, skipped)
    if written:
        click.echo(f"wrote {', '.join(str(path) for path in written)}")


# Options that only some schedules read, and those schedules ("custom": a --schedule-csv file,
# whose paired F and B run as chunks as dualpipev's do).
SCHEDULE_FLAGS: dict[str, tuple[str, ...]] = {
    "fb_chunks": ("dualpipev", "custom"), "fb_overlap": ("dualpipev", "custom"),
    "pipemare_model": ("pipemare",), "pipemare_update": ("pipemare",), "zb_memory_limit": ("zb-auto",),
}


def _links(capacity: Capacity, num_devices: int, bandwidth: str | None, latency: str | None, *, speeds: str | None,
           shared: bool) -> Topology:
    """A model's pipeline with each hop on the tier it crosses (``Capacity.pipeline_links``) where
    neither --bandwidth nor --latency is given, else one link for all from them; with --speeds and
    --shared-nics applied (``build_topology``)."""
    return build_topology(num_devices, bandwidth, latency, speeds=speeds, shared=shared,
                          links=capacity.pipeline_links(num_devices))


def _check_schedule_flags(context: click.Context, names: list[str]) -> None:
    """An option given for schedules of which none reads it is refused, not ignored."""
    for name, takers in SCHEDULE_FLAGS.items():
        if context.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE \
                and not set(takers) & set(names):
            shown = ", ".join(taker for taker in takers if taker != "custom")
            run = "a --schedule-csv file" if names == ["custom"] else ", ".join(names)
            raise ConfigError(name, context.params[name], f"applies to {shown} only, not {run}")


def _check_needs_samples(context: click.Context) -> None:
    """--distribution and --cv shape --samples runs only: refused without --samples."""
    for name in ("distribution", "cv"):
        if context.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE:
            raise ConfigError(name, context.params[name], "applies to --samples runs only; give --samples N")


def _check_plan_flags(context: click.Context) -> None:
    """With --plan, the options a plan holds must not be given too."""
    for name in ("num_stages", "num_ranks", "stages_per_rank", "num_microbatches", "schedule", "schedule_csv",
                 "num_minibatches", "partition", "recompute", "recompute_stages", "optimizer_state_multiplier",
                 "fb_chunks", "fb_overlap", "pipemare_model", "pipemare_update", "zb_memory_limit"):
        if context.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE:
            flag = next(param.opts[0] for param in context.command.params if param.name == name)
            raise ConfigError(flag.lstrip("-"), context.params[name], "comes from the plan file; do not give it with --plan")


# The files ``write_outputs`` writes into the report folder.
OUTPUT_FILES = (*REPORT_FILES, "timeline.png")


def write_outputs(result: Result, out_dir: Path, run: dict[str, Any] | None = None,
                  metrics: dict[str, Any] | None = None) -> list[Path]:
    """The report folder: data files from pipesim.export (``metrics``: the metrics.json object,
    memory verdict included), the timeline from pipesim.plots."""
    from pipesim.export.report import write_report
    from pipesim.plots import save_figure, timeline, use_headless_backend

    use_headless_backend()
    written = write_report(result, out_dir, run=run, metrics=metrics)
    written.append(save_figure(timeline(result.trace), out_dir / OUTPUT_FILES[-1]))
    return written


def simulation_run(result: Result, profile_path: str | None, uniform: str | None, topology: Topology,
                   topology_path: str | None, model_record: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``run`` record of this command's outputs: inputs named by file and hash, settings, command;
    with ``--model``, the model is the profile and ``model_run`` holds the capacity study's inputs."""
    from pipesim.export.provenance import run_record
    from pipesim.spec.provenance import file_identity, text_identity

    if model_record is not None:
        profile = model_record["model"]
    else:
        profile = file_identity(profile_path) if profile_path else text_identity(f"uniform:{uniform}", uniform or "")
    record = run_record(result, profile=profile, topology=topology,
                        topology_file=file_identity(topology_path) if topology_path else None)
    if model_record is not None:
        record["model_run"] = model_record
    return record


def warn_without_memory(profile: Profile) -> None:
    """A profile without byte figures gives a peak memory of 0 B: say so on stderr, once."""
    if not any(layer.activation_bytes or layer.param_bytes or layer.stash_bytes for layer in profile.layers):
        click.echo(f"pipesim: warning: profile {profile.name!r} has no memory figures (activation, stash and "
                   "parameter bytes are all 0), so peak memory reads 0 B", err=True)


def warn_without_spread(profile: Profile) -> None:
    """``--samples`` without ``--cv`` draws around each op's measured spread: where the profile has
    none, every sample is the deterministic run; say so on stderr."""
    if not any(layer.forward_std_s or layer.backward_std_s for layer in profile.layers):
        click.echo(f"pipesim: warning: profile {profile.name!r} has no measured spread (no forward_std_s or "
                   "backward_std_s), so every sample equals the deterministic run; give --cv to draw around it",
                   err=True)


def _bytes(value: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value:.0f} B"


def print_table(result: Result, headroom_bytes: list[float] | None = None) -> None:
    """A readable summary, a per-device table (what must fit on each GPU: the peak of the summed
    memory of its stages) and a per-stage table; ``headroom_bytes`` (per device, budget minus
    peak) adds a column."""
    m = result.metrics
    console = Console(highlight=False, width=None if Console().is_terminal else 140)
    window = (f"steady state over minibatches {m.warmup_minibatches}..{m.num_minibatches - m.cooldown_minibatches - 1}"
              if m.warmup_minibatches else "whole run")
    ranks = f" on {m.num_ranks} ranks" if m.num_ranks != m.num_stages else ""
    peaks = list(m.device_peak_memory_bytes)
    device = peaks.index(m.peak_memory_bytes) if m.peak_memory_bytes in peaks else 0
    console.print(
        f"[bold]{m.schedule}[/bold]  p={m.num_stages}{ranks} m={m.num_microbatches} K={m.num_minibatches}  "
        f"engine={m.engine}  ops={m.num_ops}\n"
        f"iteration time {m.iteration_time_s * 1e3:.3f} ms ({window}), makespan {m.makespan_s * 1e3:.3f} ms, "
        f"throughput {m.throughput_samples_per_s:.2f} samples/s, bubble {m.bubble_fraction:.1%}, "
        f"peak memory {_bytes(m.peak_memory_bytes)} (device {device})"
    )
    devices = Table(show_edge=False)
    for header in ("device", "stages", "util", "peak memory", *(f"{c} at peak" for c in CATEGORIES),
                   *(("headroom",) if headroom_bytes is not None else ())):
        devices.add_column(header, justify="right")
    for index, peak in enumerate(peaks):
        held = ",".join(str(stage.stage) for stage in m.stages if stage.device == index)
        breakdown = m.device_peak_breakdown_bytes[index]
        extra = () if headroom_bytes is None else (_bytes(headroom_bytes[index]),)
        devices.add_row(str(index), held, f"{m.device_utilization[index]:.1%}", _bytes(peak),
                        *(_bytes(breakdown[c]) for c in CATEGORIES), *extra)
    console.print(devices)
    table = Table(show_edge=False)
    for header in ("stage", "device", "layers", "util", "bubble", "exposed comm ms", "peak memory", "versions",
                   "in-flight", "fwd delay", "discrepancy"):
        table.add_column(header, justify="right")
    for stage in m.stages:
        start, end = result.plan.partition[stage.stage]
        table.add_row(
            str(stage.stage), str(stage.device), f"{start}:{end}", f"{stage.utilization:.1%}",
            f"{stage.bubble_fraction:.1%}",
            f"{stage.exposed_communication_s * 1e3:.3f}", _bytes(stage.peak_memory_bytes),
            str(stage.weight_versions_max), str(stage.max_inflight_microbatches),
            str(stage.forward_delay_steps), str(stage.discrepancy_max),
        )
    console.print(table)


def print_samples(summary: SampleSummary) -> None:
    """The iteration-time distribution and each device's straggler sensitivity."""
    spread = f"cv {summary.cv}" if summary.cv is not None else "the profile's measured spread"
    sensitivity = ", ".join(f"{value:.2f}" for value in summary.straggler_sensitivity)
    click.echo(
        f"{summary.num_samples} samples ({summary.distribution}, {spread}, seed {summary.seed}): iteration time "
        f"median {summary.median_s * 1e3:.3f} ms, p5 {summary.p5_s * 1e3:.3f} ms, p95 {summary.p95_s * 1e3:.3f} ms "
        f"(deterministic {summary.deterministic_iteration_time_s * 1e3:.3f} ms)\n"
        f"straggler sensitivity per device (iteration slow-down / device slow-down of "
        f"{summary.straggler_slowdown:.0%}): {sensitivity}"
    )
