"""PipeDream's partitioner: the best cut of a layer chain into replicated stages on consecutive devices."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pipesim.errors import ConfigError
from pipesim.plan.costs import Chain, CostModel, DeviceRow, Estimate, StageSpec, estimate, inflight_microbatches
from pipesim.spec.profile import Profile
from pipesim.spec.topology import Topology

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
RELATIVE_TOLERANCE = 1e-9


def format_bytes(value: float) -> str:
    """``16.00 GB`` style, decimal units."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if value >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value:.0f} B"


@dataclass(frozen=True, eq=False)
class _Option:
    """Layers [k, j) as the first stage of the last ``devices`` devices, on ``replicas`` of them.

    Everything here is independent of the time and memory limits, so it is built once.
    """

    devices: int
    replicas: int
    time_key: tuple[npt.NDArray[np.float64], ...]  # nondecreasing in j; stage time <= T iff key[j] <= key[k] + r T
    memory_key: npt.NDArray[np.float64]  # nondecreasing in j
    memory_offset: npt.NDArray[np.float64]  # memory <= M iff memory_key[j] <= memory_key[k] + M - offset[k]
    transfer_s: npt.NDArray[np.float64]  # (L+1,): the cut at j (inf where j is not a cut)

    @property
    def rest(self) -> int:
        return self.devices - self.replicas


@dataclass(frozen=True, eq=False)
class _Tables:
    """What a feasibility pass found: per option, which k can start it, how far it may reach, which cuts work."""

    reachable: BoolArray  # (L+1, N+1): layers [k, L) fit the last d devices
    ok: dict[tuple[int, int], BoolArray]
    reach: dict[tuple[int, int], IntArray]
    cuts: dict[tuple[int, int], BoolArray]


