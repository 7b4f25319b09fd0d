"""PipeDream's partitioner: the best cut of a layer chain into replicated stages on consecutive devices."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from pipesim.errors import ConfigError
from pipesim.plan.costs import Chain, CostModel, CostModelName, DeviceRow, Estimate, StageSpec, estimate, inflight_microbatches
from pipesim.spec.profile import Profile
from pipesim.spec.topology import Topology

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
RELATIVE_TOLERANCE = 1e-9
# The dynamic program keeps, per device count d, replica count and layer boundary, its tables: about
# 58 bytes per such cell (measured 57-59 on 300 and 2,700 layers, 64 to 256 devices, 2026-11-28),
# 8 more where compute and all-reduce overlap. A chain of L layers on N devices has (L+1) N(N+1)/2
# cells with replication free (512 devices on 2,700 layers: about 19 GB), (L+1) N without.
BYTES_PER_CELL = 58
MAX_PARTITIONER_BYTES = 4 << 30


def format_bytes(value: float) -> str:
    """``16.00 GB`` style, decimal units."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if value >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value:.0f} B"


@dataclass(frozen=True, eq=False)
class _Group:
    """Every first stage of the last ``devices`` devices, one row per replica count; built once.

    Row i puts layers [k, j) on ``replicas[i]`` devices: its time is at most T iff
    ``key[i, j] <= key[i, k] + replicas[i] T`` for every key in ``time_keys`` (nondecreasing in j),
    its memory at most M iff ``memory_key[i, j] <= memory_key[i, k] + M - memory_offset[i, k]``,
    and the cut at j costs ``transfer_s[i, j]`` (inf where j is no cut).
    """

    devices: int
    replicas: IntArray
    time_keys: tuple[npt.NDArray[np.float64], ...]
    memory_key: npt.NDArray[np.float64]
    memory_offset: npt.NDArray[np.float64]
    transfer_s: npt.NDArray[np.float64]

    @property
    def rests(self) -> IntArray:
        """Devices left for the stages after the first, per row."""
        return self.devices - self.replicas


@dataclass(frozen=True, eq=False)
class _Tables:
    """What a feasibility pass found, per device count d: which k can start each row, how far it may reach, which cuts work."""

    reachable: BoolArray  # (L+1, N+1): layers [k, L) fit the last d devices
    ok: dict[int, BoolArray]  # d -> (rows, L+1)
    reach: dict[int, IntArray]
    cuts: dict[int, BoolArray]


def check_tables_size(num_layers: int, num_rows: int, overlap: bool, num_devices: int,
                      max_bytes: float = MAX_PARTITIONER_BYTES) -> None:
    """Refuse, before any table is built, a search whose tables would pass ``max_bytes``.

    Raises:
        ConfigError: naming the devices, the layers and the memory the tables would take.
    """
    needed = (num_layers + 1) * num_rows * (BYTES_PER_CELL + 8 * overlap)
    if needed > max_bytes:
        raise ConfigError("devices", num_devices, f"with {num_layers:,} layers the partitioner's tables would need "
                          f"about {needed / 2**30:.1f} GiB, more than its limit of {max_bytes / 2**30:g} GiB "
                          "(pipesim.plan.partition.MAX_PARTITIONER_BYTES); use fewer devices, --straight, or a "
                          "profile of fewer, larger layers")


def _replica_choices(devices: int, replicas: str | int) -> list[int]:
    """The replica counts a first stage on the last ``devices`` devices may take."""
    if replicas == "straight":
        return [1]
    if replicas == "free":
        return list(range(1, devices + 1))
    return [int(replicas)] if devices % int(replicas) == 0 else []


