"""A reference list scheduler for a fixed per-rank order, written for clarity rather than speed.

It is the model the DES engine is compared with: given a lowered program's rows (per rank, its
ops in order, each op's duration, the ops it waits for and where its output goes:
``Program.ranks``), it works out when every op starts and ends, completing one instant at a time.

Rules, all of them:
- a rank runs its ops in order, one at a time;
- an op starts when the op before it on its rank has ended and each input has arrived;
- an op's output to another rank travels over that direction's link, first come first served:
  it leaves once the link is free, holds the link for ``link_hold_s`` (its bytes over the
  bandwidth) and arrives ``transfer_s`` after leaving (latency pipelines: the next message may
  leave before this one arrives); to its own rank it is available as soon as the op ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipesim.engine.lowering import LoweredOp
from pipesim.schedule.ir import Op


@dataclass(frozen=True)
class Timed:
    """One interval: a compute op on ``rank`` at ``position``, or a send from ``rank`` to ``peer``."""

    rank: int
    position: int
    op: Op
    start_s: float
    end_s: float
    peer: int = -1


@dataclass
class ReferenceScheduler:
    """Steps a program's fixed order through time, one completion instant per ``step()``."""

    ranks: tuple[tuple[LoweredOp, ...], ...]
    now_s: float = float("-inf")  # every op that ends at or before now_s has been completed
    next_position: list[int] = field(default_factory=list)
    rank_free_s: list[float] = field(default_factory=list)
    link_free_s: dict[tuple[int, int], float] = field(default_factory=dict)
    arrived_s: dict[Op, float] = field(default_factory=dict)
    computed: list[Timed] = field(default_factory=list)
    sent: list[Timed] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.next_position = [0] * len(self.ranks)
        self.rank_free_s = [0.0] * len(self.ranks)

    @property
    def is_finished(self) -> bool:
        """True when every op has run."""
        return all(position == len(ops) for position, ops in zip(self.next_position, self.ranks, strict=True))

    def _ready(self) -> list[Timed]:
        """Each rank's next op whose inputs have all been sent, with the start and end it gets."""
        ready = []
        for rank, ops in enumerate(self.ranks):
            position = self.next_position[rank]
            if position == len(ops):
                continue
            lowered = ops[position]
            if not all(dep in self.arrived_s for dep in lowered.waits_for):
                continue
            start = max([self.rank_free_s[rank], *(self.arrived_s[dep] for dep in lowered.waits_for)])
            ready.append(Timed(rank, position, lowered.op, start, start + lowered.duration_s))
        return ready

    def _complete(self, timed: Timed) -> None:
        lowered = self.ranks[timed.rank][timed.position]
        self.computed.append(timed)
        self.next_position[timed.rank] += 1
        self.rank_free_s[timed.rank] = timed.end_s
        if lowered.send_rank == timed.rank:
            self.arrived_s[lowered.op] = timed.end_s
        elif lowered.send_rank >= 0:
            link = (timed.rank, lowered.send_rank)
            start = max(timed.end_s, self.link_free_s.get(link, 0.0))
            end = start + lowered.transfer_s
            self.link_free_s[link] = start + lowered.link_hold_s
            self.arrived_s[lowered.op] = end
            self.sent.append(Timed(timed.rank, timed.position, lowered.op, start, end, lowered.send_rank))

    def step(self) -> float:
        """Complete every op that ends at the next instant; return that instant, seconds.

        The ready op that ends first cannot be overtaken: anything not ready yet waits for an
        op that ends no earlier. Ops that become ready and end at the same instant (zero
        durations) complete in the same step.

        Raises:
            RuntimeError: no op is ready although some remain (a deadlock).
        """
        ready = self._ready()
        if not ready:
            raise RuntimeError("deadlock: no rank can start its next op")
        instant = min(timed.end_s for timed in ready)
        while ready and min(timed.end_s for timed in ready) == instant:
            for timed in ready:
                if timed.end_s == instant:
                    self._complete(timed)
            ready = self._ready()
        self.now_s = instant
        return instant

    def run(self) -> list[Timed]:
        """Step to the end; every compute interval, in completion order."""
        while not self.is_finished:
            self.step()
        return self.computed