class Partitioner:
    """The dynamic program over (layers, devices, replicas), as feasibility tests under a bisection.

    For limits (T, M) it decides, for every suffix of layers [k, L) and every count d of the
    last devices, whether the suffix can run on them with every stage and cut taking at most T
    per microbatch and every device needing at most M bytes. A stage's time and memory only grow
    as it takes more layers, so the layers a first stage may take from k form a range found by
    ``searchsorted`` on prefix sums, and "some cut in that range leads to a feasible rest" is a
    prefix-sum lookup: each (d, r) pair costs a few vector operations over the layers. The least
    feasible T is found by bisection, jumping to the actual cost of each feasible plan found.

    Args:
        chain, row, model: the layers, devices and cost model.
        replicas: ``"free"`` (any replication), ``"straight"`` (one replica per stage) or an
            int (every stage gets exactly that many, as 2BW's width).
        use_all_devices: when False the pipeline may leave the first devices idle.
    """

    def __init__(self, chain: Chain, row: DeviceRow, model: CostModel, *, replicas: str | int = "free",
                 use_all_devices: bool = True) -> None:
        self.chain, self.row, self.model = chain, row, model
        self.use_all_devices = use_all_devices
        n = row.num_devices
        self.options: dict[int, list[_Option]] = {}
        for devices in range(1, n + 1):
            if replicas == "straight":
                choices = [1]
            elif replicas == "free":
                choices = list(range(1, devices + 1))
            else:
                choices = [int(replicas)] if devices % int(replicas) == 0 else []
            self.options[devices] = [self._option(devices, r) for r in choices]

    def _option(self, devices: int, replicas: int) -> _Option:
        chain, row, model = self.chain, self.row, self.model
        first = row.num_devices - devices
        speed = float(row.speed[first:first + replicas].min())
        compute = chain.compute_s / speed
        allreduce = chain.param_bytes * model.allreduce_s_per_byte(row, first, replicas)
        time_key = (compute, allreduce) if model.overlap else (compute + allreduce,)
        inflight = inflight_microbatches(devices, replicas)
        per_weight_byte = model.versions(inflight) + 1 + model.optimizer_state_multiplier
        memory_key = chain.param_bytes * per_weight_byte
        length = chain.num_layers + 1
        if chain.recompute:
            offset = np.concatenate(([0.0], chain.output_bytes)) * inflight
        else:
            memory_key = memory_key + chain.stash_bytes * inflight
            offset = np.zeros(length)
        transfer = np.full(length, math.inf)
        if replicas < devices:
            bandwidth = float(row.link_bandwidth[first, first + replicas])
            transfer[1:-1] = model.transfer_factor * chain.output_bytes[:-1] / bandwidth
        return _Option(devices, replicas, time_key, memory_key, offset, transfer)

    def _reach(self, option: _Option, time_limit: float, memory_limit: float) -> IntArray:
        """Per k, the last j such that layers [k, j) on this option meet both limits."""
        budget = option.replicas * time_limit
        reach = np.full(self.chain.num_layers + 1, self.chain.num_layers, dtype=np.int64)
        for key in option.time_key:
            reach = np.minimum(reach, np.searchsorted(key, key + budget, side="right") - 1)
        if math.isinf(memory_limit):
            return reach
        bound = option.memory_key + (memory_limit - option.memory_offset)
        return np.minimum(reach, np.searchsorted(option.memory_key, bound, side="right") - 1)

    def feasible(self, time_limit: float, memory_limit: float) -> _Tables | None:
        """The feasibility tables for limits (T, M), or None when no plan meets them."""
        num_layers, n = self.chain.num_layers, self.row.num_devices
        starts = np.arange(num_layers + 1)
        reachable = np.zeros((num_layers + 1, n + 1), dtype=bool)
        reachable[num_layers, 0] = True
        tables = _Tables(reachable, {}, {}, {})
        for devices in range(1, n + 1):
            column = np.zeros(num_layers + 1, dtype=bool)
            for option in self.options[devices]:
                if option.rest and not reachable[:, option.rest].any():
                    continue
                reach = self._reach(option, time_limit, memory_limit)
                key = (devices, option.replicas)
                if option.rest == 0:
                    ok = reach >= num_layers
                else:
                    cuts = reachable[:, option.rest] & (option.transfer_s <= time_limit)
                    counts = np.cumsum(cuts)
                    last = np.clip(np.minimum(reach, num_layers - 1), 0, None)
                    ok = (last > starts) & (counts[last] > counts[starts])
                    tables.cuts[key] = cuts
                ok[num_layers] = False
                tables.ok[key], tables.reach[key] = ok, reach
                column |= ok
            reachable[:, devices] = column
        candidates = [n] if self.use_all_devices else range(1, n + 1)
        return tables if any(reachable[0, d] for d in candidates) else None

    def plan(self, tables: _Tables) -> tuple[StageSpec, ...]:
        """A plan the tables found feasible: each stage as long as it may be, then on as many replicas as may be."""
        num_layers, n = self.chain.num_layers, self.row.num_devices
        devices = n if tables.reachable[0, n] else max(d for d in range(1, n + 1) if tables.reachable[0, d])
        stages: list[StageSpec] = []
        start = 0
        while start < num_layers:
            best: tuple[int, int] | None = None
            for option in self.options[devices]:
                key = (devices, option.replicas)
                if key not in tables.ok or not tables.ok[key][start]:
                    continue
                if option.rest == 0:
                    end = num_layers
                else:
                    last = min(int(tables.reach[key][start]), num_layers - 1)
                    end = start + 1 + int(np.flatnonzero(tables.cuts[key][start + 1:last + 1])[-1])
                if best is None or (end, option.replicas) > best:
                    best = (end, option.replicas)
            assert best is not None, "feasibility tables without a plan"
            end, replicas = best
            stages.append((start, end, replicas))
            start, devices = end, devices - replicas
        return tuple(stages)

    def _minimize(self, feasible_at: Callable[[float], _Tables | None], value_of: Callable[[tuple[StageSpec, ...]], float],
                  upper: float, lower: float) -> tuple[StageSpec, ...] | None:
        tables = feasible_at(upper)
        if tables is None:
            return None
        best = self.plan(tables)
        high, low = value_of(best), max(0.0, lower)
        # Bisection steps alternate with asking for anything strictly better than the best plan so
        # far: once that plan is optimal the next ask fails and the search ends.
        ask_better = False
        while high - low > RELATIVE_TOLERANCE * high:
            if ask_better:
                middle = high * (1 - RELATIVE_TOLERANCE)
            else:
                middle = math.sqrt(low * high) if low > 0 and high > 4 * low else (low + high) / 2
            tables = feasible_at(middle)
            if tables is None:
                low = middle
            else:
                best = self.plan(tables)
                high = min(middle, value_of(best))
            ask_better = not ask_better
        return best

    def fastest(self, memory_limit: float = math.inf) -> tuple[StageSpec, ...] | None:
        """The plan with the least time per microbatch under ``memory_limit``, or None if none fits."""
        lower = float(self.chain.compute_s[-1] / (self.row.num_devices * self.row.speed.max()))
        return self._minimize(lambda t: self.feasible(t, memory_limit), self.time_of, math.inf, lower)

    def smallest(self) -> tuple[StageSpec, ...] | None:
        """The plan needing the least memory per device (whatever its time), or None if no plan exists."""
        return self._minimize(lambda m: self.feasible(math.inf, m), self.memory_of, math.inf, 0.0)

    def time_of(self, stages: tuple[StageSpec, ...]) -> float:
        """The cost model's time per microbatch of ``stages``."""
        return estimate(self.chain, self.row, self.model, stages).time_s

    def memory_of(self, stages: tuple[StageSpec, ...]) -> float:
        """The cost model's peak bytes per device of ``stages``."""
        return estimate(self.chain, self.row, self.model, stages).peak_memory_bytes


