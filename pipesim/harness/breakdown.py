"""Where a prediction parts from a run, op by op: per stage and kind, and per kind over the steady-state window.

Two views of one run against its prediction (both traces of the same schedule, so an op is the
same (rank, position) in each):

- ``op_rows``: for every stage and kind, the ops of the steady-state minibatches (all but the
  first and the last): the mean duration the prediction gave them against their measured spans,
  the parts of those spans (taking the input from the link, the work, handing the output on and
  the records; see ``RunInfo.compute_receive_s``), the thread's CPU time, and the wait on the rank
  before each op (for its input, or for its turn), predicted and measured.
- ``contributions``: the steady-state iteration time is, on every rank, the time its ops spend in
  the window plus the time it waits between them, over the window's minibatches. Averaged over
  the ranks, the prediction's relative error is therefore a sum, exactly: for each op kind, the
  difference of its busy time per minibatch, plus the difference of the waits, each over the
  measured iteration time.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from pipesim.engine.trace import KINDS, STREAMS, Trace
from pipesim.metrics import steady_window


@dataclass(frozen=True)
class TracedOp:
    """One compute span of a trace, with what the trace knows of its parts (NaN: not recorded)."""

    device: int
    position: int
    stage: int
    kind: str
    minibatch: int
    start_s: float
    end_s: float
    wait_s: float
    receive_s: float
    send_s: float
    cpu_s: float

    @property
    def duration_s(self) -> float:
        """The span's length."""
        return self.end_s - self.start_s


def _per_op(values: tuple[tuple[float, ...] | None, ...] | None, device: int, position: int) -> float:
    """A per-rank, per-position value of a run info column; NaN where absent or negative (not measured)."""
    if values is None or device >= len(values) or values[device] is None:
        return math.nan
    column = values[device]
    assert column is not None
    value = column[position] if position < len(column) else -1.0
    return value if value >= 0 else math.nan


def traced_ops(trace: Trace) -> list[TracedOp]:
    """Every compute span of ``trace`` in rank and position order, with the wait before it on its
    rank (0 for a rank's first op) and its recorded parts."""
    info, s = trace.info, trace.spans
    compute = STREAMS.index("compute")
    rows = sorted((row for row in range(trace.num_spans) if int(s["stream"][row]) == compute),
                  key=lambda row: (int(s["device"][row]), int(s["position"][row])))
    ops: list[TracedOp] = []
    previous_end: dict[int, float] = {}
    for row in rows:
        device, position = int(s["device"][row]), int(s["position"][row])
        start, end = float(s["start_s"][row]), float(s["end_s"][row])
        before = previous_end.get(device, start)
        previous_end[device] = end
        ops.append(TracedOp(
            device=device, position=position, stage=int(s["stage"][row]), kind=KINDS[int(s["kind"][row])],
            minibatch=int(s["minibatch"][row]), start_s=start, end_s=end, wait_s=max(0.0, start - before),
            receive_s=_per_op(info.compute_receive_s, device, position),
            send_s=_per_op(info.compute_send_s, device, position),
            cpu_s=_per_op(info.compute_cpu_s, device, position)))
    return ops


def steady_ops(trace: Trace) -> Iterator[TracedOp]:
    """The compute ops of the steady-state minibatches: all but the first and the last, as
    ``metrics.steady_window`` measures."""
    last = trace.info.num_minibatches - 1
    return (op for op in traced_ops(trace) if 1 <= op.minibatch < last)


def _mean(values: Iterable[float]) -> float:
    """The mean of the values that are not NaN (NaN when none is)."""
    known = [v for v in values if not math.isnan(v)]
    return statistics.fmean(known) if known else math.nan


@dataclass(frozen=True)
class OpRow:
    """One stage's ops of one kind in the steady-state minibatches, predicted against measured.

    Attributes:
        stage, kind: which ops ("F", "B", "I", "W" or "U").
        count: how many.
        predicted_s: the mean duration the prediction gave them.
        measured_s: the mean of their measured spans.
        receive_s, work_s, send_s: the mean parts of the measured spans: taking the input from
            the link (the receive of an input that had arrived), the work, and handing the
            output on with the records (NaN where the run did not record them).
        cpu_s: the mean CPU time of the rank's thread over the span (NaN: not measured).
        wait_s, predicted_wait_s: the mean time the rank waited before each of them (for its
            input, or for the previous op), measured and predicted.
    """

    stage: int
    kind: str
    count: int
    predicted_s: float
    measured_s: float
    receive_s: float
    work_s: float
    send_s: float
    cpu_s: float
    wait_s: float
    predicted_wait_s: float

    @property
    def ratio(self) -> float:
        """Measured over predicted duration (NaN when nothing was predicted)."""
        return self.measured_s / self.predicted_s if self.predicted_s > 0 else math.nan


