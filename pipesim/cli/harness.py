"""``pipesim profile``, ``linkbench`` and ``run``: the torch harness's commands (torch imported lazily)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from pipesim.cli.outputs import out_file_option, out_folder
from pipesim.cli.options import non_empty, parse_partition
from pipesim.errors import ConfigError
from pipesim.schedule.registry import SCHEDULES
from pipesim.spec.files import load_profile, save_model
from pipesim.spec.units import parse_size

FuncT = Callable[..., Any]

COMPUTE_HELP = ("real: the layers compute. emulated: a device of steady speed; every op waits on a monotonic clock "
                "until its deadline (its start plus its duration from the profile, as the simulator lowers it) "
                "instead of computing, while tensors of the model's sizes really go over the process group and the "
                "runtime's dispatch, stashes, weight versions, updates and memory stay real.")

REALTIME_OPTION = click.option(
    "--realtime-priority", type=int, default=0, show_default=True,
    help="Emulated compute: the ranks run under the real-time policy SCHED_RR at this priority (1-99; root or "
         "CAP_SYS_NICE), so that other programs cannot delay a rank's wake-up at an op's deadline or its "
         "communication threads (the ranks sleep nearly all the time). 0: the OS's normal policy.")


def model_options(function: FuncT) -> FuncT:
    """The options that name a model: --model and the built-in models' sizes."""
    for option in reversed([
        click.option("--model", "model", default="mlp", show_default=True,
                     help="mlp, transformer, or MODULE:CALLABLE / FILE.py:CALLABLE returning an nn.Sequential (with "
                          "validate --profile: the profile's user model, whose code runs only when named here)."),
        click.option("--depth", type=int, default=8, show_default=True, help="Layers (mlp) or blocks (transformer)."),
        click.option("--width", type=int, default=512, show_default=True, help="Hidden size of a built-in model."),
        click.option("--seq-len", type=int, default=32, show_default=True, help="Tokens per sample (transformer)."),
        click.option("--heads", type=int, default=4, show_default=True, help="Attention heads (transformer)."),
        click.option("--input-shape", type=str, default=None,
                     help="Per-sample input shape of a user model, e.g. 3,32,32."),
        click.option("--seed", type=int, default=0, show_default=True, help="Seed of the weights and the data."),
    ]):
        function = option(function)
    return function


def build_spec(model: str, depth: int, width: int, seq_len: int, heads: int, input_shape: str | None,
               seed: int) -> Any:
    """A ModelSpec from the model options."""
    from pipesim.harness.config import ModelSpec, user_model_file

    shape: tuple[int, ...] = ()
    if input_shape:
        try:
            shape = tuple(int(part) for part in input_shape.split(","))
        except ValueError:
            raise ConfigError("input_shape", input_shape,
                              "must be integers separated by commas, e.g. 3,32,32") from None
    spec = ModelSpec(name=model, depth=depth, width=width, seq_len=seq_len, heads=heads, input_shape=shape, seed=seed)
    user_model_file(model)  # checked here, before any rank starts (a rank would fail on it, exit 1)
    return spec


def run_failed(error: Exception) -> None:
    """Print a failed run in one line and exit 1."""
    click.echo(f"pipesim: error: {error}", err=True)
    sys.exit(1)


@click.command("profile")
@model_options
@click.option("--microbatch-size", type=int, required=True, help="Samples per microbatch.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--threads", type=int, default=1, show_default=True, help="torch threads (as in the run).")
@click.option("--warmup", type=int, default=5, show_default=True, help="Untimed repeats per layer.")
@click.option("--repeats", type=int, default=20, show_default=True, help="Timed repeats per layer.")
@click.option("--statistic", type=click.Choice(["mean", "median"]), default="mean", show_default=True,
              help="Summary of the repeats: the mean keeps time lost to other processes, as a real run pays it.")
@click.option("--processes", type=int, default=2, show_default=True,
              help="Processes timing the layers at once (as many as the run's ranks).")
