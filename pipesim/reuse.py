"""What simulations of one profile may share (a sweep's points): schedule orders, stage costs, staleness."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

from pipesim.schedule.columnar import ColumnarOrder
from pipesim.schedule.ir import Schedule
from pipesim.spec.plan import Plan
from pipesim.spec.profile import Profile
from pipesim.spec.stages import StageCosts
from pipesim.spec.topology import Topology

Value = TypeVar("Value")

# Plan fields that the stage costs do not read (the counts only size the schedule).
_COUNT_FIELDS = frozenset({"num_microbatches", "num_minibatches"})


class _Lru(Generic[Value]):
    """A dict that keeps its ``size`` most recently used entries; safe to share between threads
    (a Dask worker with several threads runs batches of one PointRunner at once)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.entries: OrderedDict[Hashable, Value] = OrderedDict()
        self.hits = self.misses = 0
        self.lock = threading.Lock()

    def get(self, key: Hashable, make: Callable[[], Value]) -> Value:
        with self.lock:
            if key in self.entries:
                self.entries.move_to_end(key)
                self.hits += 1
                return self.entries[key]
            self.misses += 1
        value = make()  # outside the lock: two threads may both make it; either value is the same
        with self.lock:
            self.entries[key] = value
            if len(self.entries) > self.size:
                self.entries.popitem(last=False)
        return value

    def values(self) -> list[Value]:
        """The entries' values, most recently used last."""
        with self.lock:
            return list(self.entries.values())


class Reuse:
    """Results that ``prepare`` and ``simulate_plan`` can reuse between calls, keyed by every
    input they depend on, so that a reused value is the value a fresh call would compute:

    - a columnar schedule order (``schedule.columnar``), by schedule name, counts and options;
      its columns are read only; any other registry schedule likewise (read only);
    - the stage costs, by the profile and topology (by identity: both must stay unchanged
      while this object lives), the stage-to-device map and every plan field but the counts;
    - the per-stage staleness of a schedule (forward delay and discrepancy: functions of
      each rank's order and the weight versions alone), by the order it was measured on.

    Points of a sweep that differ only in bandwidth, latency or recomputation share the order
    and its staleness; points that differ only in their counts share the stage costs. At most
    ``orders`` orders are kept (the largest sweep point's is tens of MB).
    """

    def __init__(self, *, orders: int = 2, costs: int = 256) -> None:
        self._orders: _Lru[tuple[ColumnarOrder, list[Any]]] = _Lru(orders)
        self._schedules: _Lru[Schedule] = _Lru(orders)
        self._costs: _Lru[tuple[Profile, Topology, StageCosts]] = _Lru(costs)

    def order(self, key: tuple[Any, ...], make: Callable[[], ColumnarOrder]) -> ColumnarOrder:
        """The order of ``key`` (schedule name, stages, microbatches, minibatches, options)."""
        return self._orders.get(key, lambda: (make(), []))[0]

    def schedule(self, key: tuple[Any, ...], make: Callable[[], Schedule]) -> Schedule:
        """The registry schedule of ``key`` (name, counts, ranks, options) for schedules without a columnar order."""
        return self._schedules.get(key, make)

    def stage_costs(self, profile: Profile, plan: Plan, topology: Topology, stage_devices: tuple[int, ...],
                    make: Callable[[], StageCosts]) -> StageCosts:
        """The stage costs of these inputs, computed by ``make`` when not known."""
        fields = tuple((name, value) for name, value in plan if name not in _COUNT_FIELDS)
        # The entry holds the profile and the topology, so their ids cannot be reused while it lives.
        key = (id(profile), id(topology), stage_devices, fields)
        return self._costs.get(key, lambda: (profile, topology, make()))[2]

    def staleness(self, schedule: Schedule, make: Callable[[], Any]) -> Any:
        """The staleness measured on ``schedule``, when it is the schedule of an order held
        here (computed by ``make`` the first time); else ``make()``, not kept."""
        for order, known in self._orders.values():
            if order.schedule is schedule:
                if not known:
                    known.append(make())
                return known[0]
        return make()

    def stats(self) -> dict[str, int]:
        """Hits and misses of the orders and the stage costs."""
        return {"order_hits": self._orders.hits, "order_misses": self._orders.misses,
                "costs_hits": self._costs.hits, "costs_misses": self._costs.misses}