class Partitioner:
    """The dynamic program over (layers, devices, replicas), as feasibility tests under a bisection.

    For limits (T, M) it decides, for every suffix of layers [k, L) and every count d of the
    last devices, whether the suffix can run on them with every stage and cut taking at most T
    per microbatch and every device needing at most M bytes. A stage's time and memory only grow
    as it takes more layers, so the layers a first stage may take from k form a range found by
    ``searchsorted`` on prefix sums, and "some cut in that range leads to a feasible rest" is a
    prefix-sum lookup: for each d, a few operations on (replicas x layers) arrays. The least
    feasible T is found by bisection, jumping to the actual cost of each feasible plan found.

    Args:
        chain, row, model: the layers, devices and cost model.
        replicas: ``"free"`` (any replication), ``"straight"`` (one replica per stage) or an
            int (every stage gets exactly that many, as 2BW's width).
        use_all_devices: when False the pipeline may leave the first devices idle.
    """

    def __init__(self, chain: Chain, row: DeviceRow, model: CostModel, *, replicas: str | int = "free",
                 use_all_devices: bool = True) -> None:
        # The search's objective is the slowest stage or cut: a round trip spans stages, which
        # the prefix structure below cannot see (the candidates' estimates add it).
        self.chain, self.row, self.model = chain, row, replace(model, round_trip=False)
        self.use_all_devices = use_all_devices
        self.groups: dict[int, _Group] = {}
        options = {devices: _replica_choices(devices, replicas) for devices in range(1, row.num_devices + 1)}
        check_tables_size(chain.num_layers, sum(map(len, options.values())), model.overlap, row.num_devices)
        for devices, choices in options.items():
            if choices:
                self.groups[devices] = self._group(devices, choices)

    def _group(self, devices: int, choices: list[int]) -> _Group:
        chain, row, model = self.chain, self.row, self.model
        first = row.num_devices - devices
        length = chain.num_layers + 1
        rows = len(choices)
        compute, allreduce = np.empty((rows, length)), np.empty((rows, length))
        memory_key, memory_offset = np.empty((rows, length)), np.zeros((rows, length))
        transfer = np.full((rows, length), math.inf)
        for index, replicas in enumerate(choices):
            compute[index] = chain.compute_s / float(row.speed[first:first + replicas].min())
            allreduce[index] = chain.param_bytes * model.allreduce_s_per_byte(row, first, replicas)
            inflight = inflight_microbatches(devices, replicas)
            # memory of layers [k, j) = key[j] - key[k] + offset[k] (Chain.stage_stash_bytes and
            # stage_working_bytes); the working bytes inside a layer enter as the chain's largest.
            memory_key[index] = chain.param_bytes * (model.versions(inflight) + 1 + model.optimizer_state_multiplier)
            memory_offset[index, 0] = chain.input_bytes * inflight
            if chain.recompute:
                given = float(chain.stash_bytes[min(chain.input_layers, chain.num_layers)] - chain.stash_bytes[0])
                memory_offset[index, 1:] = chain.output_bytes * inflight
                memory_offset[index, 0] += given * inflight - given
                memory_key[index] += chain.stash_bytes
            else:
                memory_key[index] += chain.stash_bytes * inflight
            memory_key[index, -1] += chain.loss_bytes * inflight
            memory_offset[index] += float(chain.recomputed_bytes.max(initial=0.0))
            if replicas < devices:
                bandwidth = float(row.link_bandwidth[first, first + replicas])
                transfer[index, 1:-1] = model.transfer_factor * chain.output_bytes[:-1] / bandwidth
        time_keys = (compute, allreduce) if model.overlap else (compute + allreduce,)
        return _Group(devices, np.array(choices, dtype=np.int64), time_keys, memory_key, memory_offset, transfer)

    def _reach(self, group: _Group, time_limit: float, memory_limit: float) -> IntArray:
        """Per row and k, the last j such that layers [k, j) meet both limits."""
        num_layers = self.chain.num_layers
        reach = np.full((len(group.replicas), num_layers + 1), num_layers, dtype=np.int64)
        searches = []
        if not math.isinf(time_limit):
            budgets = group.replicas * time_limit
            searches += [(key, key + budgets[:, None]) for key in group.time_keys]
        if not math.isinf(memory_limit):
            searches.append((group.memory_key, group.memory_key + (memory_limit - group.memory_offset)))
        for key, bound in searches:
            for index in range(len(group.replicas)):
                found = np.searchsorted(key[index], bound[index], side="right") - 1
                np.minimum(reach[index], found, out=reach[index])
        return reach

    def feasible(self, time_limit: float, memory_limit: float) -> _Tables | None:
        """The feasibility tables for limits (T, M), or None when no plan meets them."""
        num_layers, n = self.chain.num_layers, self.row.num_devices
        starts = np.arange(num_layers + 1)
        reachable = np.zeros((num_layers + 1, n + 1), dtype=bool)
        reachable[num_layers, 0] = True
        tables = _Tables(reachable, {}, {}, {})
        for devices, group in self.groups.items():
            reach = self._reach(group, time_limit, memory_limit)
            cuts = reachable[:, group.rests].T & (group.transfer_s <= time_limit)
            cuts[:, num_layers] = False
            counts = np.cumsum(cuts, axis=1)
            last = np.clip(np.minimum(reach, num_layers - 1), 0, None)
            ok = (last > starts) & (np.take_along_axis(counts, last, axis=1) > counts)
            final = group.rests == 0
            ok[final] = reach[final] >= num_layers
            ok[:, num_layers] = False
            tables.ok[devices], tables.reach[devices], tables.cuts[devices] = ok, reach, cuts
            reachable[:, devices] = ok.any(axis=0)
        candidates = [n] if self.use_all_devices else range(1, n + 1)
        return tables if any(reachable[0, d] for d in candidates) else None

    def plan(self, tables: _Tables) -> tuple[StageSpec, ...]:
        """A plan the tables found feasible: each stage as long as it may be, then on as many replicas as may be."""
        num_layers, n = self.chain.num_layers, self.row.num_devices
        devices = n if tables.reachable[0, n] else max(d for d in range(1, n + 1) if tables.reachable[0, d])
        stages: list[StageSpec] = []
        start = 0
        while start < num_layers:
            group = self.groups[devices]
            best: tuple[int, int] | None = None
            for index in np.flatnonzero(tables.ok[devices][:, start]).tolist():
                replicas = int(group.replicas[index])
                if replicas == devices:
                    end = num_layers
                else:
                    last = min(int(tables.reach[devices][index, start]), num_layers - 1)
                    end = start + 1 + int(np.flatnonzero(tables.cuts[devices][index, start + 1:last + 1])[-1])
                if best is None or (end, replicas) > best:
                    best = (end, replicas)
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
    cost_model: CostModelName = "simulated",
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
        cost_model: ``"simulated"`` (the engine's ring all-reduce and full-duplex cuts) or
            ``"pipedream"`` (the released optimizer's factors; see ``CostModel.named``).

    Raises:
        ConfigError: no plan exists (e.g. a straight pipeline with more devices than layers), or
            none fits ``memory_bytes`` (the message names the smallest memory that would fit).
    """
    chain = Chain.from_profile(profile)
    row = DeviceRow.from_topology(topology, num_devices)
    if straight and use_all_devices and row.num_devices > chain.num_layers:
        raise ConfigError("devices", row.num_devices,
                          f"a straight pipeline needs a layer per device, the profile has {chain.num_layers}")
    model = CostModel.named(cost_model, overlap=overlap, optimizer_state_multiplier=optimizer_state_multiplier)
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
