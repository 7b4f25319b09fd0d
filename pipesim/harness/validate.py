"""Predicted against measured: profile, simulate, run for real, and compare time, utilization, memory, versions."""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipesim.engine.des import run_des
from pipesim.engine.lowering import Program
from pipesim.engine.trace import STREAMS, Trace
from pipesim.harness.config import ModelSpec, RunConfig, TrainingOptions
from pipesim.harness.launch import launch
from pipesim.metrics import Metrics, compute_metrics
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


def relative_error(predicted: float, measured: float) -> float:
    """``(predicted - measured) / measured`` (0 when both are 0)."""
    if measured == 0:
        return 0.0 if predicted == 0 else float("inf")
    return (predicted - measured) / measured


@dataclass(frozen=True)
class Comparison:
    """One schedule, predicted against measured over repeated runs.

    Attributes:
        predicted: the simulation's metrics.
        measured: the metrics of each run.
        versions: op-by-op version checks, one per run.
        partition: the layer ranges the stages ran.
        cpu_shares: per run, per rank, the fraction of its compute spans it actually had a CPU
            for (below 1 on a loaded machine: time the OS gave to other processes).
        replayed: per run, the simulation of the same schedule with each op lasting as long as it
            did in that run: it separates the engine's model of order and communication (replayed
            against measured) from the profile's op times (predicted against replayed).
        cuda_peaks: on GPU, per run, each rank's ``torch.cuda.max_memory_allocated``.
        notes: caveats of this comparison.
    """

    predicted: Metrics
    measured: tuple[Metrics, ...]
    versions: tuple[VersionCheck, ...]
    partition: tuple[tuple[int, int], ...]
    cpu_shares: tuple[tuple[float | None, ...], ...] = field(default=())
    replayed: tuple[Metrics, ...] = field(default=())
    cuda_peaks: tuple[tuple[float, ...], ...] = field(default=())
    notes: tuple[str, ...] = field(default=())

    @property
    def measured_iteration_time_s(self) -> float:
        """Median of the runs' steady-state iteration times."""
        return statistics.median(m.iteration_time_s for m in self.measured)

    @property
    def iteration_time_error(self) -> float:
        """Relative error of the prediction against the median run."""
        return relative_error(self.predicted.iteration_time_s, self.measured_iteration_time_s)

    @property
    def versions_match(self) -> bool:
        """True when every op of every run used the predicted weight version."""
        return all(check.matches for check in self.versions)

    def to_dict(self) -> dict[str, Any]:
        """The ``validate --json`` object."""
        p = self.predicted

        def side(metrics: list[Metrics], iteration: float) -> dict[str, Any]:
            return {
                "iteration_time_s": iteration,
                "utilization": [statistics.median(m.stages[s].utilization for m in metrics)
                                for s in range(p.num_stages)],
                "peak_memory_bytes": [max(m.stages[s].peak_memory_bytes for m in metrics)
                                      for s in range(p.num_stages)],
                "bubble_fraction": statistics.median(m.bubble_fraction for m in metrics),
                "window_start_s": statistics.median(m.window_start_s for m in metrics),
                "window_end_s": statistics.median(m.window_end_s for m in metrics),
            }

        predicted = side([p], p.iteration_time_s)
        measured = side(list(self.measured), self.measured_iteration_time_s)
        measured["iteration_time_s_runs"] = [m.iteration_time_s for m in self.measured]
        measured["cpu_share_runs"] = [list(shares) for shares in self.cpu_shares]
        replayed = [m.iteration_time_s for m in self.replayed]
        if self.cuda_peaks:
            measured["cuda_max_memory_allocated_bytes"] = [max(run[r] for run in self.cuda_peaks)
                                                           for r in range(len(self.cuda_peaks[0]))]
        return {
            "schedule": p.schedule,
            "num_stages": p.num_stages,
            "num_microbatches": p.num_microbatches,
            "num_minibatches": p.num_minibatches,
            "warmup_minibatches": p.warmup_minibatches,
            "cooldown_minibatches": p.cooldown_minibatches,
            "partition": [list(r) for r in self.partition],
            "predicted": predicted,
            "measured": measured,
            "iteration_time_error": self.iteration_time_error,
            "iteration_time_errors_runs": [relative_error(p.iteration_time_s, m.iteration_time_s)
                                           for m in self.measured],
            "utilization_error": [pu - mu for pu, mu in zip(predicted["utilization"], measured["utilization"],
                                                            strict=True)],
            "peak_memory_error": [relative_error(pm, mm) for pm, mm in zip(
                predicted["peak_memory_bytes"], measured["peak_memory_bytes"], strict=True)],
            "replayed_iteration_time_s_runs": replayed,
            "replay_error_runs": [relative_error(r, m.iteration_time_s) for r, m in zip(replayed, self.measured,
                                                                                          strict=True)],
            "versions_match": self.versions_match,
            "version_ops_compared": sum(check.num_ops for check in self.versions),
            "version_mismatches": [m for check in self.versions for m in check.mismatches][:20],
            "notes": list(self.notes),
        }


