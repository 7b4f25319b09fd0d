"""Predicted against measured: profile, simulate, run for real, and compare time, utilization, memory, versions."""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from pipesim.engine.des import run_des
from pipesim.engine.lowering import Program
from pipesim.engine.trace import STREAMS, Trace
from pipesim.harness.config import ModelSpec, RunConfig, TrainingOptions
from pipesim.harness.launch import launch
from pipesim.harness.overheads import OpCosts
from pipesim.harness.variability import expected_iteration_time
from pipesim.metrics import Metrics, compute_metrics
from pipesim.schedule.ir import Op
from pipesim.simulation import Result as SimulationResult
from pipesim.simulation import prepare, simulate
from pipesim.spec.profile import Profile
from pipesim.spec.stages import balance_partition
from pipesim.spec.topology import Topology

_COMPUTE = STREAMS.index("compute")


@dataclass(frozen=True)
class VersionCheck:
    """Op-by-op agreement of weight versions between a prediction and a run."""

    num_ops: int
    mismatches: tuple[str, ...]

    @property
    def matches(self) -> bool:
        """True when every op ran on the predicted version (and the same ops ran)."""
        return not self.mismatches


def compare_versions(predicted: Trace, measured: Trace) -> VersionCheck:
    """Every compute op's weight version in ``measured`` against ``predicted``, keyed by op text."""

    def versions(trace: Trace) -> dict[str, int]:
        return {span.op: span.weight_version for span in trace.iter_spans() if span.stream == "compute"}

    expected, actual = versions(predicted), versions(measured)
    mismatches = [f"{op}: predicted {expected.get(op)}, measured {actual.get(op)}"
                  for op in sorted(set(expected) | set(actual)) if expected.get(op) != actual.get(op)]
    return VersionCheck(num_ops=len(expected), mismatches=tuple(mismatches))


def replay(program: Program, measured: Trace) -> Trace:
    """Simulate ``program`` again with every op lasting as long as it did in ``measured``."""
    durations = {(span.device, span.position): span.end_s - span.start_s
                 for span in measured.iter_spans() if span.stream == "compute"}
    table = program.ops
    replayed = np.array([durations[(int(rank), int(position))] for rank, position in zip(table.rank, table.position,
                                                                                          strict=True)])
    return run_des(dataclasses.replace(program, ops=dataclasses.replace(table, duration_s=replayed)))


def op_means(trace: Trace, *, cpu: bool = False) -> dict[str, float]:
    """Per stage and kind ("0F", "1B", ...), the mean compute span in the steady-state minibatches
    (all but the first and the last); with ``cpu``, the mean thread CPU time of the same spans
    from the run info's ``compute_cpu_s`` of a measured trace (absent: an empty dict)."""
    last = trace.info.num_minibatches - 1
    cpu_s = trace.info.compute_cpu_s if cpu else None
    if cpu and not cpu_s:
        return {}
    samples: dict[str, list[float]] = {}
    for span in trace.iter_spans():
        if span.stream != "compute" or not 1 <= span.minibatch < last:
            continue
        if cpu_s is not None:
            rank_cpu_s = cpu_s[span.device]
            seconds = rank_cpu_s[span.position] if rank_cpu_s is not None else -1.0
            if seconds < 0:
                continue
        else:
            seconds = span.end_s - span.start_s
        samples.setdefault(f"{span.stage}{Op.parse(span.op).kind.value}", []).append(seconds)
    return {key: statistics.fmean(values) for key, values in sorted(samples.items())}


def relative_error(predicted: float, measured: float) -> float:
    """``(predicted - measured) / measured`` (0 when both are 0)."""
    if measured == 0:
        return 0.0 if predicted == 0 else float("inf")
    return (predicted - measured) / measured


