"""ZB-auto: the zero-bubble paper's automatic schedule, F/I/W placed greedily from stage times under a memory limit."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import NamedTuple

from pipesim.errors import ConfigError
from pipesim.schedule.ir import Op, OpKind, Schedule, ScheduleTable
from pipesim.schedule.multi_stage import assemble
from pipesim.schedule.zb_h1 import one_stage_per_rank_only, zb_h1
from pipesim.schedule.zb_h2 import zb_h2

# Op kinds as small integers while placing (an OpKind hashes in Python, slowly); KINDS maps them back.
F, I, W = 0, 1, 2
KINDS = (OpKind.F, OpKind.I, OpKind.W)


@dataclass(frozen=True)
class ZeroBubbleCosts:
    """What the heuristic knows of each stage s: op times, link times and memory per op.

    Attributes:
        forward_s, backward_input_s, backward_weight_s: F, I and W time of one microbatch, seconds.
        forward_comm_s: per boundary s (p-1 entries), the time of an activation from s to s+1;
            empty: free.
        backward_comm_s: per boundary s, the time of a gradient from s+1 to s; empty: free.
        forward_bytes: memory an F adds (the stage's stash per microbatch); empty: 1 each.
        input_bytes: memory an I adds: below 0 where it frees part of the stash, above 0 where
            it re-creates recomputed activations that W needs; empty: 0. W frees the rest,
            ``-(forward_bytes + input_bytes)``.
        update_s: the stage's update (U), which follows its last W of a minibatch; empty: 0.
        forward_hold_s, backward_hold_s: per boundary s, how long a send of the comm fields
            holds its link (bytes / bandwidth: latency pipelines, as the engines run it); empty:
            its whole link time.
    """

    forward_s: tuple[float, ...]
    backward_input_s: tuple[float, ...]
    backward_weight_s: tuple[float, ...]
    forward_comm_s: tuple[float, ...] = ()
    backward_comm_s: tuple[float, ...] = ()
    forward_bytes: tuple[float, ...] = ()
    input_bytes: tuple[float, ...] = ()
    update_s: tuple[float, ...] = ()
    forward_hold_s: tuple[float, ...] = ()
    backward_hold_s: tuple[float, ...] = ()

    @classmethod
    def uniform(cls, num_stages: int) -> ZeroBubbleCosts:
        """Equal F, I and W on every stage, free links: the paper's balanced case."""
        ones = (1.0,) * num_stages
        return cls(forward_s=ones, backward_input_s=ones, backward_weight_s=ones)

    def checked(self, num_stages: int) -> ZeroBubbleCosts:
        """These costs with the empty fields filled in, for ``num_stages`` stages.

        Raises:
            ConfigError: a field of the wrong length, or a value not finite or (times) negative.
        """
        forward_comm_s = self.forward_comm_s or (0.0,) * (num_stages - 1)
        backward_comm_s = self.backward_comm_s or (0.0,) * (num_stages - 1)
        filled = {
            "forward_comm_s": forward_comm_s,
            "backward_comm_s": backward_comm_s,
            "forward_hold_s": self.forward_hold_s or forward_comm_s,
            "backward_hold_s": self.backward_hold_s or backward_comm_s,
            "forward_bytes": self.forward_bytes or (1.0,) * num_stages,
            "input_bytes": self.input_bytes or (0.0,) * num_stages,
            "update_s": self.update_s or (0.0,) * num_stages,
        }
        costs = ZeroBubbleCosts(self.forward_s, self.backward_input_s, self.backward_weight_s, **filled)
        for name, values in vars(costs).items():
            size = num_stages - 1 if name.endswith(("comm_s", "hold_s")) else num_stages
            if len(values) != size:
                raise ConfigError(f"zb_auto.{name}", list(values), f"must have {size} entries for {num_stages} stages")
            signed = name == "input_bytes"
            bad = [v for v in values if not math.isfinite(v) or (v < 0 and not signed)]
            if bad:
                raise ConfigError(f"zb_auto.{name}", bad[0], "must be finite" + ("" if signed else " and >= 0"))
        return costs


class Knobs(NamedTuple):
    """The heuristic's three binary hyperparameters; ``zb_auto`` tries all eight.

    bubble_before_first_b: warm-up forwards stop before one would end after the first
        gradient arrives (a gap shorter than an F may remain) instead of running until the
        stage is busy past that arrival (which may delay the first I).
    skip_forward: a stage already two or more forwards ahead of the next one skips its F
        when waiting for the gradient instead costs no more than the largest bubble so far.
    fill_small_gaps: a gap shorter than a W gets a W even when the gap would not make the
        stage's accumulated bubble the largest (it always gets one when it would).
    """

    bubble_before_first_b: bool
    skip_forward: bool
    fill_small_gaps: bool


class Placement:
    """Ops placed one at a time, each as early as its stage and its input allow.

    Holds, per stage, the ops placed (in order), the next microbatch of each kind, when the
    stage is free, its memory and its peak, and the idle time it has had since its first F;
    per op its end and the arrival of its input; per link when its last send arrives.
    """

    def __init__(self, costs: ZeroBubbleCosts, num_microbatches: int, per_minibatch: int | None = None) -> None:
        p = len(costs.forward_s)
        self.costs = costs
        self.num_microbatches = num_microbatches
        self.per_minibatch = per_minibatch or num_microbatches
        self.orders: list[list[tuple[int, int]]] = [[] for _ in range(p)]
        self.next = [[0] * p for _ in KINDS]
        self.free_s = [0.0] * p
        self.memory = [0.0] * p
        self.peak_memory = [0.0] * p
        self.bubble_s = [0.0] * p
        self.max_bubble_s = 0.0
        self.end_s: dict[tuple[int, int, int], float] = {}
        self.arrival_s: dict[tuple[int, int, int], float] = {}
        self.link_free_s: dict[tuple[int, int], float] = {}
        self.durations = (costs.forward_s, costs.backward_input_s, costs.backward_weight_s)
        self.deltas = (costs.forward_bytes, costs.input_bytes,
                       tuple(-(f + i) for f, i in zip(costs.forward_bytes, costs.input_bytes, strict=True)))

    def duration(self, stage: int, kind: int) -> float:
        """Time of one ``kind`` op on ``stage``."""
        return self.durations[kind][stage]

    def memory_delta(self, stage: int, kind: int) -> float:
        """What a ``kind`` op adds to ``stage``'s memory."""
        return self.deltas[kind][stage]

    def ops(self, stage: int) -> list[Op]:
        """The ops placed on ``stage``, in order."""
        return [Op(stage, KINDS[kind], microbatch) for kind, microbatch in self.orders[stage]]

    def arrival(self, stage: int, kind: int, microbatch: int) -> float:
        """When the input of ``stage``'s ``kind`` op of ``microbatch`` arrives (0: none crosses a link).

        Its upstream op must have been placed.
        """
        if (kind == F and stage > 0) or (kind == I and stage < len(self.free_s) - 1):
            return self.arrival_s[(stage, kind, microbatch)]
        return 0.0

    def send(self, stage: int, kind: int, microbatch: int) -> None:
        """Send the output of the op just placed over its link, first in first out (as the
        engines' kernel does): it leaves when the op ends and the link's previous send has left
        its bytes on the link (latency pipelines), and arrives its link time later."""
        if kind == F and stage < len(self.free_s) - 1:
            receiver, link_s, hold_s = stage + 1, self.costs.forward_comm_s[stage], self.costs.forward_hold_s[stage]
        elif kind == I and stage > 0:
            receiver, link_s, hold_s = stage - 1, self.costs.backward_comm_s[stage - 1], \
                self.costs.backward_hold_s[stage - 1]
        else:
            return
        leaves_s = max(self.free_s[stage], self.link_free_s.get((stage, kind), 0.0))
        self.link_free_s[(stage, kind)] = leaves_s + hold_s
        self.arrival_s[(receiver, kind, microbatch)] = leaves_s + link_s

    def has(self, stage: int, kind: int) -> bool:
        """Whether ``stage`` has a ``kind`` op left (a W only once its I ran)."""
        limit = self.next[I][stage] if kind == W else self.num_microbatches
        return self.next[kind][stage] < limit

    def place(self, stage: int, kind: int) -> None:
        """Append the next ``kind`` op of ``stage``, starting when the stage is free and its input is in."""
        microbatch = self.next[kind][stage]
        start = max(self.free_s[stage], self.arrival(stage, kind, microbatch))
        if self.next[F][stage] > 0 and start > self.free_s[stage]:
            self.bubble_s[stage] += start - self.free_s[stage]
            self.max_bubble_s = max(self.max_bubble_s, self.bubble_s[stage])
        self.free_s[stage] = self.end_s[(stage, kind, microbatch)] = start + self.durations[kind][stage]
        self.send(stage, kind, microbatch)
        self.memory[stage] += self.deltas[kind][stage]
        self.peak_memory[stage] = max(self.peak_memory[stage], self.memory[stage])
        self.next[kind][stage] += 1
        self.orders[stage].append((kind, microbatch))
        if kind == W and self.next[W][stage] % self.per_minibatch == 0:  # the minibatch's U follows
            self.free_s[stage] += self.costs.update_s[stage]

    def span_s(self) -> float:
        """The longest stage's span, first F's start to last op's end: a minibatch's time when
        minibatches run back to back on every stage (the reference heuristic's measure)."""
        return max(self.free_s[s] - self.end_s[(s, F, 0)] + self.costs.forward_s[s] for s in range(len(self.free_s)))

    def makespan_s(self) -> float:
        """When the last op of the minibatch ends."""
        return max(self.free_s)


def greedy(costs: ZeroBubbleCosts, num_microbatches: int, memory_limit: float, knobs: Knobs) -> Placement | None:
    """The heuristic of Qi et al. (ICLR 2024, section 3.1) for one minibatch; None where it runs
    out of memory (a stage must free memory but has no W left to run).

    Warm-up: the first F on every stage, then as many more F per stage as fit the memory and
    the wait for the first gradient, fewer on each later stage; then each stage's first I.
    Then, microbatch by microbatch, one F per stage (stage 0 first) and one I per stage (last
    stage first), each preceded by the W that fit the wait for its input, a W into a shorter
    gap when it would otherwise grow the largest accumulated bubble, and the W that free
    memory for it. The W left over close every stage.
    """
    place = Placement(costs, num_microbatches)
    p, m = len(costs.forward_s), num_microbatches
    for stage in range(p):
        place.place(stage, F)
    extra = warmup_forwards(place, memory_limit, knobs.bubble_before_first_b)
    for stage in range(p):
        for _ in range(extra[stage]):
            place.place(stage, F)
    for stage in reversed(range(p)):
        place.place(stage, I)
    for _ in range(1, m):  # microbatch 1, 2, ...: an F where wanted, then an I on every stage
        wanted = [place.has(s, F) and not (knobs.skip_forward and skips_forward(place, s, memory_limit))
                  for s in range(p)]
        for stage in reversed(range(p - 1)):  # a stage runs an F only when the next one does
            wanted[stage] = wanted[stage] and wanted[stage + 1]
        for stage in (s for s in range(p) if wanted[s]):
            if not make_room(place, stage, F, memory_limit):
                return None
            fill_wait(place, stage, F, knobs.fill_small_gaps)
            place.place(stage, F)
        for stage in reversed(range(p)):
            if not make_room(place, stage, I, memory_limit):
                return None
            fill_wait(place, stage, I, knobs.fill_small_gaps)
            if stage == 0 and not place.has(0, F):
                while place.has(0, W):
                    place.place(0, W)
            place.place(stage, I)
    for stage in range(p):
        while place.has(stage, W):
            place.place(stage, W)
    return place


def warmup_forwards(place: Placement, memory_limit: float, bubble_before_first_b: bool) -> list[int]:
    """Per stage, the F to run after its first one and before its first I.

    From the last stage up, the first gradient's arrival is estimated (each stage's F back
    to back, then its I); a stage adds F while memory allows and the F keeps it busy until
    that arrival. A stage then runs fewer than the one before it, unless it would run all,
    and never more: the reference lets a stage that would run all get ahead of the one before
    it, and then times that stage's F as if its input had arrived at 0.
    """
    costs, p, m = place.costs, len(place.free_s), place.num_microbatches
    extra = [0] * p
    gradient_end_s = place.end_s[(p - 1, F, 0)] + costs.backward_input_s[p - 1]
    for stage in reversed(range(p - 1)):
        memory, busy_s = place.memory[stage], place.free_s[stage]
        arrival_s = gradient_end_s + costs.backward_comm_s[stage]
        while place.next[F][stage] + extra[stage] < m and memory + costs.forward_bytes[stage] <= memory_limit:
            ends_late = busy_s + costs.forward_s[stage] > arrival_s if bubble_before_first_b else busy_s >= arrival_s
            if ends_late:
                break
            memory += costs.forward_bytes[stage]
            busy_s += costs.forward_s[stage]
            extra[stage] += 1
        gradient_end_s = max(busy_s, arrival_s) + costs.backward_input_s[stage]
    for stage in range(1, p):
        upstream = place.next[F][stage - 1] + extra[stage - 1]
        while extra[stage] > 0 and (place.next[F][stage] + extra[stage] > upstream
                                    or (extra[stage] >= extra[stage - 1] and place.next[F][stage] + extra[stage] < m)):
            extra[stage] -= 1
    return extra


def skips_forward(place: Placement, stage: int, memory_limit: float) -> bool:
    """Whether ``stage``, two or more forwards ahead of the next stage, should wait for its
    next gradient instead of running an F: when it is already busy past the gradient's
    estimated arrival, or when the F (and the W that free memory for it) would end after it
    and the wait costs no more than the largest bubble so far."""
    if stage == len(place.free_s) - 1 or place.next[F][stage] < place.next[F][stage + 1] + 2:
        return False
    costs, down = place.costs, stage + 1
    gradient_s = (place.free_s[down] + costs.forward_s[down] + costs.backward_input_s[down]
                  + costs.backward_comm_s[stage])
    if place.free_s[stage] >= gradient_s:
        return True
    memory = place.memory[stage] + costs.forward_bytes[stage]
    weights_s, weight = 0.0, place.next[W][stage]
    while memory > memory_limit and weight < place.next[I][stage]:
        weights_s += costs.backward_weight_s[stage]
        memory += place.memory_delta(stage, W)
        weight += 1
    if place.free_s[stage] + costs.forward_s[stage] + weights_s <= gradient_s:
        return False
    return gradient_s - place.free_s[stage] <= place.max_bubble_s - place.bubble_s[stage]


def make_room(place: Placement, stage: int, kind: int, memory_limit: float) -> bool:
    """Run W on ``stage`` until the ``kind`` op fits the memory limit; False when none is left."""
    while place.memory[stage] + place.memory_delta(stage, kind) > memory_limit:
        if not place.has(stage, W):
            return False
        place.place(stage, W)
    return True


def fill_wait(place: Placement, stage: int, kind: int, fill_small_gaps: bool) -> None:
    """Run W on ``stage`` while the input of its next ``kind`` op is on its way: every W that
    ends by the arrival, then one more into the remaining gap when ``fill_small_gaps`` or when
    the gap would make this stage's accumulated bubble the largest."""
    neighbour = stage - 1 if kind == F else stage + 1
    if not 0 <= neighbour < len(place.free_s):
        return
    arrival_s = place.arrival(stage, kind, place.next[kind][stage])
    while place.has(stage, W) and place.free_s[stage] + place.duration(stage, W) <= arrival_s:
        place.place(stage, W)
    if place.has(stage, W) and place.free_s[stage] < arrival_s:
        gap_is_harmless = arrival_s - place.free_s[stage] <= place.max_bubble_s - place.bubble_s[stage]
        if fill_small_gaps or not gap_is_harmless:
            place.place(stage, W)


Order = list[tuple[int, int]]  # one stage's ops as (kind, microbatch), each kind's microbatches rising


def replay(costs: ZeroBubbleCosts, num_microbatches: int, orders: list[Order],
           per_minibatch: int | None = None) -> Placement:
    """Time given per-stage F/I/W orders with ``Placement`` (each op placed once its input is),
    of ``num_microbatches`` in minibatches of ``per_minibatch`` (default: one minibatch)."""
    place = Placement(costs, num_microbatches, per_minibatch)
    last = len(orders) - 1
    cursor = [0] * len(orders)
    remaining = sum(len(order) for order in orders)
    while remaining:
        progressed = False
        for stage, order in enumerate(orders):
            while cursor[stage] < len(order):
                kind, microbatch = order[cursor[stage]]
                crosses = (kind == F and stage > 0) or (kind == I and stage < last)
                if crosses and (stage, kind, microbatch) not in place.arrival_s:
                    break
                place.place(stage, kind)
                cursor[stage] += 1
                remaining -= 1
                progressed = True
        assert progressed, "a zero-bubble order waits on itself"
    return place


def back_to_back_s(costs: ZeroBubbleCosts, num_microbatches: int, orders: list[Order]) -> float:
    """The time between the ends of two minibatches run back to back with ``orders`` (each
    stage starting the next as soon as it is done): the iteration time of a run of several."""
    m = num_microbatches
    twice = [order + [(kind, microbatch + m) for kind, microbatch in order] for order in orders]
    ends = [0.0, 0.0]
    for (_, _, microbatch), end_s in replay(costs, 2 * m, twice, m).end_s.items():
        ends[microbatch // m] = max(ends[microbatch // m], end_s)
    return ends[1] - ends[0]


def zb_auto(
    num_stages: int,
    num_microbatches: int,
    *,
    num_minibatches: int = 1,
    num_ranks: int | None = None,
    costs: ZeroBubbleCosts | None = None,
    memory_limit: float | None = None,
) -> Schedule:
    """ZB-auto (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, sections 3.1 and 4).

    The paper's heuristic, run with each of its eight hyperparameter settings (``Knobs``) on
    the stages' own F, I, W and link times; the ZB-H1 and ZB-H2 orders join as candidates
    where they fit the memory limit. Each candidate is timed as the engines time it (ops as
    early as their rank and input allow, a link adding its time, a stage's update its own) and the
    fastest wins: the shortest makespan for one minibatch, for several the shortest time
    between the ends of two run back to back (the iteration time the metrics report for K = 2
    and 3); ties go to the earlier candidate. The reference ranks by the longest stage's span
    instead (first F to last W), which minibatches of different stages running into each
    other can exceed.

    Args:
        costs: per-stage times and memory; default: equal F, I and W, free links.
        memory_limit: the activations a stage may hold, in microbatches: units of the most
            one microbatch keeps on any stage (its stash, or what I re-creates where it is
            recomputed); default ``num_stages`` (ZB-1p, 1F1B's peak); twice that is ZB-2p.

    Raises:
        ConfigError: several stages per rank, costs that do not fit the stages, or a memory
            limit no candidate fits.
    """
    one_stage_per_rank_only("zb-auto", num_stages, num_ranks)
    p, m = num_stages, num_microbatches
    costs = (costs or ZeroBubbleCosts.uniform(p)).checked(p)
    limit = float(p if memory_limit is None else memory_limit)
    if not (math.isfinite(limit) and limit > 0):
        raise ConfigError("zb_memory_limit", memory_limit, "must be a number of microbatches > 0")
    unit = max(max(f, f + i) for f, i in zip(costs.forward_bytes, costs.input_bytes, strict=True))
    limit_bytes = limit * unit * (1 + 1e-9)  # a running sum of the memory deltas drifts by a few ulps
    candidates = [greedy(costs, m, limit_bytes, Knobs(*knobs))
                  for knobs in itertools.product((True, False), repeat=3)]
    index = {kind: code for code, kind in enumerate(KINDS)}
    for handcrafted in (zb_h1(p, m), zb_h2(p, m)):
        orders = [[(index[op.kind], op.microbatch) for op in ops if op.kind is not OpKind.U]
                  for ops in handcrafted.ranks]
        timed = replay(costs, m, orders)
        candidates.append(timed if max(timed.peak_memory) <= limit_bytes else None)
    fitting = [c for c in candidates if c is not None]
    if not fitting:
        raise ConfigError("zb_memory_limit", memory_limit, f"is too small: no zero-bubble order of {m} microbatches "
                          f"on {p} stages keeps within {limit:g} microbatches of activations per stage")
    if num_minibatches == 1:
        best = min(fitting, key=Placement.makespan_s)
    else:
        best = min(fitting, key=lambda candidate: back_to_back_s(costs, m, candidate.orders))
    return assemble("zb-auto", p, m, num_minibatches, tuple(range(p)),
                    ScheduleTable.from_ranks([best.ops(stage) for stage in range(p)]))