def op_rows(predicted: Trace, measured: Trace) -> list[OpRow]:
    """Per stage and kind, the steady-state ops of ``measured`` against the same ops (rank and
    position) in ``predicted``, in stage and kind order."""
    expected = {(op.device, op.position): op for op in traced_ops(predicted)}
    groups: dict[tuple[int, str], list[tuple[TracedOp, TracedOp]]] = {}
    for op in steady_ops(measured):
        twin = expected.get((op.device, op.position))
        if twin is not None:
            groups.setdefault((op.stage, op.kind), []).append((twin, op))
    rows = []
    for (stage, kind), pairs in sorted(groups.items(), key=lambda item: (item[0][0], KINDS.index(item[0][1]))):
        ran = [op for _, op in pairs]
        rows.append(OpRow(
            stage=stage, kind=kind, count=len(pairs), predicted_s=_mean(p.duration_s for p, _ in pairs),
            measured_s=_mean(op.duration_s for op in ran), receive_s=_mean(op.receive_s for op in ran),
            work_s=_mean(op.duration_s - op.receive_s - op.send_s for op in ran),
            send_s=_mean(op.send_s for op in ran), cpu_s=_mean(op.cpu_s for op in ran),
            wait_s=_mean(op.wait_s for op in ran), predicted_wait_s=_mean(p.wait_s for p, _ in pairs)))
    return rows


def by_kind(rows: Sequence[OpRow]) -> list[OpRow]:
    """``rows`` pooled over the stages, one row per kind (stage -1): count-weighted means."""
    pooled = []
    for kind in KINDS:
        mine = [row for row in rows if row.kind == kind]
        if not mine:
            continue
        total = sum(row.count for row in mine)

        def weighted(name: str, rows_of_kind: list[OpRow] = mine, count: int = total) -> float:
            known = [(getattr(row, name), row.count) for row in rows_of_kind if not math.isnan(getattr(row, name))]
            weight = sum(n for _, n in known)
            return sum(v * n for v, n in known) / weight if weight else math.nan

        pooled.append(OpRow(stage=-1, kind=kind, count=total, **{name: weighted(name) for name in (
            "predicted_s", "measured_s", "receive_s", "work_s", "send_s", "cpu_s", "wait_s", "predicted_wait_s")}))
    return pooled


@dataclass(frozen=True)
class WindowShare:
    """Per steady-state minibatch, averaged over the ranks: the busy time of each op kind and the
    waits, which add up to the iteration time."""

    busy_s: dict[str, float]
    waits_s: float

    @property
    def iteration_time_s(self) -> float:
        """The busy times and the waits together."""
        return sum(self.busy_s.values()) + self.waits_s


def window_share(trace: Trace) -> WindowShare:
    """How ``trace``'s ranks spend the steady-state window (see ``WindowShare``); a span that
    crosses an end of the window counts for its part inside."""
    low, high, warmup, cooldown = steady_window(trace)
    minibatches = max(1, trace.info.num_minibatches - warmup - cooldown)
    num_ranks = trace.info.num_ranks
    busy = dict.fromkeys(KINDS, 0.0)
    for op in traced_ops(trace):
        busy[op.kind] += max(0.0, min(op.end_s, high) - max(op.start_s, low))
    total = sum(busy.values())
    scale = 1.0 / (num_ranks * minibatches)
    return WindowShare(busy_s={kind: seconds * scale for kind, seconds in busy.items() if seconds > 0},
                       waits_s=(num_ranks * (high - low) - total) * scale)


def contributions(predicted: Trace, measured: Trace) -> dict[str, float]:
    """The prediction's relative error of the steady-state iteration time as a sum over op kinds
    and the waits: per key, (predicted - measured) of its time per minibatch over the measured
    iteration time (keys: the kinds that ran, and ``"waits"``)."""
    mine, theirs = window_share(predicted), window_share(measured)
    reference = theirs.iteration_time_s
    if reference <= 0:
        return {}
    kinds = [kind for kind in KINDS if kind in mine.busy_s or kind in theirs.busy_s]
    parts = {kind: (mine.busy_s.get(kind, 0.0) - theirs.busy_s.get(kind, 0.0)) / reference for kind in kinds}
    parts["waits"] = (mine.waits_s - theirs.waits_s) / reference
    return parts
