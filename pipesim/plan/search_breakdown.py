"""Why a configuration's step takes what it takes: the simulated step split into six parts.

On the pipeline's busiest rank (the most forward, backward and update work):

- ``compute``: its forward and backward ops (recomputation and ZeRO-2/3's overlapped
  collectives included) less their collectives;
- ``tp_comm``: those collectives (TP/SP, the experts' exchange, the loss's all-reduce: the op
  cost model runs them beside no compute);
- ``optimizer``: the optimizer step of its stages' weights;
- ``dp_comm``: the rest of its updates: the data-parallel gradient reduction (and ZeRO's
  weight all-gather, the tied embedding's all-reduce) that does not overlap the backward;
- ``pp_comm``: how much longer the step is than the same run with free pipeline links (at most
  the rank's idle time);
- ``bubble``: the rest of the rank's idle time.

The six add up to the simulated step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipesim.spec.stages import StageCosts

PARTS = ("compute", "bubble", "tp_comm", "dp_comm", "pp_comm", "optimizer")


def stage_sums(values: Sequence[float], partition: Sequence[tuple[int, int]]) -> list[float]:
    """Per stage, the sum of a per-layer list over its layers."""
    return [float(sum(values[start:end])) for start, end in partition]


def step_breakdown(costs: StageCosts, stage_to_rank: Sequence[int], num_microbatches: int, *, step_s: float,
                   free_links_step_s: float, collectives_s: Sequence[float],
                   optimizer_s: Sequence[float]) -> dict[str, float]:
    """The six parts (module docstring); ``collectives_s`` and ``optimizer_s`` per stage, for one
    microbatch and for the step's optimizer alone."""
    ranks = np.asarray(stage_to_rank, dtype=np.int64)
    num_ranks = int(ranks.max()) + 1
    busy = np.bincount(ranks, np.asarray(costs.forward_s) + np.asarray(costs.backward_s), minlength=num_ranks)
    busy *= num_microbatches
    update = np.bincount(ranks, np.asarray(costs.update_s), minlength=num_ranks)
    rank = int(np.argmax(busy + update))
    mine = ranks == rank
    tp_comm = num_microbatches * float(np.asarray(collectives_s)[mine].sum())
    optimizer = min(float(np.asarray(optimizer_s)[mine].sum()), float(update[rank]))
    idle = max(0.0, step_s - float(busy[rank]) - float(update[rank]))
    pp_comm = min(idle, max(0.0, step_s - free_links_step_s))
    return {"compute": float(busy[rank]) - tp_comm, "bubble": idle - pp_comm, "tp_comm": tp_comm,
            "dp_comm": float(update[rank]) - optimizer, "pp_comm": pp_comm, "optimizer": optimizer}
