"""``pipesim validate``: profile, simulate, run for real, and report predicted against measured."""

from __future__ import annotations

import json
import statistics
from typing import TYPE_CHECKING

import click

from pipesim.cli.harness import (
    COMPUTE_HELP,
    REALTIME_OPTION,
    build_spec,
    build_training,
    model_options,
    run_failed,
    training_options,
)
from pipesim.errors import ConfigError
from pipesim.schedule.registry import SCHEDULES, unknown_schedule_rule
from pipesim.spec.files import load_profile, load_topology

if TYPE_CHECKING:
    from pipesim.harness.validate import FreshProfiles
    from pipesim.spec.profile import Profile


def parse_schedules(text: str) -> list[str]:
    """``all`` or a comma-separated list of schedule names."""
    names = list(SCHEDULES) if text == "all" else [name.strip() for name in text.split(",") if name.strip()]
    for name in names:
        if name not in SCHEDULES:
            raise ConfigError("schedule", name, f"{unknown_schedule_rule(name)}, or all")
    return names


@click.command("validate")
@model_options
@click.option("--microbatch-size", type=int, default=None,
              help="Samples per microbatch (default: the --profile's, else 64 for mlp and 1 for transformer).")
@click.option("--schedule", "schedules", required=True, help="A schedule, a comma-separated list, or all.")
@click.option("--stages", "num_stages", type=int, required=True, help="Pipeline stages P.")
@click.option("--ranks", "num_ranks", type=int, default=0,
              help="Processes, for schedules with several stages per rank (default: one per stage).")
@click.option("--microbatches", "num_microbatches", type=int, required=True, help="Microbatches per minibatch M.")
@click.option("--minibatches", "num_minibatches", type=int, default=4, show_default=True,
              help="Minibatches K; the first (warm-up) and the last (drain) are outside the steady state.")
@click.option("--repeats", type=int, default=3, show_default=True,
              help="Runs per schedule, interleaved across schedules (A B C A B C); the report gives the median "
                   "error and the noise floor (the largest distance of a run from the runs' median).")
@click.option("--compute", type=click.Choice(["real", "emulated"]), default="real", show_default=True,
              help=COMPUTE_HELP)
@click.option("--profile", "profile_path", type=str, default=None, help="Use this profile instead of measuring.")
@click.option("--topology", "topology_path", type=str, default=None, help="Use this topology instead of linkbench.")
@click.option("--profile-repeats", type=int, default=30, show_default=True, help="Timed repeats per layer.")
@click.option("--reprofile", is_flag=True,
              help="Measure a fresh profile right before every run (on a machine whose load drifts).")
@click.option("--statistic", type=click.Choice(["mean", "median"]), default="mean", show_default=True,
              help="Summary of the profile's repeats (see pipesim profile).")
@click.option("--op-times", type=click.Choice(["calibrated", "layers"]), default=None,
              help="Where the prediction's op times come from (default: calibrated with real compute, layers with "
                   "emulated). calibrated: before every validated run, a SEPARATE "
                   "calibration run of the real runtime (--calibration-schedule, --calibration-microbatches x "
                   "--calibration-minibatches, same partition and ranks) gives each stage's F, B and U time (the "
                   "--statistic of its spans in the steady-state minibatches); the validated runs' own times are "
                   "never used, and the plain layer profile's prediction is reported beside it. layers: the layer "
                   "profile alone.")
@click.option("--calibration-schedule", type=click.Choice(["gpipe", "1f1b", "both"]), default="both",
              show_default=True,
              help="The calibration runs' schedules (both: a GPipe and a 1F1B run, so that every op's time is "
                   "measured after the kind of op that precedes it in the validated schedule: an F after an F, "
                   "as GPipe runs it, or after a B, as the 1F1B family does); with fewer --ranks than stages, "
                   "their forms with several stages per rank (looped-bfs, interleaved-1f1b) on as many processes.")
@click.option("--calibration-microbatches", type=int, default=None,
              help="Microbatches per minibatch of the calibration run (default: --microbatches).")
@click.option("--calibration-minibatches", type=int, default=None,
              help="Minibatches of the calibration run; the first and the last are not measured (default: "
                   "--minibatches, at least 3: a rank's first minibatches run slower than its later ones, so the "
                   "calibration measures its ops where the validated run's steady state lies).")
