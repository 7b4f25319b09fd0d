"""The harness's own cost per op, measured and folded into the profile rather than guessed.

Two parts. The stage executor's fixed cost per F, B and U (building the stash, starting the
autograd engine, ...) is in every one-layer timing, so the profiler subtracts it from each layer:
a stage of k layers pays it once, not k times. The runtime's cost per op beyond its layers
(that fixed cost again, the receive of an input that has already arrived, the isend, the
records) is measured by running a model of layers that do nothing through the real runtime on
two ranks, with messages as large as the model's, and goes into the profile's per-op overheads,
which the simulator adds once to every op of a stage.

On the emulated device one more cost shows: the host's own time per op that the device's wait
does not cover. gloo cannot tell that a message has arrived before the receive is waited on, so
an op whose input comes from another rank starts when its host gets to that receive (after the
previous op's send, its records and the receive call), not when the device is free, and a host
that wakes late from its wait hands its output on late. ``host_cost`` measures that time per such
op in separate emulated 1F1B runs, and ``with_host_cost`` adds it to those ops of the profile
the prediction is made from.
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipesim.engine.trace import Trace
from pipesim.harness.config import ModelSpec, RunConfig, summarize
from pipesim.harness.prediction import emulation_of, predict
from pipesim.schedule.ir import Op
from pipesim.spec.profile import Profile
from pipesim.spec.stages import balance_partition
from pipesim.spec.topology import Topology

KINDS = ("F", "B", "U")


@dataclass(frozen=True)
class OpCosts:
    """Seconds per F, B and U op."""

    forward_s: float
    backward_s: float
    update_s: float

    def of(self, kind: str) -> float:
        """The cost of an op kind ("F", "B" or "U")."""
        return {"F": self.forward_s, "B": self.backward_s, "U": self.update_s}[kind]

    def __add__(self, other: OpCosts) -> OpCosts:
        return OpCosts(self.forward_s + other.forward_s, self.backward_s + other.backward_s,
                       self.update_s + other.update_s)


def net_of(times: Sequence[float], executor: OpCosts) -> OpCosts:
    """A layer's own time from its one-layer stage timing ``(F, B, U, ...)``, less the executor's
    fixed cost (at least 0)."""
    return OpCosts(max(0.0, times[0] - executor.forward_s), max(0.0, times[1] - executor.backward_s),
                   max(0.0, times[2] - executor.update_s))


def runtime_costs(elements: int, microbatch_size: int, null_net: list[OpCosts], statistic: str = "mean", *,
                  threads: int = 1, device: str = "cpu", num_microbatches: int = 16,
                  num_minibatches: int = 8) -> tuple[OpCosts, float]:
    """The runtime's cost per op beyond its layers' own time, from a real two-rank run of null layers.

    The null model of ``elements`` numbers per sample (one null layer on rank 0; a null layer and
    the loss on rank 1, whose net times are ``null_net``) runs GPipe. Per rank and kind, the
    ``statistic`` of its spans in the minibatches after the first, less the net time of that
    stage's layers; the mean over the two ranks.

    Returns:
        the costs, and the smallest CPU share of the run's ranks (see Trace meta ``cpu_share``).
    """
    from pipesim.harness.launch import launch

    spec = ModelSpec("null", depth=2, width=max(1, elements))
    stage_net = [null_net[0], null_net[1] + null_net[2]]
    config = RunConfig(model=spec, schedule="gpipe", num_stages=2, num_microbatches=num_microbatches,
                       num_minibatches=num_minibatches, microbatch_size=microbatch_size, partition=((0, 1), (1, 3)),
                       threads=threads, device=device, backend="nccl" if device == "cuda" else "gloo")
    with tempfile.TemporaryDirectory(prefix="pipesim-overheads-") as folder:
        trace_path = Path(folder) / "trace.json"
        launch(config.with_outputs(trace_out=trace_path), op_timeout_s=120)
        trace = Trace.from_json(trace_path.read_text(encoding="utf-8"))
    spans: dict[tuple[int, str], list[float]] = {}
    for span in trace.iter_spans():
        if span.stream == "compute" and span.minibatch >= 1:
            spans.setdefault((span.device, Op.parse(span.op).kind.value), []).append(span.end_s - span.start_s)
    costs = []
    for kind in KINDS:
        per_rank = [summarize(spans[(rank, kind)], statistic) - stage_net[rank].of(kind) for rank in (0, 1)]
        costs.append(max(0.0, statistics.fmean(per_rank)))
    shares = [share for share in trace.info.cpu_share or () if share is not None]
    return OpCosts(*costs), min(shares, default=1.0)


def with_host_cost(profile: Profile, seconds: float, partition: tuple[tuple[int, int], ...],
                   stage_to_rank: Sequence[int]) -> Profile:
    """``profile`` with ``seconds`` more on every F and B (a split backward's I included) whose
    input comes from another rank: on the first layer's forward of a stage fed by another rank,
    and on the last layer's backward of a stage whose gradient comes from another rank."""
    if seconds <= 0:
        return profile
    layers = list(profile.layers)
    last = len(partition) - 1
    for stage, (start, end) in enumerate(partition):
        if stage > 0 and stage_to_rank[stage - 1] != stage_to_rank[stage]:
            layers[start] = layers[start].model_copy(update={"forward_s": layers[start].forward_s + seconds})
        if stage < last and stage_to_rank[stage + 1] != stage_to_rank[stage]:
            layer = layers[end - 1]
            update = {"backward_s": layer.backward_s + seconds}
            if layer.backward_input_s is not None:
                update["backward_input_s"] = layer.backward_input_s + seconds
            layers[end - 1] = layer.model_copy(update=update)
    return profile.model_copy(update={"layers": tuple(layers)})


def late_ops(device: Trace, measured: Trace) -> list[float]:
    """Per op with an input from another rank in ``measured``'s steady-state minibatches, the
    seconds it ended later than its device could have ended it: its end less its duration in
    ``device`` (the prediction its emulated durations came from) less the later of the end of its
    rank's previous op and the arrival its input would have had on the predicted link (the
    sender's end plus the predicted transfer)."""
    last = measured.info.num_minibatches - 1
    predicted = {(span.device, span.stream, span.position): span for span in device.iter_spans()}
    ends = {span.op: span.end_s for span in measured.iter_spans() if span.stream == "compute"}
    transfers = {(span.device, span.position): span.end_s - span.start_s
                 for span in device.iter_spans() if span.stream == "send"}
    senders = {span.op: (span.device, span.position) for span in measured.iter_spans() if span.stream == "compute"}
    lateness: list[float] = []
    previous_end: dict[int, float] = {}
    for span in sorted((s for s in measured.iter_spans() if s.stream == "compute"), key=lambda s: s.start_s):
        op, before = Op.parse(span.op), previous_end.get(span.device)
        previous_end[span.device] = span.end_s
        source = {"F": op.stage - 1, "B": op.stage + 1, "I": op.stage + 1}.get(op.kind.value)
        sender = None if source is None else f"{source}{op.kind.value}{op.microbatch}"
        if sender not in ends or before is None or not 1 <= span.minibatch < last:
            continue
        sent_from = senders[sender]
        if sent_from[0] == span.device:
            continue
        arrival = ends[sender] + transfers[sent_from]
        duration = predicted[(span.device, "compute", span.position)]
        lateness.append(span.end_s - (duration.end_s - duration.start_s) - max(before, arrival))
    return lateness


def host_cost(profile: Profile, topology: Topology, spec: ModelSpec, num_ranks: int, *, runs: int = 3,
              num_microbatches: int = 8, num_minibatches: int = 6, device: str = "cpu",
              op_timeout_s: float = 120.0, realtime_priority: int = 0) -> float:
    """The emulated host's own seconds per F and B op with an input from another rank, beyond the
    device's durations.

    ``runs`` separate emulated 1F1B runs of ``spec`` on ``num_ranks`` ranks (one stage each, the
    partition balanced on ``profile``; gloo on CPU, or NCCL with ``device="cuda"``), never a
    validated run; for each, the mean of
    ``late_ops`` (at least 0). The median over the runs, so that one run slowed by the machine
    does not set it. The ranks run at ``realtime_priority``, as the validated runs do (see
    ``Emulation``).

    Raises:
        ConfigError: a bad shape; RunFailedError: a run failed.
    """
    from pipesim.harness.launch import launch

    partition = balance_partition(profile, num_ranks)
    config = RunConfig(model=spec, schedule="1f1b", num_stages=num_ranks, num_microbatches=num_microbatches,
                       num_minibatches=num_minibatches, microbatch_size=profile.microbatch_size, partition=partition,
                       device=device, backend="nccl" if device == "cuda" else "gloo")
    prediction = predict(profile, topology, config).trace
    config = dataclasses.replace(config, emulation=emulation_of(prediction, profile, partition,
                                                                realtime_priority=realtime_priority))
    costs = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="pipesim-host-cost-") as folder:
            trace_path = Path(folder) / "trace.json"
            launch(config.with_outputs(trace_out=trace_path), op_timeout_s=op_timeout_s)
            lateness = late_ops(prediction, Trace.from_json(trace_path.read_text(encoding="utf-8")))
        costs.append(max(0.0, statistics.fmean(lateness)) if lateness else 0.0)
    return statistics.median(costs)