@dataclass(frozen=True)
class RunComparison:
    """One real run against its prediction.

    Attributes:
        predicted: the simulation's metrics (from the profile measured for this run, or shared).
        measured: the run's metrics.
        replayed: the simulation again with each op lasting as long as it did in the run: it
            separates the engine's model of order and communication (replayed against
            measured) from the profile's op times (predicted against replayed).
        versions: op-by-op check of weight versions.
        cpu_share: per rank, the fraction of its busy time it had a CPU for (below 1 on a
            loaded machine: time the OS gave to other processes, which no profile predicts).
        profile_cpu_share: the same for the profile's timings, when measured for this run.
        cuda_peaks: on GPU, each rank's ``torch.cuda.max_memory_allocated``.
        layer_predicted: when ``predicted`` comes from calibrated op times, the prediction of
            the plain layer profile, reported beside it.
        calibration_cpu_share: the CPU share of the calibration run, when there was one.
        op_times: per column (``predicted``, ``layer_profile``, ``measured``, ``measured_cpu``),
            per stage and kind ("0F"), the mean op time in the steady state (see ``op_means``).
        mean_ops_iteration_time_s: when ``predicted``'s iteration time is the expectation over
            the calibration run's op-time spread (see pipesim.harness.variability), the
            iteration time of the mean op times alone.
    """

    predicted: Metrics
    measured: Metrics
    replayed: Metrics
    versions: VersionCheck
    cpu_share: tuple[float | None, ...] = ()
    profile_cpu_share: float | None = None
    cuda_peaks: tuple[float, ...] = ()
    layer_predicted: Metrics | None = None
    calibration_cpu_share: float | None = None
    op_times: dict[str, dict[str, float]] = field(default_factory=dict)
    mean_ops_iteration_time_s: float | None = None

    @property
    def iteration_time_error(self) -> float:
        """``(predicted - measured) / measured`` of the steady-state iteration time."""
        return relative_error(self.predicted.iteration_time_s, self.measured.iteration_time_s)

    @property
    def layer_profile_error(self) -> float | None:
        """With a calibrated prediction, the error the plain layer profile alone would have had."""
        if self.layer_predicted is None:
            return None
        return relative_error(self.layer_predicted.iteration_time_s, self.measured.iteration_time_s)


