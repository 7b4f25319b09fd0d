"""Work sent to Dask in batches sized by predicted cost, heaviest first, so that no heavy batch ends last.

A point's (or a search candidate's) cost is predicted from the ops its schedule will have
(``pipesim.simulation.count_ops``) plus a fixed overhead per point: on the 10,080-point benchmark
sweep a point's time is about 1.2 ms plus 0.1 us per op, so the overhead is worth 12,500 ops
(benchmarks/RESULTS.md, "Sweeps: where the time goes").

Work comes as families of groups of items. A group (points that share a schedule's order, or a
search configuration's recomputation modes) is kept in one batch where it fits, a family (groups
that share stage costs) too. ``plan_batches`` cuts families larger than a share of the work into
runs of groups, sorts the pieces heaviest first and packs the light ones together, so that Dask,
taking batches by falling priority, starts the heavy ones first and ends on small ones: the last
batch to finish is about ``1 / BATCHES_PER_WORKER`` of a worker's share, whatever the ordering of
costs in the spec.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any, Generic, NamedTuple, TypeVar

from pipesim.simulation import count_ops

Item = TypeVar("Item")

#: A point's own cost beyond its ops (planning, lowering, the metrics' calls, its row), in ops.
POINT_OVERHEAD_OPS = 12_500
#: The largest piece of work is at most 1 / (FIRST_PIECES_PER_WORKER * workers) of the whole: the
#: first wave of batches takes a quarter of each worker's share, and the rest balances behind it.
FIRST_PIECES_PER_WORKER = 4
#: Batches are at least 1 / (BATCHES_PER_WORKER * workers) of the whole (pieces lighter than that
#: are packed together): each batch costs a task and a chunk file, and the last one bounds the tail.
BATCHES_PER_WORKER = 24


def point_cost(point: dict[str, Any]) -> int:
    """Predicted work of a sweep point, in ops: its schedule's ops plus ``POINT_OVERHEAD_OPS``."""
    return run_cost(point["schedule"], int(point["num_stages"]), int(point["num_microbatches"]),
                    int(point["num_minibatches"]), pipemare_update=point.get("pipemare_update") or "minibatch")


def run_cost(schedule: str, num_stages: int, num_microbatches: int, num_minibatches: int, *,
             pipemare_update: str = "minibatch") -> int:
    """Predicted work of one simulation, in ops (``count_ops`` plus ``POINT_OVERHEAD_OPS``)."""
    return count_ops(schedule, num_stages, num_microbatches, num_minibatches,
                     pipemare_update=pipemare_update) + POINT_OVERHEAD_OPS


def plan_batches(families: Sequence[Sequence[Sequence[Item]]], cost: Callable[[Item], float], num_workers: int, *,
                 split_groups: bool = True) -> list[list[Item]]:
    """Batches of ``families`` (each a list of groups of items, in the order they run best) for
    ``num_workers`` workers, heaviest first: submit them with falling priority.

    A family heavier than ``1 / (FIRST_PIECES_PER_WORKER * num_workers)`` of the whole is cut into
    runs of its groups no heavier than that, and a group into runs of its items when
    ``split_groups``; the pieces, heaviest first, are then packed into batches of at least
    ``1 / (BATCHES_PER_WORKER * num_workers)`` of the whole. Within a batch the items keep the
    order they were given in (a family's groups stay neighbours).
    """
    counter = itertools.count()
    weighed = [[[_Entry(cost(item), next(counter), item) for item in group] for group in family]
               for family in families]
    total = sum(entry.weight for family in weighed for group in family for entry in group)
    if not any(group for family in weighed for group in family):
        return []
    largest = total / (FIRST_PIECES_PER_WORKER * max(1, num_workers))
    smallest = total / (BATCHES_PER_WORKER * max(1, num_workers))
    pieces: list[list[_Entry[Item]]] = []
    for family in weighed:
        for run in _runs(family, largest):
            if len(run) == 1 and split_groups and _weight(run[0]) > largest:
                pieces += [_flat(items) for items in _runs([[entry] for entry in run[0]], largest)]
            else:
                pieces.append(_flat(run))
    pieces.sort(key=lambda piece: (-_weight(piece), piece[0].position))
    batches: list[list[_Entry[Item]]] = []
    for piece in pieces:
        if batches and _weight(batches[-1]) < smallest:
            batches[-1] += piece
        else:
            batches.append(piece)
    return [[entry.item for entry in sorted(batch, key=lambda entry: entry.position)] for batch in batches]


class _Entry(NamedTuple, Generic[Item]):
    """An item with its predicted cost and its place in the order given."""

    weight: float
    position: int
    item: Item


def _weight(entries: Sequence[_Entry[Any]]) -> float:
    return sum(entry.weight for entry in entries)


def _flat(groups: Sequence[Sequence[_Entry[Item]]]) -> list[_Entry[Item]]:
    return list(itertools.chain.from_iterable(groups))


def _runs(groups: Sequence[Sequence[_Entry[Item]]], largest: float) -> list[list[Sequence[_Entry[Item]]]]:
    """Consecutive ``groups`` joined into runs no heavier than ``largest`` (a heavier group alone)."""
    runs: list[list[Sequence[_Entry[Item]]]] = []
    weight = 0.0
    for group in groups:
        heft = _weight(group)
        if not runs or weight + heft > largest:
            runs.append([])
            weight = 0.0
        runs[-1].append(group)
        weight += heft
    return runs