def validate_schedule(profile: Profile, topology: Topology, spec: ModelSpec, *, schedule: str, num_stages: int,
                      num_microbatches: int, num_minibatches: int, repeats: int = 3,
                      training: TrainingOptions | None = None, pipemare_update: str = "minibatch",
                      partition: tuple[tuple[int, int], ...] | None = None, op_timeout_s: float = 120.0,
                      backend: str = "gloo", device: str = "cpu") -> Comparison:
    """Simulate ``schedule`` on ``profile`` and ``topology``, run it ``repeats`` times, and compare.

    The runs use the simulation's partition, so both cut the model at the same layers.

    Raises:
        ConfigError: bad counts or a profile whose model cannot be built;
        RunFailedError: a run failed.
    """
    cuts = partition or balance_partition(profile, num_stages)
    result = simulate(profile, topology, schedule=schedule, num_stages=num_stages, num_microbatches=num_microbatches,
                      num_minibatches=num_minibatches, partition=cuts, optimizer_state_multiplier=0.0,
                      pipemare_update=pipemare_update)
    config = RunConfig(model=spec, schedule=schedule, num_stages=num_stages, num_microbatches=num_microbatches,
                       num_minibatches=num_minibatches, microbatch_size=profile.microbatch_size, partition=cuts,
                       pipemare_update=pipemare_update, training=training or TrainingOptions(), backend=backend,
                       device=device)
    program = prepare(profile, topology, result.plan)
    measured, checks, shares, replayed = [], [], [], []
    peaks: list[tuple[float, ...]] = []
    with tempfile.TemporaryDirectory(prefix="pipesim-validate-") as folder:
        trace_path = Path(folder) / "trace.json"
        for _ in range(repeats):
            launch(config.with_outputs(trace_out=trace_path), op_timeout_s=op_timeout_s)
            trace = Trace.from_json(trace_path.read_text(encoding="utf-8"))
            measured.append(compute_metrics(trace))
            checks.append(compare_versions(result.trace, trace))
            shares.append(tuple(trace.meta.get("cpu_share") or ()))
            replayed.append(compute_metrics(replay(program, trace)))
            if trace.meta.get("cuda_max_memory_allocated_bytes"):
                peaks.append(tuple(float(v) for v in trace.meta["cuda_max_memory_allocated_bytes"]))
    notes = []
    if schedule == "pipemare" and training is not None and training.pipemare_correction:
        notes.append("discrepancy correction adds work per backward and update that the profile does not time")
    return Comparison(predicted=result.metrics, measured=tuple(measured), versions=tuple(checks), partition=cuts,
                      cpu_shares=tuple(shares), replayed=tuple(replayed), cuda_peaks=tuple(peaks),
                      notes=tuple(notes))