@dataclass(frozen=True)
class Comparison:
    """One schedule, predicted against measured over repeated runs.

    Attributes:
        runs: each run against its prediction.
        partition: the layer ranges the stages ran.
        notes: caveats of this comparison.
        op_times: where the predicted op times came from: ``"layer profile"`` or
            ``"calibration run"`` (see pipesim.harness.calibration).
    """

    runs: tuple[RunComparison, ...]
    partition: tuple[tuple[int, int], ...]
    notes: tuple[str, ...] = field(default=())
    op_times: str = "layer profile"

    @property
    def iteration_time_error(self) -> float:
        """The median over runs of each run's relative error (with one profile for all runs, the
        error of the prediction against the median run)."""
        return statistics.median(run.iteration_time_error for run in self.runs)

    @property
    def versions_match(self) -> bool:
        """True when every op of every run used the predicted weight version."""
        return all(run.versions.matches for run in self.runs)

    def to_dict(self) -> dict[str, Any]:
        """The ``validate --json`` object."""
        first = self.runs[0].predicted
        stages = range(first.num_stages)

        def side(metrics: list[Metrics]) -> dict[str, Any]:
            return {
                "iteration_time_s": statistics.median(m.iteration_time_s for m in metrics),
                "utilization": [statistics.median(m.stages[s].utilization for m in metrics) for s in stages],
                "peak_memory_bytes": [max(m.stages[s].peak_memory_bytes for m in metrics) for s in stages],
                "bubble_fraction": statistics.median(m.bubble_fraction for m in metrics),
                "window_start_s": statistics.median(m.window_start_s for m in metrics),
                "window_end_s": statistics.median(m.window_end_s for m in metrics),
            }

        predicted = side([run.predicted for run in self.runs])
        predicted["iteration_time_s_runs"] = [run.predicted.iteration_time_s for run in self.runs]
        if all(run.mean_ops_iteration_time_s is not None for run in self.runs):
            predicted["mean_op_times_iteration_time_s_runs"] = [run.mean_ops_iteration_time_s for run in self.runs]
        measured = side([run.measured for run in self.runs])
        measured["iteration_time_s_runs"] = [run.measured.iteration_time_s for run in self.runs]
        measured["cpu_share_runs"] = [list(run.cpu_share) for run in self.runs]
        if self.runs[0].profile_cpu_share is not None:
            predicted["profile_cpu_share_runs"] = [run.profile_cpu_share for run in self.runs]
        if self.runs[0].cuda_peaks:
            measured["cuda_max_memory_allocated_bytes"] = [max(run.cuda_peaks[r] for run in self.runs)
                                                           for r in range(len(self.runs[0].cuda_peaks))]
        return {
            "schedule": first.schedule,
            "num_stages": first.num_stages,
            "num_microbatches": first.num_microbatches,
            "num_minibatches": first.num_minibatches,
            "warmup_minibatches": first.warmup_minibatches,
            "cooldown_minibatches": first.cooldown_minibatches,
            "partition": [list(r) for r in self.partition],
            "predicted": predicted,
            "measured": measured,
            "iteration_time_error": self.iteration_time_error,
            "iteration_time_errors_runs": [run.iteration_time_error for run in self.runs],
            "replayed_iteration_time_s_runs": [run.replayed.iteration_time_s for run in self.runs],
            "replay_error_runs": [relative_error(run.replayed.iteration_time_s, run.measured.iteration_time_s)
                                  for run in self.runs],
            "utilization_error": [pu - mu for pu, mu in zip(predicted["utilization"], measured["utilization"],
                                                            strict=True)],
            "peak_memory_error": [relative_error(pm, mm) for pm, mm in zip(
                predicted["peak_memory_bytes"], measured["peak_memory_bytes"], strict=True)],
            "op_times": self.op_times,
            "op_times_runs": [run.op_times for run in self.runs],
            **self._layer_profile(),
            "versions_match": self.versions_match,
            "version_ops_compared": sum(run.versions.num_ops for run in self.runs),
            "version_mismatches": [m for run in self.runs for m in run.versions.mismatches][:20],
            "notes": list(self.notes),
        }


    def _layer_profile(self) -> dict[str, Any]:
        """With calibrated op times, the plain layer profile's prediction and error, beside them."""
        if any(run.layer_predicted is None for run in self.runs):
            return {}
        times = [run.layer_predicted.iteration_time_s for run in self.runs if run.layer_predicted is not None]
        errors = [run.layer_profile_error for run in self.runs]
        return {"layer_profile": {"iteration_time_s_runs": times,
                                  "iteration_time_error": statistics.median(e for e in errors if e is not None),
                                  "iteration_time_errors_runs": errors},
                "calibration_cpu_share_runs": [run.calibration_cpu_share for run in self.runs]}


class Measured(Protocol):
    """What a profile measurement gives: the profile and the CPU share of its timings."""

    @property
    def profile(self) -> Profile: ...  # noqa: D102

    @property
    def cpu_share(self) -> float: ...  # noqa: D102