@click.option("--calibrate/--no-calibrate", default=True, show_default=True,
              help="Measure the runtime's per-op overheads with a two-rank run of null layers.")
@click.option("--out", "out_path", required=True, callback=out_file_option(None), help="Profile JSON to write.")
def profile_command(model: str, depth: int, width: int, seq_len: int, heads: int, input_shape: str | None, seed: int,
                    microbatch_size: int, device: str, threads: int, warmup: int, repeats: int, statistic: str,
                    processes: int, calibrate: bool, out_path: str) -> None:
    """Measure a model layer by layer (forward, backward, update, sizes) and write a Profile."""
    from pipesim.harness import RunFailedError, require_torch

    require_torch()
    from pipesim.harness.profiler import Timing, profile_model

    spec = build_spec(model, depth, width, seq_len, heads, input_shape, seed)
    timing = Timing(warmup=warmup, repeats=repeats, statistic=statistic, processes=processes, threads=threads,
                    device=device)
    try:
        profile = profile_model(spec, microbatch_size, timing=timing, calibrate=calibrate)
    except RunFailedError as error:
        run_failed(error)
        return
    save_model(profile, out_path)
    if profile.forward_overhead_s is not None:
        click.echo(f"per-op overheads: F {profile.forward_overhead_s * 1e6:.0f} us, "
                   f"B {(profile.backward_overhead_s or 0) * 1e6:.0f} us, "
                   f"U {(profile.update_overhead_s or 0) * 1e6:.0f} us")
    for layer in profile.layers:
        click.echo(f"{layer.name:>16}  forward {layer.forward_s * 1e3:8.3f} ms"
                   f"  backward {layer.backward_s * 1e3:8.3f} ms"
                   f" (I {(layer.backward_input_s or 0) * 1e3:7.3f}, W {(layer.backward_weight_s or 0) * 1e3:7.3f})"
                   f"  update {(layer.update_s or 0) * 1e3:7.3f} ms  out {layer.activation_bytes:>10.0f} B"
                   f"  stash {layer.stashed_bytes:>10.0f} B  params {layer.param_bytes:>10.0f} B")
    click.echo(f"wrote {out_path}")


@click.command("linkbench")
@click.option("--ranks", "num_ranks", type=int, default=2, show_default=True,
              help="Processes (neighbours are measured).")
@click.option("--max-bytes", type=str, default=None, help="Largest message, with a unit (default 4MB).")
@click.option("--profile", "profile_path", type=str, default=None,
              help="Take the largest message from this profile's largest activation.")
@click.option("--repeats", type=int, default=30, show_default=True, help="Round trips per size (median).")
@click.option("--backend", type=click.Choice(["gloo", "nccl"]), default="gloo", show_default=True,
              help="gloo on CPU tensors, or NCCL between GPUs.")
@click.option("--out", "out_path", required=True, callback=out_file_option(None), help="Topology JSON to write.")
def linkbench_command(num_ranks: int, max_bytes: str | None, profile_path: str | None, repeats: int, backend: str,
                      out_path: str) -> None:
    """Measure point-to-point latency and bandwidth over gloo between local ranks; write a Topology."""
    from pipesim.harness import RunFailedError, require_torch

    require_torch()
    from pipesim.harness.linkbench import measure_links

    if max_bytes and profile_path:
        raise ConfigError("max_bytes", max_bytes, "give either --max-bytes or --profile, not both")
    largest = int(parse_size(max_bytes, "max_bytes")) if max_bytes else 4 << 20
    if profile_path:
        largest = int(max(layer.activation_bytes for layer in load_profile(profile_path).layers))
    try:
        topology, fits = measure_links(num_ranks, max_bytes=max(4, largest), repeats=repeats, backend=backend)
    except RunFailedError as error:
        run_failed(error)
        return
    save_model(topology, out_path)
    for fit in fits:
        click.echo(f"rank {fit.src} -> {fit.dst}: latency {fit.latency_s * 1e6:.1f} us, "
                   f"bandwidth {fit.bandwidth_bytes_per_s / 1e9:.3f} GB/s")
        for size, seconds in zip(fit.sizes_bytes, fit.one_way_s, strict=True):
            click.echo(f"  {size:>10d} B  measured {seconds * 1e6:9.1f} us  fit {fit.predicted_s(size) * 1e6:9.1f} us")
    click.echo(f"wrote {out_path}")


