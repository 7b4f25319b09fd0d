"""The harness's own cost per op, measured and folded into the profile rather than guessed.

Two parts. The stage executor's fixed cost per F, B and U (building the stash, starting the
autograd engine, ...) is in every one-layer timing, so the profiler subtracts it from each layer:
a stage of k layers pays it once, not k times. The runtime's cost per op beyond its layers
(that fixed cost again, the receive of an input that has already arrived, the isend, the
records) is measured by running a model of layers that do nothing through the real runtime on
two ranks, with messages as large as the model's, and goes into the profile's per-op overheads,
which the simulator adds once to every op of a stage.
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from pipesim.engine.trace import Trace
from pipesim.harness.config import ModelSpec, RunConfig
from pipesim.harness.models import build_model
from pipesim.harness.timing import LayerTimes, summarize, time_layers
from pipesim.schedule.ir import Op

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


def executor_costs(device: torch.device, *, statistic: str = "mean", warmup: int = 20,
                   repeats: int = 200) -> OpCosts:
    """The stage executor's fixed cost per op: a one-layer stage whose layer does nothing to one number."""
    bundle = build_model(ModelSpec("null", depth=2, width=1), 1)
    (times,) = time_layers(bundle, 1, device, warmup=warmup, repeats=repeats, statistic=statistic, indices=[1])
    return OpCosts(times.forward_s, times.backward_s, times.update_s)


def net_of(times: LayerTimes, executor: OpCosts) -> OpCosts:
    """A layer's own time: its one-layer stage timing less the executor's fixed cost (at least 0)."""
    return OpCosts(max(0.0, times.forward_s - executor.forward_s), max(0.0, times.backward_s - executor.backward_s),
                   max(0.0, times.update_s - executor.update_s))


def runtime_costs(sample_elements: int, microbatch_size: int, executor: OpCosts, statistic: str = "mean", *,
                  threads: int = 1,
                  device: str = "cpu", num_microbatches: int = 16, num_minibatches: int = 4,
                  repeats: int = 50) -> tuple[OpCosts, float]:
    """The runtime's cost per op beyond its layers' own time, from a real two-rank run of null layers.

    The null model (one null layer on rank 0; a null layer and the loss on rank 1) runs GPipe
    with messages of ``microbatch_size * sample_elements`` numbers. Per rank and kind, the
    median span of the steady-state minibatches less the net time of that stage's layers; the
    mean over the two ranks. Spans are summarized by ``statistic``, as the layers were.

    Returns:
        the costs, and the smallest CPU share of the run's ranks (see Trace meta ``cpu_share``).
    """
    spec = ModelSpec("null", depth=2, width=max(1, sample_elements))
    bundle = build_model(spec, microbatch_size)
    target = torch.device(device)
    net = [net_of(times, executor) for times in time_layers(bundle, microbatch_size, target, warmup=5,
                                                             repeats=repeats, statistic=statistic)]
    stage_net = [net[0], OpCosts(*(a + b for a, b in zip(
        (net[1].forward_s, net[1].backward_s, net[1].update_s),
        (net[2].forward_s, net[2].backward_s, net[2].update_s), strict=True)))]
    config = RunConfig(model=spec, schedule="gpipe", num_stages=2, num_microbatches=num_microbatches,
                       num_minibatches=num_minibatches, microbatch_size=microbatch_size, partition=((0, 1), (1, 3)),
                       threads=threads, device=device, backend="nccl" if device == "cuda" else "gloo")
    from pipesim.harness.launch import launch

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
    shares = [share for share in trace.meta.get("cpu_share", []) if share is not None]
    return OpCosts(*costs), min(shares, default=1.0)