class FreshProfiles:
    """A profile source for ``validate_schedule``: a new measurement before every run.

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


# Given the layer profile and the partition, a calibrated profile for that partition.
Calibration = Callable[[Profile, tuple[tuple[int, int], ...]], CalibratedTimes]


def validate_schedule(profile: Profile | ProfileSource, topology: Topology, spec: ModelSpec, *, schedule: str,
                      num_stages: int, num_microbatches: int, num_minibatches: int, repeats: int = 3,
                      training: TrainingOptions | None = None, pipemare_update: str = "minibatch",
                      partition: tuple[tuple[int, int], ...] | None = None, op_timeout_s: float = 120.0,
                      backend: str = "gloo", device: str = "cpu", num_ranks: int = 0,
                      calibration: Calibration | None = None, spread_draws: int = 32) -> Comparison:
    """Simulate ``schedule`` on a profile and ``topology``, run it ``repeats`` times, and compare.

    Args:
        num_ranks: processes, for schedules that put several stages on a rank (0: one per stage).
        profile: a Profile used for every run, or a function measuring a fresh one (and its CPU
            share) before each run, so that on a machine whose load drifts each prediction is
            made in the conditions of the run it predicts. The runs use the partition of the
            first profile, so every run cuts the model at the same layers.
        calibration: when given, the prediction's op times come from it (called before every
            run with the layer profile and the partition: a separate calibration run of the
            real runtime, never the validated run), and the layer profile's own prediction is
            kept beside it (``RunComparison.layer_predicted``).
        spread_draws: with a calibration, the predicted iteration time is the mean over this
            many seeded draws of op times with the calibration run's spread (see
            pipesim.harness.variability); 0 predicts from the mean op times alone.

    Raises:
        ConfigError: bad counts or a profile whose model cannot be built;
        RunFailedError: a run failed.
    """
    fixed = profile if isinstance(profile, Profile) else None
    cuts = partition
    config: RunConfig | None = None
    runs = []
    with tempfile.TemporaryDirectory(prefix="pipesim-validate-") as folder:
        trace_path = Path(folder) / "trace.json"
        for _ in range(repeats):
            profile_share: float | None = None
            if fixed is not None:
                current = fixed
            else:
                assert callable(profile)
                current, profile_share = profile()
            cuts = cuts or balance_partition(current, num_stages)

            def predict(times: Profile) -> SimulationResult:
                assert cuts is not None
                return simulate(times, topology, schedule=schedule, num_stages=num_stages,
                                num_microbatches=num_microbatches, num_minibatches=num_minibatches, partition=cuts,
                                optimizer_state_multiplier=0.0, pipemare_update=pipemare_update,
                                stages_per_rank=num_stages // num_ranks if num_ranks else 1)

            layer_result, calibration_share = None, None
            spread: tuple[OpCosts, ...] = ()
            if calibration is not None:
                layer_result = predict(current)
                calibrated = calibration(current, cuts)
                current, calibration_share, spread = calibrated.profile, calibrated.cpu_share, calibrated.op_spread
            result = predict(current)
            program = prepare(current, topology, result.plan)
            predicted, mean_ops = result.metrics, None
            expected = expected_iteration_time(program, spread, draws=spread_draws)[0] if spread and spread_draws else 0.0
            if expected > 0:
                mean_ops = predicted.iteration_time_s
                predicted = dataclasses.replace(
                    predicted, iteration_time_s=expected,
                    throughput_samples_per_s=predicted.throughput_samples_per_s * mean_ops / expected)
            if config is None:
                config = RunConfig(model=spec, schedule=schedule, num_stages=num_stages,
                                   num_microbatches=num_microbatches, num_minibatches=num_minibatches,
                                   microbatch_size=current.microbatch_size, partition=cuts,
                                   pipemare_update=pipemare_update, training=training or TrainingOptions(),
                                   backend=backend, device=device,
                                   num_ranks=num_ranks).with_outputs(trace_out=trace_path)
            launch(config, op_timeout_s=op_timeout_s)
            trace = Trace.from_json(trace_path.read_text(encoding="utf-8"))
            peaks = trace.info.cuda_max_memory_allocated_bytes or ()
            runs.append(RunComparison(
                predicted=predicted, measured=compute_metrics(trace),
                replayed=compute_metrics(replay(program, trace)),
                versions=compare_versions(result.trace, trace), cpu_share=trace.info.cpu_share or (),
                profile_cpu_share=profile_share, cuda_peaks=tuple(float(v) for v in peaks),
                layer_predicted=None if layer_result is None else layer_result.metrics,
                calibration_cpu_share=calibration_share, mean_ops_iteration_time_s=mean_ops,
                op_times={"predicted": op_means(result.trace), "measured": op_means(trace),
                          "measured_cpu": op_means(trace, cpu=True),
                          **({"layer_profile": op_means(layer_result.trace)} if layer_result is not None else {})}))
    notes = []
    if schedule == "pipemare" and training is not None and training.pipemare_correction:
        notes.append("discrepancy correction adds work per backward and update that the profile does not time")
    assert cuts is not None
    return Comparison(runs=tuple(runs), partition=cuts, notes=tuple(notes),
                      op_times="layer profile" if calibration is None else "calibration run")