@dataclass(frozen=True)
class PipeDreamPlan:
    """The partitioner's answer.

    Attributes:
        stages: per stage ``(start, end, replicas)``; stage 0 starts on device ``first_device``.
        estimate: the cost model's view of it.
        data_parallel: the cost model's view of plain data parallelism on all the devices.
        model: the cost model used.
        num_devices: devices the plan could use.
    """

    stages: tuple[StageSpec, ...]
    estimate: Estimate
    data_parallel: Estimate
    model: CostModel
    num_devices: int

    @property
    def first_device(self) -> int:
        """Device of stage 0's first replica (stages then take consecutive devices)."""
        return self.num_devices - sum(replicas for _, _, replicas in self.stages)


def no_plan_error(memory_limit: float, smallest: float | None, what: str) -> ConfigError:
    """The error for a memory limit no plan meets, naming the smallest memory that fits."""
    if smallest is None:
        return ConfigError("devices", what, "no plan exists for these devices and layers")
    return ConfigError(
        "memory", format_bytes(memory_limit),
        f"no {what} plan fits in {format_bytes(memory_limit)} per device; the smallest per-device "
        f"memory any plan needs is {format_bytes(smallest)} ({math.ceil(smallest)} bytes)",
    )


def partition(
    profile: Profile,
    topology: Topology,
    *,
    num_devices: int | None = None,
    memory_bytes: float = math.inf,
    straight: bool = False,
    overlap: bool = False,
    optimizer_state_multiplier: float = 1.0,
    use_all_devices: bool = True,
) -> PipeDreamPlan:
    """PipeDream's partition of ``profile`` over the first ``num_devices`` devices of ``topology``.

    Minimizes the time per microbatch (slowest stage or cut) of :class:`CostModel`; stages take
    consecutive devices, each charged the bandwidth of the links it actually crosses.

    Args:
        memory_bytes: per-device memory limit (weights x versions in flight, gradients,
            optimizer state, stashed activations).
        straight: no replication: one device per stage.
        overlap: compute and all-reduce overlap (the paper) instead of adding (the released optimizer).
        use_all_devices: as PipeDream's optimizer by default; False lets the first devices idle.

    Raises:
        ConfigError: no plan exists (e.g. a straight pipeline with more devices than layers), or
            none fits ``memory_bytes`` (the message names the smallest memory that would fit).
    """
    chain = Chain.from_profile(profile)
    row = DeviceRow.from_topology(topology, num_devices)
    if straight and use_all_devices and row.num_devices > chain.num_layers:
        raise ConfigError("devices", row.num_devices,
                          f"a straight pipeline needs a layer per device, the profile has {chain.num_layers}")
    model = CostModel(overlap=overlap, optimizer_state_multiplier=optimizer_state_multiplier)
    solver = Partitioner(chain, row, model, replicas="straight" if straight else "free",
                         use_all_devices=use_all_devices)
    stages = solver.fastest(memory_bytes)
    if stages is None:
        smallest = solver.smallest()
        raise no_plan_error(memory_bytes, solver.memory_of(smallest) if smallest else None,
                            "straight" if straight else "PipeDream")
    return PipeDreamPlan(
        stages=stages,
        estimate=estimate(chain, row, model, stages),
        data_parallel=estimate(chain, row, model, ((0, chain.num_layers, row.num_devices),)),
        model=model,
        num_devices=row.num_devices,
    )
