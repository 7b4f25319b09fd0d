"""Stochastic runs on the DES engine: the distribution of iteration time and each device's straggler sensitivity."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from pipesim.engine.des import run_des
from pipesim.engine.lowering import Program
from pipesim.engine.noise import Distribution, draw_durations
from pipesim.errors import ConfigError
from pipesim.metrics import compute_metrics
from pipesim.schedule.ir import Schedule
from pipesim.simulation import prepare
from pipesim.spec.plan import Plan
from pipesim.spec.profile import Profile
from pipesim.spec.topology import Topology


@dataclass(frozen=True)
class SampleSummary:
    """Iteration time over ``num_samples`` seeded stochastic runs of one Program.

    Attributes:
        num_samples, seed, distribution: how the samples were drawn; ``cv`` is the coefficient
            of variation used for every op, or None for the profile's measured spread.
        deterministic_iteration_time_s: the run with every op at its mean duration.
        iteration_times_s: one steady-state iteration time per sample, in sample order.
        median_s, p5_s, p95_s, mean_s: their median, 5th and 95th percentiles (linear
            interpolation) and mean.
        straggler_slowdown: the relative slow-down given to one device at a time.
        straggler_sensitivity: per device, ``(T_slow / T - 1) / straggler_slowdown`` of the
            deterministic iteration time T: 1 when the whole pipeline waits for that device,
            0 when its slack hides it.
    """

    num_samples: int
    seed: int
    distribution: str
    cv: float | None
    deterministic_iteration_time_s: float
    iteration_times_s: tuple[float, ...]
    median_s: float
    p5_s: float
    p95_s: float
    mean_s: float
    straggler_slowdown: float
    straggler_sensitivity: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        return asdict(self)


def sample_program(
    program: Program,
    *,
    num_samples: int,
    seed: int = 0,
    distribution: Distribution = "normal",
    cv: float | None = None,
    straggler_slowdown: float = 0.1,
) -> SampleSummary:
    """Run ``program`` ``num_samples`` times on the DES engine with drawn op durations.

    Sample i draws from ``numpy.random.default_rng(SeedSequence(seed).spawn(N)[i])``, so a
    sample does not depend on how many are taken, and the same seed gives the same numbers.
    With no spread every sample equals the deterministic run exactly.

    Raises:
        ConfigError: ``num_samples < 1``, a slow-down <= 0, or a bad distribution or cv.
    """
    if num_samples < 1:
        raise ConfigError("samples", num_samples, "must be >= 1")
    if not straggler_slowdown > 0:
        raise ConfigError("straggler_slowdown", straggler_slowdown, "must be > 0")
    base = [[lowered.duration_s for lowered in ops] for ops in program.ranks]
    deterministic = compute_metrics(run_des(program, durations=base)).iteration_time_s
    times = []
    for child in np.random.SeedSequence(seed).spawn(num_samples):
        durations = draw_durations(program, np.random.default_rng(child), distribution=distribution, cv=cv)
        times.append(compute_metrics(run_des(program, durations=durations)).iteration_time_s)
    sensitivity = []
    for rank in range(len(program.ranks)):
        slowed = [[d * (1 + straggler_slowdown) if r == rank else d for d in row] for r, row in enumerate(base)]
        slow = compute_metrics(run_des(program, durations=slowed)).iteration_time_s
        sensitivity.append((slow / deterministic - 1) / straggler_slowdown if deterministic > 0 else 0.0)
    values = np.asarray(times)
    return SampleSummary(
        num_samples=num_samples,
        seed=seed,
        distribution=distribution,
        cv=cv,
        deterministic_iteration_time_s=deterministic,
        iteration_times_s=tuple(times),
        median_s=float(np.median(values)),
        p5_s=float(np.percentile(values, 5)),
        p95_s=float(np.percentile(values, 95)),
        mean_s=float(values.mean()),
        straggler_slowdown=straggler_slowdown,
        straggler_sensitivity=tuple(sensitivity),
    )


def simulate_samples(
    profile: Profile,
    topology: Topology,
    plan: Plan,
    *,
    num_samples: int,
    seed: int = 0,
    distribution: Distribution = "normal",
    cv: float | None = None,
    schedule: Schedule | None = None,
) -> SampleSummary:
    """Build and lower the plan's schedule (or ``schedule``), then ``sample_program`` it.

    Raises:
        ConfigError: an input breaks a rule; ScheduleError: the schedule cannot run.
    """
    program = prepare(profile, topology, plan, schedule=schedule)
    return sample_program(program, num_samples=num_samples, seed=seed, distribution=distribution, cv=cv)
