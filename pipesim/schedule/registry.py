"""The schedule registry: names to generators, and the one entry point that builds and checks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipesim.errors import ConfigError
from pipesim.schedule.flush_1f1b import one_f_one_b
from pipesim.schedule.gpipe import gpipe
from pipesim.schedule.ir import Schedule
from pipesim.schedule.pipedream import pipedream
from pipesim.schedule.pipemare import pipemare
from pipesim.schedule.two_bw import two_bw

Generator = Callable[..., Schedule]

SCHEDULES: dict[str, Generator] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "pipedream": pipedream,
    "2bw": two_bw,
    "pipemare": pipemare,
}

# Schedules without a flush need several minibatches to reach and show a steady state.
ASYNCHRONOUS = frozenset({"pipedream", "2bw", "pipemare"})


def default_num_minibatches(name: str) -> int:
    """Minibatches run when none is asked for: 1 for flush schedules, 4 for asynchronous ones."""
    return 4 if name in ASYNCHRONOUS else 1


def build_schedule(
    name: str,
    num_stages: int,
    num_microbatches: int,
    *,
    num_minibatches: int | None = None,
    **options: Any,
) -> Schedule:
    """Build the schedule ``name`` for p stages and m microbatches (and K minibatches).

    Raises:
        ConfigError: an unknown name, a count below 1, or a combination the schedule forbids.
    """
    if name not in SCHEDULES:
        raise ConfigError("schedule", name, f"unknown schedule; known: {', '.join(SCHEDULES)}")
    if num_minibatches is None:
        num_minibatches = default_num_minibatches(name)
    for field, value in (
        ("num_stages", num_stages),
        ("num_microbatches", num_microbatches),
        ("num_minibatches", num_minibatches),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(field, value, "must be an integer >= 1")
    return SCHEDULES[name](num_stages, num_microbatches, num_minibatches=num_minibatches, **options)
