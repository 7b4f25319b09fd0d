"""Stochastic op durations: draws around each lowered time, from the measured spread or a cv."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Literal

import numpy as np
import numpy.typing as npt

from pipesim.schedule.ir import B_CODE, F_CODE, U_CODE
from pipesim.engine.lowering import Program
from pipesim.errors import ConfigError

Distribution = Literal["normal", "lognormal", "gamma"]
DISTRIBUTIONS: tuple[Distribution, ...] = ("normal", "lognormal", "gamma")

FloatArray = npt.NDArray[np.float64]

# The largest coefficient of variation (``jitter``, ``cv``) taken: a spread 100 times an op's mean
# is already far past any measured one, and larger ones drive drawn durations to overflow.
MAX_CV = 100.0


def check_cv(field: str, value: float) -> None:
    """A coefficient of variation must be finite, >= 0 and at most ``MAX_CV``.

    Raises:
        ConfigError: naming ``field`` (``jitter`` or ``cv``) and the value.
    """
    if not 0 <= value <= MAX_CV:
        raise ConfigError(field, value, f"must be finite, from 0 to {MAX_CV:g} (a coefficient of variation)")


def check_seed(seed: int) -> None:
    """A seed must be an integer >= 0, as numpy's generators take it.

    Raises:
        ConfigError: naming ``seed`` and the value.
    """
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool) or seed < 0:
        raise ConfigError("seed", seed, "must be an integer >= 0")


def op_spread_s(program: Program, cv: float | None) -> list[list[float]]:
    """Per rank, per op, the standard deviation of its duration, seconds.

    With ``cv`` every op's spread is ``cv`` times its duration. Without it the profile's
    measured spread is used: the stage's forward std for F, its backward std for B, and for I
    and W the backward std scaled by their share of the backward time (they split one
    measured pass). Updates (gradient all-reduce) and sends get no spread.
    """
    return _per_rank(program, _spread(program, cv))


def draw_durations(
    program: Program,
    rng: np.random.Generator,
    *,
    distribution: Distribution = "normal",
    cv: float | None = None,
) -> list[list[float]]:
    """``draw_op_durations`` per rank, per op in its order, as ``run_des(durations=...)`` takes them."""
    return _per_rank(program, draw_op_durations(program, rng, distribution=distribution, cv=cv))


def draw_op_durations(
    program: Program,
    rng: np.random.Generator,
    *,
    distribution: Distribution = "normal",
    cv: float | None = None,
) -> FloatArray:
    """One sample of every op's duration (OpTable order), mean the lowered duration and spread
    per ``op_spread_s``.

    ``normal`` is clipped at 0; ``lognormal`` and ``gamma`` are positive with the same mean and
    standard deviation. An op with zero spread (or zero duration) keeps its duration exactly,
    so a run with no spread equals the deterministic run. Draws go rank by rank, op by op
    (one draw per op with a spread).

    Raises:
        ConfigError: an unknown distribution or a ``cv`` that ``check_cv`` refuses.
    """
    if distribution not in DISTRIBUTIONS:
        raise ConfigError("distribution", distribution, f"must be one of {', '.join(DISTRIBUTIONS)}")
    if cv is not None:
        check_cv("cv", cv)
    mean = program.ops.duration_s
    spread = _spread(program, cv)
    drawn = (spread != 0) & (mean != 0)
    sampled = mean.copy()
    sampled[drawn] = _draw(rng, distribution, mean[drawn], spread[drawn])
    return sampled


def _spread(program: Program, cv: float | None) -> FloatArray:
    """Per op (OpTable order), the standard deviation of its duration."""
    ops, costs = program.ops, program.costs
    duration = ops.duration_s
    if cv is not None:
        spread: FloatArray = cv * duration
    else:
        forward = np.asarray(costs.forward_std_s, dtype=np.float64)[ops.stage]
        backward = np.asarray(costs.backward_std_s, dtype=np.float64)[ops.stage]
        full = np.asarray(costs.backward_s, dtype=np.float64)[ops.stage]
        scaled = np.divide(backward * duration, full, out=np.zeros_like(duration), where=full > 0)
        spread = np.where(ops.kind == F_CODE, forward, np.where(ops.kind == B_CODE, backward, scaled))
    return np.where(ops.kind == U_CODE, 0.0, spread)


def _draw(rng: np.random.Generator, distribution: Distribution, mean: FloatArray, std: FloatArray) -> FloatArray:
    if distribution == "normal":
        normal: FloatArray = np.maximum(0.0, rng.normal(mean, std))
        return normal
    if distribution == "lognormal":
        sigma2 = np.log1p((std / mean) ** 2)
        lognormal: FloatArray = rng.lognormal(np.log(mean) - sigma2 / 2, np.sqrt(sigma2))
        return lognormal
    gamma: FloatArray = rng.gamma((mean / std) ** 2, std * std / mean)
    return gamma


def _per_rank(program: Program, values: FloatArray) -> list[list[float]]:
    offsets = program.ops.rank_offsets.tolist()
    flat: list[float] = values.tolist()
    return [flat[offsets[r]:offsets[r + 1]] for r in range(program.ops.num_ranks)]


def run_durations(
    program: Program,
    *,
    jitter: float = 0.0,
    seed: int = 0,
    durations: npt.ArrayLike | Sequence[Sequence[float]] | None = None,
) -> FloatArray:
    """Every op's compute time for one run (OpTable order): the lowered times, the given
    ``durations``, or the lowered times scaled by seeded jitter.

    Args:
        jitter: coefficient of variation of every op's duration (0: deterministic). Factors
            are drawn from ``numpy.random.default_rng(seed)`` rank by rank and clipped at 0.
        durations: per rank, per op in its order, or one flat array in OpTable order
            (``draw_durations`` gives them); ``jitter`` must then be 0.

    Raises:
        ConfigError: a jitter that ``check_cv`` refuses, a negative seed, jitter with
            durations, or durations of the wrong length, infinite or negative.
    """
    check_cv("jitter", jitter)
    check_seed(seed)
    base = program.ops.duration_s
    if durations is not None:
        if jitter:
            raise ConfigError("jitter", jitter, "must be 0 when durations are given")
        return _given(program, durations)
    if jitter == 0:
        return base
    rng = np.random.default_rng(seed)
    offsets = program.ops.rank_offsets.tolist()
    factors = [np.maximum(rng.normal(1.0, jitter, offsets[r + 1] - offsets[r]), 0.0)
               for r in range(program.ops.num_ranks)]
    jittered: FloatArray = base * np.concatenate([np.zeros(0), *factors])
    return jittered


def _given(program: Program, durations: npt.ArrayLike | Sequence[Sequence[float]]) -> FloatArray:
    if isinstance(durations, np.ndarray):
        flat = durations.astype(np.float64, copy=False).reshape(-1)
    else:  # per rank, per op: ranks of different lengths
        flat = np.concatenate([np.zeros(0), *(np.asarray(row, dtype=np.float64).reshape(-1)
                                              for row in durations)])  # type: ignore[union-attr]
    if flat.shape[0] != program.ops.num_ops:
        raise ConfigError("durations", int(flat.shape[0]), f"must give one duration per op ({program.ops.num_ops})")
    bad = flat[~((flat >= 0.0) & (flat < math.inf))]
    if bad.size:
        raise ConfigError("durations", float(bad[0]), "every op's duration must be finite and >= 0")
    return flat
