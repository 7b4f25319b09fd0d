"""Predicted against measured: simulate a schedule, run it for real (or on the emulated device), and compare.

A ``ScheduleValidation`` runs one schedule once per call, so that the runs of several schedules
interleave (A B C A B C): a machine whose speed drifts then weighs on every schedule alike.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from pipesim.engine.trace import Trace
from pipesim.errors import ConfigError
from pipesim.harness.breakdown import contributions, op_rows
from pipesim.harness.comparison import Comparison, RunComparison, compare_versions, op_means
from pipesim.harness.config import COMPUTE_MODES, ModelSpec, RunConfig, TrainingOptions
from pipesim.harness.handoffs import hand_off_parts, without_local_hand_offs
from pipesim.harness.launch import launch
from pipesim.harness.op_context import ContextKey, in_context
from pipesim.harness.overheads import OpCosts, with_host_cost
from pipesim.harness.prediction import emulation_of, predict
from pipesim.harness.variability import expected_iteration_time
from pipesim.metrics import compute_metrics
from pipesim.simulation import PreparedRun, prepare, run_program
from pipesim.spec.profile import Profile
from pipesim.spec.stages import balance_partition
from pipesim.spec.topology import Topology


def replay(program: PreparedRun, measured: Trace) -> Trace:
    """Simulate ``program`` again with every op lasting as long as it did in ``measured``."""
    durations = {(span.device, span.position): span.end_s - span.start_s
                 for span in measured.iter_spans() if span.stream == "compute"}
    table = program.ops
    replayed = np.array([durations[(int(rank), int(position))]
                         for rank, position in zip(table.rank, table.position, strict=True)])
    return run_program(program, durations_s=replayed)


class Measured(Protocol):
    """What a profile measurement gives: the profile and the CPU share of its timings."""

    @property
    def profile(self) -> Profile: ...  # noqa: D102

    @property
    def cpu_share(self) -> float: ...  # noqa: D102


class FreshProfiles:
    """A profile source for ``ScheduleValidation``: a new measurement before every run.

    Args:
        measure: measures a profile (``pipesim.harness.profiler.measure_profile`` bound to a model).
        first: a measurement already made, used for the first run.
    """

    def __init__(self, measure: Callable[[], Measured], first: Measured | None = None) -> None:
        self.measure = measure
        self.first = first

    def __call__(self) -> tuple[Profile, float]:
        """The next profile and its CPU share."""
        measured, self.first = self.first or self.measure(), None
        return measured.profile, measured.cpu_share


ProfileSource = Callable[[], tuple[Profile, float]]


class CalibratedTimes(Protocol):
    """What a calibration gives (pipesim.harness.calibration.Calibrated)."""

    @property
    def profile(self) -> Profile: ...  # noqa: D102

    @property
    def cpu_share(self) -> float: ...  # noqa: D102

    @property
    def op_spread(self) -> tuple[OpCosts, ...]: ...  # noqa: D102

    @property
    def traces(self) -> tuple[Trace, ...]: ...  # noqa: D102

    @property
    def context_s(self) -> dict[ContextKey, float]: ...  # noqa: D102


# Given the layer profile and the run to be calibrated (its partition, ranks, microbatches and
# minibatches), a profile calibrated for that partition.
Calibration = Callable[[Profile, RunConfig], CalibratedTimes]



class ScheduleValidation:
    """One schedule's validation: each ``run_once`` predicts, runs and compares once.

    Args:
        profile: a Profile used for every run, or a function measuring a fresh one (and its CPU
            share) before each run, so that on a machine whose load drifts each prediction is
            made in the conditions of the run it predicts. Every run uses the partition of the
            first profile, so every run cuts the model at the same layers.
        topology: the links the prediction uses.
        spec: the model every rank builds.
        schedule, num_stages, num_microbatches, num_minibatches: what runs.
        num_ranks: processes, for schedules that put several stages on a rank (0: one per stage).
        calibration: when given (real compute only), the prediction's op times come from it
            (called before every run with the layer profile and the run's config: a separate
            calibration run of the real runtime, never the validated run), and the layer
            profile's own prediction is kept beside it (``RunComparison.layer_predicted``).
        spread_draws: with a calibration, the predicted iteration time is the mean over this
            many seeded draws of op times with the calibration run's spread (see
            pipesim.harness.variability); 0 predicts from the mean op times alone.
        compute: ``"real"``, or ``"emulated"``: every op waits out its predicted duration
            instead of computing (pipesim.harness.rank.emulated).
        host_cost_s: emulated compute only: the host's own seconds per F and B op with an input
            from another rank, beyond the device's durations (pipesim.harness.overheads.host_cost), added to the prediction
            the run is compared with; the emulated ops last the durations predicted without it.
        realtime_priority: emulated compute only: the ranks' SCHED_RR priority (see
            ``pipesim.harness.config.Emulation``); 0: the OS's normal policy.
        trace_folder: where each run's measured trace is kept, gzipped, as
            ``SCHEDULE-COMPUTE-runN.json.gz`` (None: not kept).

    Raises:
        ConfigError: an unknown compute mode, a calibration with emulated compute, or a host cost
            or a real-time priority with real compute, or either out of range.
    """

    def __init__(self, profile: Profile | ProfileSource, topology: Topology, spec: ModelSpec, *, schedule: str,
                 num_stages: int, num_microbatches: int, num_minibatches: int,
                 training: TrainingOptions | None = None, pipemare_update: str = "minibatch",
                 partition: tuple[tuple[int, int], ...] | None = None, op_timeout_s: float = 120.0,
                 backend: str = "gloo", device: str = "cpu", num_ranks: int = 0,
                 calibration: Calibration | None = None, spread_draws: int = 32, compute: str = "real",
                 host_cost_s: float = 0.0, realtime_priority: int = 0, trace_folder: Path | None = None) -> None:
        if compute not in COMPUTE_MODES:
            raise ConfigError("compute", compute, f"must be one of {', '.join(COMPUTE_MODES)}")
        if compute == "emulated" and calibration is not None:
            raise ConfigError("op_times", "calibrated", "emulated ops last their predicted durations: "
                                                        "use the layer profile")
        if host_cost_s < 0 or (host_cost_s and compute != "emulated"):
            raise ConfigError("host_cost_s", host_cost_s, "must be >= 0, and 0 unless compute is emulated")
        if realtime_priority and compute != "emulated":  # checked here too: the class is public
            raise ConfigError("realtime_priority", realtime_priority, "must be 0 unless compute is emulated")
        self.host_cost_s = host_cost_s
        self.realtime_priority = realtime_priority
        self.profile = profile
        self.topology = topology
        self.spec = spec
        self.schedule = schedule
        self.counts = (num_stages, num_microbatches, num_minibatches, num_ranks)
        self.training = training or TrainingOptions()
        self.pipemare_update = pipemare_update
        self.partition = partition
        self.op_timeout_s = op_timeout_s
        self.backend, self.device = backend, device
        self.calibration = calibration
        self.spread_draws = spread_draws
        self.compute = compute
        self.trace_folder = trace_folder
        self.runs: list[RunComparison] = []

    def _config(self, profile: Profile) -> RunConfig:
        num_stages, num_microbatches, num_minibatches, num_ranks = self.counts
        self.partition = self.partition or balance_partition(profile, num_stages)
        return RunConfig(model=self.spec, schedule=self.schedule, num_stages=num_stages,
                         num_microbatches=num_microbatches, num_minibatches=num_minibatches,
                         microbatch_size=profile.microbatch_size, partition=self.partition,
                         pipemare_update=self.pipemare_update, training=self.training, backend=self.backend,
                         device=self.device, num_ranks=num_ranks)

    def run_once(self) -> RunComparison:
        """Predict the next run, run it, and keep its comparison.

        Raises:
            RunFailedError: the run failed.
        """
        profile_share: float | None = None
        if isinstance(self.profile, Profile):
            current = self.profile
        else:
            current, profile_share = self.profile()
        config = self._config(current)
        layer_result, calibration_share = None, None
        spread: tuple[OpCosts, ...] = ()
        calibration_traces: tuple[Trace, ...] = ()
        contexts: dict[ContextKey, float] = {}
        if self.calibration is not None:
            layer_result = predict(current, self.topology, config)
            calibrated = self.calibration(current, config)
            current, calibration_share, spread = calibrated.profile, calibrated.cpu_share, calibrated.op_spread
            calibration_traces, contexts = calibrated.traces, calibrated.context_s
        device = predict(current, self.topology, config)
        if self.host_cost_s:
            current = with_host_cost(current, self.host_cost_s, config.partition,
                                     config.build_schedule().stage_to_rank)
        result = predict(current, self.topology, config) if self.host_cost_s else device
        program = prepare(current, self.topology, result.plan)
        durations = None
        if contexts:  # each op the calibrated time of its own context (pipesim.harness.op_context)
            # less the hand-overs to another rank that its stages, on one rank here, do not make
            durations = without_local_hand_offs(program, in_context(program, contexts),
                                                hand_off_parts(calibration_traces))
            in_order = run_program(program, durations_s=durations)
            result = dataclasses.replace(result, trace=in_order, metrics=compute_metrics(in_order))
        predicted, mean_ops = result.metrics, None
        expected = (expected_iteration_time(program, spread, draws=self.spread_draws, mean_s=durations)[0]
                    if spread and self.spread_draws else 0.0)
        if expected > 0:
            mean_ops = predicted.iteration_time_s
            predicted = dataclasses.replace(
                predicted, iteration_time_s=expected,
                throughput_samples_per_s=predicted.throughput_samples_per_s * mean_ops / expected)
        if self.compute == "emulated":
            config = dataclasses.replace(config, emulation=emulation_of(device.trace, current, config.partition,
                                                                        realtime_priority=self.realtime_priority))
        with tempfile.TemporaryDirectory(prefix="pipesim-validate-") as folder:
            trace_path = Path(folder) / "trace.json"
            launch(config.with_outputs(trace_out=trace_path), op_timeout_s=self.op_timeout_s)
            text = trace_path.read_text(encoding="utf-8")
            trace = Trace.from_json(text)
        if self.trace_folder is not None:
            keep_trace(text, self.trace_folder / f"{self.schedule}-{self.compute}-run{len(self.runs) + 1}.json.gz")
        peaks = trace.info.cuda_max_memory_allocated_bytes or ()
        measured = compute_metrics(trace)
        parts = contributions(result.trace, trace)
        if mean_ops is not None and measured.iteration_time_s > 0:
            parts["spread"] = (predicted.iteration_time_s - mean_ops) / measured.iteration_time_s
        run = RunComparison(
            predicted=predicted, measured=measured, replayed=compute_metrics(replay(program, trace)),
            versions=compare_versions(result.trace, trace), cpu_share=tuple(trace.info.cpu_share or ()),
            profile_cpu_share=profile_share, cuda_peaks=tuple(float(v) for v in peaks),
            layer_predicted=None if layer_result is None else layer_result.metrics,
            calibration_cpu_share=calibration_share, mean_ops_iteration_time_s=mean_ops,
            op_times={"predicted": op_means(result.trace), "measured": op_means(trace),
                      "measured_cpu": op_means(trace, cpu=True),
                      **({"layer_profile": op_means(layer_result.trace)} if layer_result is not None else {})},
            op_rows=tuple(op_rows(result.trace, trace)), contributions=parts,
            calibration_rows=tuple(row for made in calibration_traces for row in op_rows(made, made)))
        self.runs.append(run)
        return run

    def comparison(self) -> Comparison:
        """The runs so far against their predictions (at least one run must have been made)."""
        assert self.runs and self.partition is not None, "run_once first"
        notes = []
        if self.schedule == "pipemare" and self.training.pipemare_correction:
            notes.append("discrepancy correction adds work per backward and update that the profile does not time")
        return Comparison(runs=tuple(self.runs), partition=self.partition, notes=tuple(notes),
                          op_times="layer profile" if self.calibration is None else "calibration run",
                          compute=self.compute, host_cost_s=self.host_cost_s)


def keep_trace(text: str, path: Path) -> None:
    """Write a trace's JSON ``text`` gzipped (deterministic: no time stamp) to ``path``, folders made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_bytes(gzip.compress(text.encode("utf-8"), mtime=0))
    os.replace(partial, path)


def validate_interleaved(validations: Sequence[ScheduleValidation], repeats: int,
                         after_run: Callable[[ScheduleValidation], None] | None = None) -> list[Comparison]:
    """Run every validation ``repeats`` times, interleaved (A B C A B C); their comparisons.

    Raises:
        ConfigError: ``repeats`` below 1; RunFailedError: a run failed.
    """
    if repeats < 1:
        raise ConfigError("repeats", repeats, "must be >= 1")
    for _ in range(repeats):
        for validation in validations:
            validation.run_once()
            if after_run is not None:
                after_run(validation)
    return [validation.comparison() for validation in validations]

