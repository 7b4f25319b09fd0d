"""Expected iteration time when op times vary: the engine run on op durations drawn with a calibration run's spread.

A pipeline's iteration time is a max-plus function of its op times: an op starts at the later of
its rank's previous op and its input's arrival. With op times that vary from op to op, the
expected iteration time is longer than the iteration time of the mean op times (Jensen's
inequality for the max), because every wait picks the later of two varying paths. A calibration
run measures each stage's op times as a distribution (mean and spread); predicting from the
means alone leaves out that delay. ``expected_iteration_time`` puts it back: the mean, over
seeded draws, of the engine's iteration time with every op's duration drawn independently from a
normal of its lowered duration (the calibrated mean) and its stage and kind's measured spread,
clipped at 0. Nothing is taken from the run being predicted.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np

from pipesim.errors import ConfigError
from pipesim.harness.overheads import OpCosts
from pipesim.metrics import iteration_time
from pipesim.schedule.ir import B_CODE, F_CODE, I_CODE, U_CODE, W_CODE
from pipesim.simulation import PreparedRun, run_program

_KIND_OF_CODE = {F_CODE: "F", B_CODE: "B", U_CODE: "U"}


def op_spread_s(program: PreparedRun, spread: Sequence[OpCosts]) -> np.ndarray:
    """Per op of ``program`` (its OpTable order), the standard deviation of its duration: its
    stage's spread for its kind (F, B, U). A split backward's I and W share their stage's B spread
    in proportion to their durations (B's coefficient of variation, as a calibration run measures
    B whole); any other kind gets 0.

    Raises:
        ConfigError: ``spread`` has fewer stages than the program.
    """
    stages = program.ops.stage
    if len(stages) and int(stages.max()) >= len(spread):
        raise ConfigError("op_spread", len(spread), f"must give every one of the {int(stages.max()) + 1} stages")
    table = np.array([[stage.of(kind) for kind in "FBU"] for stage in spread], dtype=np.float64)
    column = np.full(len(stages), -1, dtype=np.int64)
    for code, kind in _KIND_OF_CODE.items():
        column[program.ops.kind == code] = "FBU".index(kind)
    result = np.zeros(len(stages), dtype=np.float64)
    known = column >= 0
    result[known] = table[stages[known], column[known]]
    split = (program.ops.kind == I_CODE) | (program.ops.kind == W_CODE)
    if split.any():
        durations = program.ops.duration_s
        backward = np.zeros(len(spread), dtype=np.float64)  # per stage: its mean I plus its mean W
        for code in (I_CODE, W_CODE):
            mine = program.ops.kind == code
            counts = np.bincount(stages[mine], minlength=len(spread))
            backward += np.bincount(stages[mine], weights=durations[mine], minlength=len(spread)) / np.maximum(counts, 1)
        share = durations[split] / np.where(backward[stages[split]] > 0, backward[stages[split]], 1.0)
        result[split] = table[stages[split], "FBU".index("B")] * share
    return result


def expected_iteration_time(program: PreparedRun, spread: Sequence[OpCosts], *, draws: int,
                            seed: int = 0, mean_s: np.ndarray | None = None) -> tuple[float, float]:
    """The mean over ``draws`` engine runs of the steady-state iteration time, each with every op's
    duration drawn from ``normal(lowered duration, its stage and kind's spread)`` clipped at 0,
    and the standard error of that mean; ``mean_s`` (one per op, in the op table's order) replaces
    the lowered durations as the means. Deterministic for a given ``seed``; with zero spread,
    exactly the iteration time of the means.

    Raises:
        ConfigError: ``draws`` below 1, a negative spread, or too few stages in ``spread``.
    """
    if draws < 1:
        raise ConfigError("spread_draws", draws, "must be >= 1")
    std = op_spread_s(program, spread)
    if np.any(std < 0) or not np.all(np.isfinite(std)):
        raise ConfigError("op_spread", float(std.min()), "must be finite and >= 0")
    mean = program.ops.duration_s if mean_s is None else mean_s
    rng = np.random.default_rng(seed)
    times = []
    for _ in range(draws):
        durations = np.maximum(0.0, mean + std * rng.standard_normal(len(mean)))
        trace = run_program(program, durations_s=durations)
        times.append(iteration_time(trace))
    error = statistics.stdev(times) / len(times) ** 0.5 if len(times) > 1 else 0.0
    return statistics.fmean(times), error
