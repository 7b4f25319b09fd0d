"""Stochastic op durations: draws around each lowered time, from the measured spread or a cv."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

from pipesim.engine.lowering import Program
from pipesim.errors import ConfigError
from pipesim.schedule.ir import OpKind

Distribution = Literal["normal", "lognormal", "gamma"]
DISTRIBUTIONS: tuple[Distribution, ...] = ("normal", "lognormal", "gamma")


def op_spread_s(program: Program, cv: float | None) -> list[list[float]]:
    """Per rank, per op, the standard deviation of its duration, seconds.

    With ``cv`` every op's spread is ``cv`` times its duration. Without it the profile's
    measured spread is used: the stage's forward std for F, its backward std for B, and for I
    and W the backward std scaled by their share of the backward time (they split one
    measured pass). Updates (gradient all-reduce) and sends get no spread.
    """
    costs = program.costs
    spread: list[list[float]] = []
    for ops in program.ranks:
        row: list[float] = []
        for lowered in ops:
            kind, stage, duration = lowered.op.kind, lowered.op.stage, lowered.duration_s
            if kind is OpKind.U:
                row.append(0.0)
            elif cv is not None:
                row.append(cv * duration)
            elif kind is OpKind.F:
                row.append(costs.forward_std_s[stage])
            elif kind is OpKind.B:
                row.append(costs.backward_std_s[stage])
            else:
                full = costs.backward_s[stage]
                row.append(costs.backward_std_s[stage] * duration / full if full > 0 else 0.0)
        spread.append(row)
    return spread


def draw_durations(
    program: Program,
    rng: np.random.Generator,
    *,
    distribution: Distribution = "normal",
    cv: float | None = None,
) -> list[list[float]]:
    """One sample of every op's duration, mean the lowered duration and spread per ``op_spread_s``.

    ``normal`` is clipped at 0; ``lognormal`` and ``gamma`` are positive with the same mean and
    standard deviation. An op with zero spread (or zero duration) keeps its duration exactly,
    so a run with no spread equals the deterministic run. Draws go rank by rank, op by op.

    Raises:
        ConfigError: an unknown distribution or a negative ``cv``.
    """
    if distribution not in DISTRIBUTIONS:
        raise ConfigError("distribution", distribution, f"must be one of {', '.join(DISTRIBUTIONS)}")
    if cv is not None and (cv < 0 or not math.isfinite(cv)):
        raise ConfigError("cv", cv, "must be a finite number >= 0")
    spread = op_spread_s(program, cv)
    sampled: list[list[float]] = []
    for ops, stds in zip(program.ranks, spread, strict=True):
        row: list[float] = []
        for lowered, std in zip(ops, stds, strict=True):
            mean = lowered.duration_s
            row.append(mean if std == 0 or mean == 0 else _draw(rng, distribution, mean, std))
        sampled.append(row)
    return sampled


def _draw(rng: np.random.Generator, distribution: Distribution, mean: float, std: float) -> float:
    if distribution == "normal":
        return max(0.0, float(rng.normal(mean, std)))
    if distribution == "lognormal":
        sigma2 = math.log1p((std / mean) ** 2)
        return float(rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2)))
    shape = (mean / std) ** 2
    return float(rng.gamma(shape, std * std / mean))
