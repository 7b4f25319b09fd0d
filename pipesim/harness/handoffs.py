"""Calibrated op times without the hand-over to another rank where a prediction's stages meet on one rank.

A real op's span holds the runtime's receive of its input from the link and its send of its
output (``TracedOp.receive_s``, ``send_s``): on the 2-core host a tenth to a third of a small MLP
op. The calibration runs place consecutive stages on different ranks where there are several
(stage s on rank s mod R), so each calibrated F and B carries both; a schedule that puts two
consecutive stages on one rank (the V of zbv and dualpipev: stages R - 1 and R) hands that
activation and its gradient over in memory. Each op whose input or output stays on its rank
sheds the share of its stage's calibrated span that the receive or send took across ranks, in
proportion to its own time (a split backward's I and W are shares of the calibrated B, hand-overs
included); a hand-over the calibration itself made in memory (one rank) is not shed again.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from pipesim.engine.trace import KINDS, Trace
from pipesim.harness.breakdown import steady_ops
from pipesim.simulation import PreparedRun

# (stage, calibrated kind: F or B) -> (mean span, mean receive part, mean send part), seconds.
HandOffs = dict[tuple[int, str], tuple[float, float, float]]


def hand_off_parts(traces: Iterable[Trace]) -> HandOffs:
    """Per stage, for its F and B: the mean span, receive part and send part of the steady-state
    ops of ``traces`` together (the calibration runs), a receive or send counted only where its
    neighbour stage ran on another rank (else 0: it was a hand-over in memory already); ops
    without recorded parts are left out."""
    samples: dict[tuple[int, str], list[tuple[float, float, float]]] = {}
    for trace in traces:
        ops = list(steady_ops(trace))
        rank_of = {op.stage: op.device for op in ops}
        for op in ops:
            if op.kind in ("F", "B") and not (math.isnan(op.receive_s) or math.isnan(op.send_s)):
                source, target = _neighbours(op.stage, forward=op.kind == "F")
                receive = 0.0 if rank_of.get(source) == op.device else op.receive_s
                send = 0.0 if rank_of.get(target) == op.device else op.send_s
                samples.setdefault((op.stage, op.kind), []).append((op.duration_s, receive, send))
    means = {key: np.mean(values, axis=0) for key, values in sorted(samples.items())}
    return {key: (float(span), float(receive), float(send)) for key, (span, receive, send) in means.items()}


def without_local_hand_offs(program: PreparedRun, durations_s: np.ndarray, parts: HandOffs) -> np.ndarray:
    """``durations_s`` (per op of ``program``, its OpTable order) less, for each op whose input or
    output stage is on its own rank, the share of its stage's calibrated span (``parts``) that the
    receive or the send took. Ops with every neighbour on another rank, and U, keep their time."""
    table = program.ops
    kinds = [KINDS[code] for code in table.kind.tolist()]
    ranks, stages = table.rank.tolist(), table.stage.tolist()
    rank_of = dict(enumerate(program.schedule.stage_to_rank))
    adjusted = np.array(durations_s, dtype=np.float64, copy=True)
    for index, kind in enumerate(kinds):
        if kind == "U":
            continue
        stage, rank = stages[index], ranks[index]
        forward = kind == "F"
        calibrated = parts.get((stage, "F" if forward else "B"))
        if calibrated is None or calibrated[0] <= 0:
            continue
        span, receive, send = calibrated
        source, target = _neighbours(stage, forward=forward)
        removed = (receive if rank_of.get(source) == rank else 0.0) + (send if rank_of.get(target) == rank else 0.0)
        if removed > 0:
            adjusted[index] *= max(0.0, 1.0 - removed / span)
    return adjusted


def _neighbours(stage: int, *, forward: bool) -> tuple[int, int]:
    """``(the stage an op takes its input from, the stage it hands its output to)``: forward the
    one before and the one after, backward the other way."""
    return (stage - 1, stage + 1) if forward else (stage + 1, stage - 1)
