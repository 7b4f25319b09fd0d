"""PipeDream (SOSP'19): 1F1B on a stream of inputs, weight stashing, an update after every backward."""

from __future__ import annotations

from pipesim.schedule.ir import Schedule, WeightPolicy
from pipesim.schedule.one_f_one_b import one_f_one_b_schedule


def pipedream(num_stages: int, num_microbatches: int, *, num_minibatches: int = 1) -> Schedule:
    """PipeDream with weight stashing.

    Every B uses the version its F used; stage s updates after each backward, so in steady
    state its forwards run ``p - 1 - s`` updates behind and it keeps ``p - s`` versions.
    Minibatches only group the stream into m-microbatch windows for reporting.
    """
    return one_f_one_b_schedule("pipedream", num_stages, num_microbatches, num_minibatches,
                                update_every=1, weights=WeightPolicy.STASH)
