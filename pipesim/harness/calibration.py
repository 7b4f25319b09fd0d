"""Op times taken from a short calibration run of the real pipeline runtime, as a profile for one partition.

A layer profile times each layer alone; in a pipeline the same op runs while the peer rank
computes and gloo's threads copy messages, and its time differs. The calibration measures the
ops where they run: separate runs of the real runtime with fixed schedules (GPipe and 1F1B by
default, or either alone; never a run being validated) on as many processes as the run they
calibrate (with several stages per rank, GPipe's and 1F1B's forms for that: looped-bfs and
interleaved-1f1b), whose steady-state op times per stage and kind become the stage's op times,
and per stage, kind and the kind of the op before (pipesim.harness.op_context) the time each op
of a prediction takes in its own context: GPipe runs an F after an F, the 1F1B family after a B.

By default the calibration run has the microbatches and minibatches of the run it calibrates, so
that its op times come from the same point of a rank's life as the run's steady-state window
(minibatches 1..K-2): a rank's ops are slower in its first minibatches than later (its memory is
still being mapped: tens of thousands of page faults in minibatch 0, one or two thousand in
minibatch 1; on the 2-core reference host the F of minibatch 1 ran 3-10% over the long-run mean,
benchmarks/RESULTS.md), and a short run measures them there.
The result is a Profile for one partition: each stage's layers are scaled, per kind, so that the
stage's op time (its layers plus the profile's per-op overheads) equals the calibration run's.
The spread (standard deviation) of each stage's ops of a kind is kept too:
pipesim.harness.variability turns it into the expected iteration time.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pipesim.engine.trace import Trace
from pipesim.errors import ConfigError
from pipesim.harness.breakdown import steady_ops
from pipesim.harness.config import ModelSpec, RunConfig
from pipesim.harness.config import summarize
from pipesim.harness.op_context import ContextKey, context_times
from pipesim.harness.overheads import KINDS, OpCosts
from pipesim.spec.profile import Layer, Profile

SCHEDULES = ("gpipe", "1f1b", "both")
# The runs each choice makes, and each calibration schedule's form with several stages per rank
# (stage s on rank s mod R).
RUNS = {"gpipe": ("gpipe",), "1f1b": ("1f1b",), "both": ("gpipe", "1f1b")}
LOOPED = {"gpipe": "looped-bfs", "1f1b": "interleaved-1f1b"}


@dataclass(frozen=True)
class CalibrationRun:
    """The calibration runs: ``schedule`` (GPipe, 1F1B, or both: one run of each) with ``num_microbatches``
    x ``num_minibatches``, each None for the calibrated run's own (at least 3 minibatches).

    The op times are the ``statistic`` of each stage's spans of a kind in the steady-state
    minibatches (the first and the last are dropped, as ``metrics.steady_window`` does).
    """

    num_microbatches: int | None = None
    num_minibatches: int | None = None
    statistic: str = "mean"
    threads: int = 1
    device: str = "cpu"
    schedule: str = "both"

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ConfigError("calibration_schedule", self.schedule, f"must be one of {', '.join(SCHEDULES)}")
        if self.num_microbatches is not None and self.num_microbatches < 1:
            raise ConfigError("calibration_microbatches", self.num_microbatches, "must be >= 1")
        if self.num_minibatches is not None and self.num_minibatches < 3:
            raise ConfigError("calibration_minibatches", self.num_minibatches,
                              "must be >= 3 (the first and the last are outside the steady state)")

    def counts(self, num_microbatches: int | None = None, num_minibatches: int | None = None) -> tuple[int, int]:
        """``(m, K)`` of the calibration run for a calibrated run of ``num_microbatches`` x
        ``num_minibatches`` (K at least 3).

        Raises:
            ConfigError: a count this calibration leaves to the calibrated run was not given.
        """
        m = self.num_microbatches if self.num_microbatches is not None else num_microbatches
        k = self.num_minibatches if self.num_minibatches is not None else num_minibatches
        if m is None or k is None:
            missing = "calibration_microbatches" if m is None else "calibration_minibatches"
            raise ConfigError(missing, None, "give the calibration's own or the calibrated run's")
        return m, max(3, k)

    def schedules_for(self, num_stages: int, num_ranks: int = 0) -> tuple[str, ...]:
        """The schedules of the runs for ``num_stages`` stages on ``num_ranks`` processes (0: one per stage)."""
        looped = num_ranks and num_ranks != num_stages
        return tuple(LOOPED[name] if looped else name for name in RUNS[self.schedule])

    def describe(self, num_stages: int = 1, num_ranks: int = 0, counts: tuple[int, int] | None = None) -> str:
        """One line saying what is measured (``counts``: the calibration's ``(m, K)``, when known)."""
        where = f" on {num_ranks} ranks" if num_ranks and num_ranks != num_stages else ""
        m, k = counts or (self.num_microbatches, self.num_minibatches)
        shape = (f"m={m if m is not None else 'as the run'} K={k if k is not None else 'as the run'}, "
                 f"the {self.statistic} of each stage's F, B and U spans in "
                 + (f"minibatches 1..{k - 2}" if k is not None else "the steady-state minibatches"))
        return (f"separate {' and '.join(self.schedules_for(num_stages, num_ranks))} runs of the real runtime{where}, "
                f"{shape}")


@dataclass(frozen=True)
class Calibrated:
    """A profile calibrated for one partition, and what went into it.

    Attributes:
        profile: the layer profile with each stage's layers scaled so that its op times are the
            calibration run's (valid for ``partition`` only).
        partition: the stages' layer ranges.
        op_times: per stage, the calibration run's op times (F, B, U).
        layer_op_times: per stage, the layer profile's prediction of the same ops.
        cpu_share: the smallest share of its busy time a rank of the calibration run had a CPU for.
        op_spread: per stage, the standard deviation of the calibration run's ops of each kind
            (F, B, U) in the same spans as ``op_times``.
        traces: the calibration runs' traces (their ops' parts: pipesim.harness.breakdown).
        context_s: per (stage, kind, kind of the op before) the runs saw often enough, the
            ``statistic`` of those ops' spans (pipesim.harness.op_context).
    """

    profile: Profile
    partition: tuple[tuple[int, int], ...]
    op_times: tuple[OpCosts, ...]
    layer_op_times: tuple[OpCosts, ...]
    cpu_share: float
    op_spread: tuple[OpCosts, ...] = ()
    traces: tuple[Trace, ...] = ()
    context_s: dict[ContextKey, float] = field(default_factory=dict)


def stage_op_times(profile: Profile, partition: tuple[tuple[int, int], ...]) -> tuple[OpCosts, ...]:
    """Per stage, the op times ``profile`` predicts: its layers' sum plus the per-op overheads."""
    overheads = OpCosts(profile.forward_overhead_s or 0.0, profile.backward_overhead_s or 0.0,
                        profile.update_overhead_s or 0.0)
    times = []
    for start, end in partition:
        layers = profile.layers[start:end]
        times.append(OpCosts(sum(layer.forward_s for layer in layers), sum(layer.backward_s for layer in layers),
                             sum(layer.update_s or 0.0 for layer in layers)) + overheads)
    return tuple(times)


def _steady_spans(traces: Trace | Sequence[Trace], num_stages: int) -> dict[tuple[int, str], list[float]]:
    """Per (stage, kind), the durations of its compute spans in the steady-state minibatches of
    ``traces`` (one trace, or several together)."""
    spans: dict[tuple[int, str], list[float]] = {}
    for trace in [traces] if isinstance(traces, Trace) else traces:
        for op in steady_ops(trace):
            spans.setdefault((op.stage, op.kind), []).append(op.duration_s)
    missing = [f"stage {s} {k}" for s in range(num_stages) for k in KINDS if (s, k) not in spans]
    if missing:
        raise ConfigError("calibration", ", ".join(missing), "the calibration run recorded no such op")
    return spans


def measured_op_times(traces: Trace | Sequence[Trace], num_stages: int, statistic: str) -> tuple[OpCosts, ...]:
    """Per stage, the ``statistic`` of its compute spans of each kind in the steady-state minibatches
    (of several traces together)."""
    spans = _steady_spans(traces, num_stages)
    return tuple(OpCosts(*(summarize(spans[(stage, kind)], statistic) for kind in KINDS))
                 for stage in range(num_stages))


def measured_op_spread(traces: Trace | Sequence[Trace], num_stages: int) -> tuple[OpCosts, ...]:
    """Per stage, the standard deviation (population) of its compute spans of each kind in the
    steady-state minibatches, the spans ``measured_op_times`` summarizes."""
    spans = _steady_spans(traces, num_stages)
    return tuple(OpCosts(*(statistics.pstdev(spans[(stage, kind)]) for kind in KINDS))
                 for stage in range(num_stages))


def scaled(profile: Profile, partition: tuple[tuple[int, int], ...], targets: tuple[OpCosts, ...]) -> Profile:
    """``profile`` with each stage's layers scaled, per kind, so that the stage's op times are ``targets``.

    A stage's layers keep their shares of the stage's time (equal shares when the profile gives
    the stage none of a kind); the per-op overheads stay as they are and are taken off the
    target first (a target below them leaves the layers at 0). A split backward's I and W, which
    the calibration run does not have, scale as the stage's B does.
    """
    overheads = OpCosts(profile.forward_overhead_s or 0.0, profile.backward_overhead_s or 0.0,
                        profile.update_overhead_s or 0.0)
    fields = {"F": "forward_s", "B": "backward_s", "U": "update_s"}
    layers: list[Layer] = []
    for (start, end), target in zip(partition, targets, strict=True):
        stage = profile.layers[start:end]
        changes: list[dict[str, float]] = [{} for _ in stage]
        for kind, name in fields.items():
            wanted = max(0.0, target.of(kind) - overheads.of(kind))
            times = [float(getattr(layer, name) or 0.0) for layer in stage]
            total = sum(times)
            for change, time_s in zip(changes, times, strict=True):
                change[name] = wanted * time_s / total if total > 0 else wanted / len(stage)
            if kind == "F" or kind == "B":
                ratio = wanted / total if total > 0 else 1.0
                scaled_too = ("forward_std_s",) if kind == "F" else ("backward_std_s", "backward_input_s",
                                                                      "backward_weight_s")
                for change, layer in zip(changes, stage, strict=True):
                    for name_too in scaled_too:
                        if getattr(layer, name_too) is not None:
                            change[name_too] = float(getattr(layer, name_too)) * ratio
        layers += [layer.model_copy(update=change) for layer, change in zip(stage, changes, strict=True)]
    return profile.model_copy(update={"layers": tuple(layers)})


def calibrate(profile: Profile, spec: ModelSpec, partition: tuple[tuple[int, int], ...],
              run: CalibrationRun | None = None, *, op_timeout_s: float = 120.0, num_ranks: int = 0,
              for_run: tuple[int, int] | None = None) -> Calibrated:
    """Run the calibration schedules on ``partition`` for real and return ``profile`` calibrated to them.

    ``num_ranks``: the processes of the run being calibrated (0: one per stage); with fewer
    ranks than stages the calibration runs its schedules' several-stages-per-rank forms on as many.
    ``for_run``: ``(m, K)`` of the run being calibrated, which the calibration takes where ``run``
    leaves its counts None. The op times of several runs are those of their ops together.

    Raises:
        ConfigError: a bad calibration shape or partition, or counts known to neither.
        RunFailedError: a calibration run failed.
    """
    from pipesim.harness.launch import launch

    run = run or CalibrationRun()
    counts = run.counts(*(for_run or (None, None)))
    num_stages = len(partition)
    ranks = num_ranks if num_ranks and num_ranks != num_stages else 0
    traces = []
    for schedule in run.schedules_for(num_stages, ranks):
        config = RunConfig(model=spec, schedule=schedule, num_stages=num_stages, num_microbatches=counts[0],
                           num_minibatches=counts[1], microbatch_size=profile.microbatch_size, partition=partition,
                           threads=run.threads, device=run.device, backend="nccl" if run.device == "cuda" else "gloo",
                           num_ranks=ranks)
        with tempfile.TemporaryDirectory(prefix="pipesim-calibration-") as folder:
            trace_path = Path(folder) / "trace.json"
            launch(config.with_outputs(trace_out=trace_path), op_timeout_s=op_timeout_s)
            traces.append(Trace.from_json(trace_path.read_text(encoding="utf-8")))
    targets = measured_op_times(traces, num_stages, run.statistic)
    calibrated = scaled(profile, partition, targets).model_copy(update={
        "device": f"{profile.device}; op times per stage from {run.describe(num_stages, ranks, counts)}, "
                  f"partition {[list(r) for r in partition]}"})
    shares = [share for trace in traces for share in trace.info.cpu_share or () if share is not None]
    return Calibrated(profile=calibrated, partition=partition, op_times=targets,
                      layer_op_times=stage_op_times(profile, partition),
                      cpu_share=min(shares, default=1.0), op_spread=measured_op_spread(traces, num_stages),
                      traces=tuple(traces), context_s=context_times(traces, run.statistic))