def training_options(function: FuncT) -> FuncT:
    """Learning rate and PipeMare's options."""
    for option in reversed([
        click.option("--lr", "learning_rate", type=float, default=0.01, show_default=True, help="SGD step size."),
        click.option("--pipemare-update", type=click.Choice(["minibatch", "microbatch"]), default="minibatch",
                     show_default=True, help="PipeMare's update cadence."),
        click.option("--pipemare-warmup-updates", type=int, default=0, show_default=True,
                     help="PipeMare's learning-rate rescheduling over this many updates (0: off)."),
        click.option("--pipemare-correction/--no-pipemare-correction", default=False,
                     help="PipeMare's discrepancy correction of the backward's weights."),
        click.option("--pipemare-correction-decay", type=float, default=0.9, show_default=True,
                     help="Decay of the weight-velocity average used by the correction."),
    ]):
        function = option(function)
    return function


def build_training(learning_rate: float, pipemare_warmup_updates: int, pipemare_correction: bool,
                   pipemare_correction_decay: float) -> Any:
    """TrainingOptions from the options."""
    from pipesim.harness.config import TrainingOptions

    return TrainingOptions(learning_rate=learning_rate, pipemare_warmup_updates=pipemare_warmup_updates,
                           pipemare_correction=pipemare_correction,
                           pipemare_correction_decay=pipemare_correction_decay)


@click.command("run")
@click.option("--profile", "profile_path", required=True, help="A profile written by pipesim profile.")
@click.option("--model", "model", default=None,
              help="The user's model to rebuild, MODULE:CALLABLE or FILE.py:CALLABLE, when the profile's source names "
                   "one: a profile never runs code, so its code runs only when named here. A built-in model's "
                   "profile needs none.")
@click.option("--schedule", required=True, help=f"One of: {', '.join(SCHEDULES)}.")
@click.option("--stages", "num_stages", type=int, required=True, help="Pipeline stages P (one process each, unless --ranks).")
@click.option("--microbatches", "num_microbatches", type=int, required=True, help="Microbatches per minibatch M.")
@click.option("--minibatches", "num_minibatches", type=int, default=None,
              help="Minibatches K (default 1 for gpipe/1f1b, 4 for asynchronous schedules).")
@click.option("--partition", type=str, default=None, callback=non_empty,
              help="Layer ranges per stage (default: balance the profile).")
@click.option("--ranks", "num_ranks", type=int, default=0,
              help="Processes, for schedules with several stages per rank (default: one per stage).")
@click.option("--backend", type=click.Choice(["gloo", "nccl"]), default="gloo", show_default=True)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--threads", type=int, default=1, show_default=True, help="torch threads per rank.")
@click.option("--compute", type=click.Choice(["real", "emulated"]), default="real", show_default=True,
              help=COMPUTE_HELP)
@REALTIME_OPTION
@training_options
@click.option("--op-timeout", "op_timeout_s", type=float, default=120.0, show_default=True,
              help="Seconds a rank may stay on one op before the run is declared hung.")
@click.option("--master-port", type=int, default=None,
              help="Rendezvous port on 127.0.0.1 (default: one the OS reports free); the ranks' gloo and NCCL "
                   "sockets listen on the loopback interface too.")
@click.option("--weights-out", type=str, default="", help="Folder for each stage's final weights (stageS.pt).")
@click.option("--run-dir", type=str, default=None,
              help="Keep the ranks' logs and records in this folder: a new or empty one, or one an earlier run wrote "
                   "(only that run's files are replaced).")
@click.option("--json", "as_json", is_flag=True, help="Print the measured metrics as JSON.")
@click.option("--out", "out_path", required=True, callback=out_file_option(None),
              help="Trace JSON to write (partial if the run fails).")
