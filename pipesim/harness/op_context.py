"""Op times that depend on the op before them on their rank: measured per context, given to each op of a prediction.

A real op's time depends on what its rank ran just before it: an F right after a backward finds
the caches holding the backward's gradients and stashes, not its own weights (one process, MLP
8x512: 5-12% over an F after an F; benchmarks/RESULTS.md). GPipe runs its F after F and its B
after B, the 1F1B family alternates them, so op times calibrated on one order are short or long
for the other. The context of an op is the kind of the op before it on its rank ("" for a rank's
first op), a split backward's I and W counting as a B (backward work either way); a calibration
measures the ops of every (stage, kind, context) it ran, and a prediction gives each op the time
measured in its own context, or its lowered duration where the calibration never ran that one.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from pipesim.engine.trace import KINDS, Trace
from pipesim.harness.breakdown import traced_ops
from pipesim.harness.config import summarize
from pipesim.simulation import PreparedRun

# (stage, kind, context): an op of ``kind`` on ``stage`` after an op of kind ``context`` on its rank.
ContextKey = tuple[int, str, str]
# A context measured on fewer ops than this is left to the stage's mean over every context.
MIN_CONTEXT_OPS = 4


def context_of(previous: str) -> str:
    """The context an op's predecessor on its rank gives it: its kind, I and W as B ("" for none)."""
    return "B" if previous in ("I", "W") else previous


def context_times(traces: Iterable[Trace], statistic: str = "mean") -> dict[ContextKey, float]:
    """Per (stage, kind, context) seen on at least ``MIN_CONTEXT_OPS`` ops of the steady-state
    minibatches of ``traces`` together, the ``statistic`` of their spans."""
    samples: dict[ContextKey, list[float]] = {}
    for trace in traces:
        last = trace.info.num_minibatches - 1
        previous: dict[int, str] = {}
        for op in traced_ops(trace):
            context = context_of(previous.get(op.device, ""))
            previous[op.device] = op.kind
            if 1 <= op.minibatch < last:
                samples.setdefault((op.stage, op.kind, context), []).append(op.duration_s)
    return {key: summarize(values, statistic) for key, values in sorted(samples.items())
            if len(values) >= MIN_CONTEXT_OPS}


def in_context(program: PreparedRun, times: dict[ContextKey, float]) -> np.ndarray:
    """Per op of ``program`` (its OpTable order), the time ``times`` gives its (stage, kind,
    context), or its lowered duration where ``times`` has none."""
    table = program.ops
    durations = np.array(table.duration_s, dtype=np.float64, copy=True)
    kinds = [KINDS[code] for code in table.kind.tolist()]
    ranks, stages = table.rank.tolist(), table.stage.tolist()
    for index, kind in enumerate(kinds):
        previous = kinds[index - 1] if index and ranks[index - 1] == ranks[index] else ""
        seconds = times.get((stages[index], kind, context_of(previous)))
        if seconds is not None:
            durations[index] = seconds
    return durations