@click.option("--spread-draws", type=int, default=32, show_default=True,
              help="With calibrated op times, the predicted iteration time is the mean over this many seeded draws of "
                   "every op's time from a normal of its stage and kind's calibrated mean and the calibration run's "
                   "spread (op times that vary make a pipeline wait longer than its mean op times say); 0: the "
                   "iteration time of the mean op times alone (reported beside it in --json either way).")
@click.option("--host-cost-runs", type=int, default=3, show_default=True,
              help="Emulated compute: separate emulated 1F1B runs (one stage per rank, the validated runs' M and K, "
                   "as a calibration has them) that measure the host's own "
                   "time per F and B op fed by another rank, beyond the device's durations (gloo's receive cannot "
                   "tell that a message has arrived until it is waited on, so such an op starts when its host gets "
                   "there; a host that wakes late sends late): per run the mean over its steady-state ops of how "
                   "much later each ended than its device could have. The median over the runs is added to those "
                   "ops of the prediction, while the emulated ops last the durations predicted without it. 0: none.")
@click.option("--nice", type=int, default=0, show_default=True,
              help="Nice value for every process of the measurement (profile, calibration, runs), set before any "
                   "starts; below 0 puts them ahead of other programs (needs root or CAP_SYS_NICE) and, where Linux "
                   "groups the CPU by session, applies to the caller's whole session. 0 leaves it as it is.")