def run_command(profile_path: str, model: str | None, schedule: str, num_stages: int, num_microbatches: int,
                num_minibatches: int | None, partition: str | None, num_ranks: int, backend: str, device: str, threads: int, compute: str,
                realtime_priority: int, learning_rate: float,
                pipemare_update: str, pipemare_warmup_updates: int, pipemare_correction: bool,
                pipemare_correction_decay: float, op_timeout_s: float, master_port: int | None, weights_out: str,
                run_dir: str | None, as_json: bool, out_path: str) -> None:
    """Run SCHEDULE for real on P local processes (torch.distributed) and write the measured trace."""
    from pipesim.harness import RunFailedError, require_torch

    require_torch()
    from pipesim.engine.trace import Trace
    from pipesim.harness.config import RunConfig, check_partition, default_minibatches, model_to_rebuild, spec_of
    from pipesim.harness.launch import check_op_timeout, check_port, launch
    from pipesim.harness.prediction import emulation_of, predict
    from pipesim.harness.priority import check_realtime
    from pipesim.metrics import compute_metrics
    from pipesim.spec.stages import balance_partition

    check_op_timeout(op_timeout_s)
    for field, folder in (("weights_out", weights_out), ("run_dir", run_dir)):
        if folder:
            out_folder(folder, field)
    profile = load_profile(profile_path)
    spec = spec_of(profile, profile_path)
    if spec is None:
        raise ConfigError("profile", profile_path, "was not written by pipesim profile, so its model is unknown")
    spec = model_to_rebuild(spec, model, profile_path)
    if num_stages < 1:
        raise ConfigError("num_stages", num_stages, "must be >= 1")
    if num_stages > profile.num_layers:
        raise ConfigError("num_stages", num_stages, f"must be <= the number of layers ({profile.num_layers})")
    cuts = parse_partition(partition) if partition else balance_partition(profile, num_stages)
    check_partition(cuts, profile.num_layers)
    config = RunConfig(
        model=spec, schedule=schedule, num_stages=num_stages, num_microbatches=num_microbatches,
        num_minibatches=default_minibatches(schedule, num_minibatches), microbatch_size=profile.microbatch_size,
        partition=cuts, pipemare_update=pipemare_update, backend=backend, device=device, threads=threads,
        training=build_training(learning_rate, pipemare_warmup_updates, pipemare_correction,
                                pipemare_correction_decay),
        trace_out=out_path, weights_out=weights_out, num_ranks=num_ranks)
    check_realtime(realtime_priority, compute)
    if compute == "emulated":
        config = replace(config, emulation=emulation_of(predict(profile, None, config).trace, profile, cuts,
                                                        realtime_priority=realtime_priority))
    if master_port is not None:
        check_port(master_port)
    try:
        wall = launch(config, op_timeout_s=op_timeout_s, run_dir=Path(run_dir) if run_dir else None,
                      master_port=master_port)
    except RunFailedError as error:
        run_failed(error)
        return
    metrics = compute_metrics(Trace.from_json(open(out_path, encoding="utf-8").read()))
    if as_json:
        click.echo(json.dumps(metrics.to_dict(), sort_keys=True))
        return
    click.echo(f"{schedule}: p={num_stages} m={num_microbatches} K={config.num_minibatches}, partition "
               f"{','.join(f'{a}:{b}' for a, b in cuts)}, {backend} on {device} ({compute} compute), "
               f"{wall:.1f} s wall")
    window = (f"steady state over minibatches {metrics.warmup_minibatches}.."
              f"{metrics.num_minibatches - metrics.cooldown_minibatches - 1}" if metrics.warmup_minibatches else
              "whole run: give --minibatches 3 or more for a steady state")
    click.echo(f"iteration time {metrics.iteration_time_s * 1e3:.3f} ms ({window}), "
               f"bubble {metrics.bubble_fraction:.1%}, peak tracked memory {metrics.peak_memory_bytes / 1e6:.2f} MB")
    click.echo(f"wrote {out_path}")
