"""A schedule's prediction against its real runs: iteration time, replay, noise floor, utilization, memory, versions."""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from pipesim.engine.trace import Trace
from pipesim.harness.breakdown import OpRow, steady_ops
from pipesim.metrics import Metrics


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



def op_means(trace: Trace, *, cpu: bool = False) -> dict[str, float]:
    """Per stage and kind ("0F", "1B", ...), the mean compute span in the steady-state minibatches
    (all but the first and the last); with ``cpu``, the mean thread CPU time of the same spans
    from the run info's ``compute_cpu_s`` of a measured trace (absent: an empty dict)."""
    if cpu and not trace.info.compute_cpu_s:
        return {}
    samples: dict[str, list[float]] = {}
    for op in steady_ops(trace):
        seconds = op.cpu_s if cpu else op.duration_s
        if not math.isnan(seconds):
            samples.setdefault(f"{op.stage}{op.kind}", []).append(seconds)
    return {key: statistics.fmean(values) for key, values in sorted(samples.items())}


def row_dict(row: OpRow) -> dict[str, Any]:
    """One row of the op breakdown as JSON: its fields, NaN (not recorded) as null."""
    return {name: None if isinstance(value, float) and math.isnan(value) else value
            for name, value in dataclasses.asdict(row).items()}


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
        op_rows: per stage and kind, the steady-state ops' predicted durations against their
            measured spans and the spans' parts (pipesim.harness.breakdown.op_rows).
        contributions: the iteration-time error as a sum: per op kind and ``"waits"``, the
            predicted less the measured time per minibatch over the measured iteration time
            (pipesim.harness.breakdown.contributions), and ``"spread"``: what the expectation
            over the op-time spread added to the mean op times' prediction.
        calibration_rows: with calibrated op times, the calibration run's own steady-state ops
            per stage and kind and their parts (the rows of ``op_rows(calibration, calibration)``).
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
    op_rows: tuple[OpRow, ...] = ()
    contributions: dict[str, float] = field(default_factory=dict)
    calibration_rows: tuple[OpRow, ...] = ()

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
        compute: ``"real"`` (the layers computed) or ``"emulated"`` (ops waited out their
            predicted durations; see pipesim.harness.rank.emulated).
        host_cost_s: emulated: the host's own seconds per F and B op the prediction added
            (pipesim.harness.overheads.host_cost).
    """

    runs: tuple[RunComparison, ...]
    partition: tuple[tuple[int, int], ...]
    notes: tuple[str, ...] = field(default=())
    op_times: str = "layer profile"
    compute: str = "real"
    host_cost_s: float = 0.0

    @property
    def iteration_time_error(self) -> float:
        """The median over runs of each run's relative error (with one profile for all runs, the
        error of the prediction against the median run)."""
        return statistics.median(run.iteration_time_error for run in self.runs)

    @property
    def median_error(self) -> float:
        """The median over runs of each run's iteration-time error (``iteration_time_error``)."""
        return self.iteration_time_error

    @property
    def replay_error(self) -> float:
        """The median over runs of the replay's error: the simulation fed each op's measured
        duration against the run, which measures the schedule model with op times removed."""
        return statistics.median(relative_error(run.replayed.iteration_time_s, run.measured.iteration_time_s)
                                 for run in self.runs)

    @property
    def noise_floor(self) -> float:
        """The largest relative distance of a run's measured iteration time from the runs' median
        (0 for one run): errors below it cannot be told apart from the machine's own noise."""
        times = [run.measured.iteration_time_s for run in self.runs]
        middle = statistics.median(times)
        return max(abs(t - middle) for t in times) / middle if middle > 0 else 0.0

    @property
    def inside_spread(self) -> bool:
        """True when the median prediction lies between the fastest and the slowest measured run."""
        times = [run.measured.iteration_time_s for run in self.runs]
        predicted = statistics.median(run.predicted.iteration_time_s for run in self.runs)
        return min(times) <= predicted <= max(times)

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
            "median_error": self.median_error,
            "noise_floor": self.noise_floor,
            "inside_spread": self.inside_spread,
            "replay_error": self.replay_error,
            "compute": self.compute,
            "host_cost_s": self.host_cost_s,
            "replayed_iteration_time_s_runs": [run.replayed.iteration_time_s for run in self.runs],
            "replay_error_runs": [relative_error(run.replayed.iteration_time_s, run.measured.iteration_time_s)
                                  for run in self.runs],
            "utilization_error": [pu - mu for pu, mu in zip(predicted["utilization"], measured["utilization"],
                                                            strict=True)],
            "peak_memory_error": [relative_error(pm, mm) for pm, mm in zip(
                predicted["peak_memory_bytes"], measured["peak_memory_bytes"], strict=True)],
            "op_times": self.op_times,
            "op_times_runs": [run.op_times for run in self.runs],
            "op_breakdown_runs": [[row_dict(row) for row in run.op_rows] for run in self.runs],
            "error_contributions_runs": [run.contributions for run in self.runs],
            **({"calibration_breakdown_runs": [[row_dict(row) for row in run.calibration_rows] for run in self.runs]}
               if any(run.calibration_rows for run in self.runs) else {}),
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