@REALTIME_OPTION
@training_options
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="cpu runs on gloo; cuda on NCCL, one GPU per rank.")
@click.option("--op-timeout", "op_timeout_s", type=float, default=120.0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per schedule (a list).")
def validate_command(model: str, depth: int, width: int, seq_len: int, heads: int, input_shape: str | None,
                     seed: int, microbatch_size: int | None, schedules: str, num_stages: int, num_ranks: int,
                     num_microbatches: int, num_minibatches: int, repeats: int, compute: str,
                     profile_path: str | None, topology_path: str | None, profile_repeats: int, reprofile: bool,
                     statistic: str, op_times: str | None, calibration_schedule: str,
                     calibration_microbatches: int | None,
                     calibration_minibatches: int | None, spread_draws: int, host_cost_runs: int, nice: int,
                     realtime_priority: int, learning_rate: float, pipemare_update: str,
                     pipemare_warmup_updates: int, pipemare_correction: bool, pipemare_correction_decay: float,
                     device: str, op_timeout_s: float, as_json: bool) -> None:
    """Profile a model, simulate each schedule, run it for real, and compare the two.

    By default the prediction's op times come from a separate calibration run before each
    validated run (see --op-times); the layer profile's own prediction is printed beside it.
    With --compute emulated every op lasts its predicted duration, which leaves the schedule
    model itself (order, waits, communication, the runtime's costs) to be judged.
    """
    from pipesim.harness import RunFailedError, require_torch

    require_torch()
    from pipesim.harness.calibration import CalibrationRun, calibrate
    from pipesim.harness.config import (check_processes, default_microbatch_size, model_to_rebuild, run_schedule,
                                        spec_of)
    from pipesim.harness.launch import check_backend, check_op_timeout
    from pipesim.harness.linkbench import measure_links
    from pipesim.harness.overheads import host_cost
    from pipesim.harness.priority import check_realtime, raise_priority
    from pipesim.harness.profiler import Timing, measure_profile
    from pipesim.harness.validate import FreshProfiles, ScheduleValidation, validate_interleaved

    names = parse_schedules(schedules)
    raise_priority(nice)
    check_realtime(realtime_priority, compute)
    if repeats < 1:
        raise ConfigError("repeats", repeats, "must be >= 1")
    if spread_draws < 0:
        raise ConfigError("spread_draws", spread_draws, "must be >= 0")
    if host_cost_runs < 0:
        raise ConfigError("host_cost_runs", host_cost_runs, "must be >= 0")
    check_op_timeout(op_timeout_s)
    check_processes("ranks" if num_ranks else "stages", num_ranks or num_stages)
    for name in names:  # each schedule's shape, refused before minutes of profiling and link timing
        run_schedule(name, num_stages, num_microbatches, num_minibatches, pipemare_update=pipemare_update,
                     num_ranks=num_ranks)
    check_backend("gloo", device)  # names the device (validate picks the backend: NCCL on CUDA)
    check_backend("nccl" if device == "cuda" else "gloo", device, num_ranks or num_stages)
    if profile_path:
        profile = load_profile(profile_path)
        spec = spec_of(profile, profile_path)
        if spec is None:
            raise ConfigError("profile", profile_path, "was not written by pipesim profile, so its model is unknown")
        context = click.get_current_context()
        named = context.get_parameter_source("model") is click.core.ParameterSource.COMMANDLINE
        spec = model_to_rebuild(spec, model if named else None, profile_path)
        if microbatch_size is not None and microbatch_size != profile.microbatch_size:
            raise ConfigError("microbatch_size", microbatch_size, f"must equal the profile's "
                              f"({profile.microbatch_size}): a profile was measured at its size")
        for option, value in (("profile_repeats", profile_repeats), ("reprofile", reprofile)):
            if context.get_parameter_source(option) is click.core.ParameterSource.COMMANDLINE:
                raise ConfigError(option, value, "applies where validate measures the profile; --profile gives it")
    else:
        spec = build_spec(model, depth, width, seq_len, heads, input_shape, seed)
        microbatch_size = microbatch_size or default_microbatch_size(model)
    op_times = op_times or ("layers" if compute == "emulated" else "calibrated")
    if compute == "emulated" and op_times == "calibrated":
        raise ConfigError("op_times", op_times, "emulated ops last their predicted durations: use --op-times layers")
    calibration_run = CalibrationRun(num_microbatches=calibration_microbatches,
                                     num_minibatches=calibration_minibatches, statistic=statistic, device=device,
                                     schedule=calibration_schedule)
    training = build_training(learning_rate, pipemare_warmup_updates, pipemare_correction, pipemare_correction_decay)
    try:
        if not profile_path:
            assert microbatch_size is not None
            timing = Timing(repeats=profile_repeats, statistic=statistic, processes=num_ranks or num_stages,
                            device=device)
            first = measure_profile(spec, microbatch_size, timing=timing)
            profile = first.profile
        if topology_path:
            topology = load_topology(topology_path)
        else:
            largest = int(max(layer.activation_bytes for layer in profile.layers))
            topology, _ = measure_links(num_ranks or num_stages, max_bytes=max(4, largest),
                                        backend="nccl" if device == "cuda" else "gloo")
        host_cost_s = (host_cost(profile, topology, spec, num_ranks or num_stages, runs=host_cost_runs,
                                 num_microbatches=num_microbatches, num_minibatches=max(3, num_minibatches),
                                 device=device, op_timeout_s=op_timeout_s, realtime_priority=realtime_priority)
                       if compute == "emulated" and host_cost_runs else 0.0)
        validations = []
        for name in names:
            source: Profile | FreshProfiles = profile
            if reprofile and not profile_path:
                source = FreshProfiles(lambda: measure_profile(spec, microbatch_size or 1, timing=timing),
                                       first=first if name == names[0] else None)
            validations.append(ScheduleValidation(
                source, topology, spec, schedule=name, num_stages=num_stages, num_microbatches=num_microbatches,
                num_minibatches=num_minibatches, training=training, pipemare_update=pipemare_update,
                op_timeout_s=op_timeout_s, device=device, backend="nccl" if device == "cuda" else "gloo",
                num_ranks=num_ranks, spread_draws=spread_draws, compute=compute, host_cost_s=host_cost_s,
                realtime_priority=realtime_priority,
                calibration=None if op_times == "layers" else
                lambda times, run: calibrate(times, spec, run.partition, calibration_run, op_timeout_s=op_timeout_s,
                                             num_ranks=num_ranks, for_run=(run.num_microbatches, run.num_minibatches))))
        reports = [comparison.to_dict() for comparison in validate_interleaved(validations, repeats)]
    except RunFailedError as error:
        run_failed(error)
        return
    if as_json:
        click.echo(json.dumps(reports, sort_keys=True))  # a list whatever the number of schedules
        return
    for report in reports:
        print_report(report)


def print_report(report: dict[str, object]) -> None:
    """One schedule's comparison as a few readable lines."""
    predicted, measured = report["predicted"], report["measured"]
    assert isinstance(predicted, dict) and isinstance(measured, dict)
    runs = ", ".join(f"{t * 1e3:.2f}" for t in measured["iteration_time_s_runs"])
    click.echo(f"{report['schedule']}: p={report['num_stages']} m={report['num_microbatches']} "
               f"K={report['num_minibatches']} partition {report['partition']}")
    click.echo(f"  iteration time  predicted {predicted['iteration_time_s'] * 1e3:.3f} ms  measured "
               f"{measured['iteration_time_s'] * 1e3:.3f} ms (runs: {runs})  "
               f"error {report['iteration_time_error']:+.1%}")
    host = report.get("host_cost_s")
    if isinstance(host, float) and host > 0:
        click.echo(f"  the prediction adds the host's measured {host * 1e6:.0f} us per F and B op "
                   "(separate emulated 1F1B runs; see --host-cost-runs)")
    mean_ops = predicted.get("mean_op_times_iteration_time_s_runs")
    if isinstance(mean_ops, list):
        click.echo("  predicted as the expectation over the calibration run's op-time spread; its mean op times "
                   "alone predicted " + ", ".join(f"{t * 1e3:.3f}" for t in mean_ops) + " ms")
    layer = report.get("layer_profile")
    if isinstance(layer, dict):
        click.echo(f"  op times from a separate {report['op_times']}; the layer profile alone predicted "
                   + ", ".join(f"{t * 1e3:.3f}" for t in layer["iteration_time_s_runs"])
                   + f" ms: error {layer['iteration_time_error']:+.1%}")
    parts = report.get("error_contributions_runs")
    if isinstance(parts, list) and parts and parts[0]:
        keys = [key for key in parts[0] if all(key in run for run in parts)]
        click.echo("  error by op kind and the waits between ops (predicted less measured time per minibatch, "
                   "median over runs): " + ", ".join(
                       f"{key} {statistics.median(run[key] for run in parts):+.1%}" for key in keys))
    replays = report["replay_error_runs"]
    assert isinstance(replays, list)
    click.echo("  replayed with each run's own op times: error " + ", ".join(f"{e:+.1%}" for e in replays)
               + " (the engine's order and communication model alone)")
    if len(measured["iteration_time_s_runs"]) > 1:
        click.echo(f"  {report['compute']} compute; median error {report['median_error']:+.1%}, noise floor "
                   f"{report['noise_floor']:.1%} (largest distance of a run from the runs' median), prediction "
                   f"{'inside' if report['inside_spread'] else 'outside'} the runs' spread")
    else:
        click.echo(f"  {report['compute']} compute; error {report['median_error']:+.1%} (one run: no noise floor; "
                   "--repeats 3 or more gives one)")
    # A stage's utilization is its rank's (the stages a rank holds under --ranks share one figure).
    for stage, (pu, mu) in enumerate(zip(predicted["utilization"], measured["utilization"], strict=True)):
        pm, mm = predicted["peak_memory_bytes"][stage], measured["peak_memory_bytes"][stage]
        click.echo(f"  stage {stage}: its rank's utilization predicted {pu:.1%} measured {mu:.1%}; "
                   f"peak tracked memory predicted {pm / 1e6:.3f} MB measured {mm / 1e6:.3f} MB")
    shares = measured.get("cpu_share_runs")
    # (Emulated ops sleep: their ranks' CPU share says nothing of the host.)
    if report["compute"] == "real" and isinstance(shares, list) and shares and \
            all(isinstance(run, list) and run for run in shares):
        per_rank = [statistics.median(run[rank] for run in shares if run[rank] is not None)
                    if any(run[rank] is not None for run in shares) else None for rank in range(len(shares[0]))]
        click.echo("  CPU share per rank (median over runs; below 1: the OS gave its core to others): "
                   + ", ".join(f"{share:.2f}" if share is not None else "-" for share in per_rank))
    times = report.get("op_times_runs")
    if isinstance(times, list) and times and isinstance(times[0], dict) and "predicted" in times[0]:
        keys = [key for key in times[0]["predicted"] if all(key in run.get("measured", {}) for run in times)]
        click.echo("  mean op time per stage and kind, predicted / measured ms (median over runs): " + ", ".join(
            f"{key} {statistics.median(run['predicted'][key] for run in times) * 1e3:.3f}/"
            f"{statistics.median(run['measured'][key] for run in times) * 1e3:.3f}" for key in keys))
    verdict = "all match" if report["versions_match"] else f"MISMATCH: {report['version_mismatches']}"
    click.echo(f"  weight versions: {report['version_ops_compared']} ops compared, {verdict}")
