"""The schedule registry: names to generators, and the one entry point that builds and checks."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

from pipesim.errors import ConfigError
from pipesim.schedule.dualpipev import dualpipev
from pipesim.schedule.flush_1f1b import one_f_one_b
from pipesim.schedule.gpipe import gpipe
from pipesim.schedule.interleaved_1f1b import interleaved_1f1b
from pipesim.schedule.interleaved_zb import interleaved_zb
from pipesim.schedule.ir import Schedule
from pipesim.schedule.looped_bfs import looped_bfs
from pipesim.schedule.pipedream import pipedream
from pipesim.schedule.pipemare import pipemare
from pipesim.schedule.two_bw import two_bw
from pipesim.schedule.zb_auto import zb_auto
from pipesim.schedule.zb_h1 import zb_h1
from pipesim.schedule.zb_h2 import zb_h2
from pipesim.schedule.zbv import zbv
from pipesim.spec.plan import SPLIT_BACKWARD_SCHEDULES

Generator = Callable[..., Schedule]

SCHEDULES: dict[str, Generator] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "pipedream": pipedream,
    "2bw": two_bw,
    "pipemare": pipemare,
    "interleaved-1f1b": interleaved_1f1b,
    "looped-bfs": looped_bfs,
    "interleaved-zb": interleaved_zb,
    "zbv": zbv,
    "dualpipev": dualpipev,
    "zb-h1": zb_h1,
    "zb-h2": zb_h2,
    "zb-auto": zb_auto,
}

# Schedules that take ``num_ranks`` (several stages per rank, or a check that there is one).
TAKES_RANKS = frozenset({"interleaved-1f1b", "looped-bfs", "interleaved-zb", "zbv", "dualpipev", "zb-h1", "zb-h2",
                         "zb-auto"})

# Schedules without a flush need several minibatches to reach and show a steady state.
ASYNCHRONOUS = frozenset({"pipedream", "2bw", "pipemare"})

# Schedules that split every backward into I and W (three compute ops per stage and microbatch).
SPLIT_BACKWARD = SPLIT_BACKWARD_SCHEDULES


def default_num_minibatches(name: str) -> int:
    """Minibatches run when none is asked for: 1 for flush schedules, 4 for asynchronous ones."""
    return 4 if name in ASYNCHRONOUS else 1


def build_schedule(
    name: str,
    num_stages: int,
    num_microbatches: int,
    *,
    num_minibatches: int | None = None,
    num_ranks: int | None = None,
    **options: Any,
) -> Schedule:
    """Build the schedule ``name`` for p stages and m microbatches (and K minibatches).

    Args:
        num_stages: model stages P (global stage indices 0..P-1).
        num_ranks: devices R; ``None`` means one stage per rank (R = P). The multi-stage
            schedules put ``P / R`` stages on each rank; the others need R = P.

    Raises:
        ConfigError: an unknown name, a count below 1, or a combination the schedule forbids.
    """
    if name not in SCHEDULES:
        raise ConfigError("schedule", name, unknown_schedule_rule(name))
    if num_minibatches is None:
        num_minibatches = default_num_minibatches(name)
    for field, value in (
        ("num_stages", num_stages),
        ("num_microbatches", num_microbatches),
        ("num_minibatches", num_minibatches),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(field, value, "must be an integer >= 1")
    if name in TAKES_RANKS:
        options["num_ranks"] = num_ranks
    elif num_ranks is not None and num_ranks != num_stages:
        raise ConfigError("num_ranks", num_ranks, f"{name} runs one stage per rank; num_ranks must equal "
                          f"num_stages ({num_stages})")
    return SCHEDULES[name](num_stages, num_microbatches, num_minibatches=num_minibatches, **options)


def unknown_schedule_rule(name: str) -> str:
    """The rule an unknown schedule name breaks, with the closest known names ("did you mean")."""
    close = difflib.get_close_matches(name.lower(), SCHEDULES, n=2, cutoff=0.5)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    return f"unknown schedule; {hint}known: {', '.join(SCHEDULES)}"
