"""PipeDream's released optimizer, reproduced: its recurrence, all-reduce, hierarchy and quirks on a layer chain.

``optimizer_graph_hierarchical.py`` (msr-fiddle/pipedream) solves ``A[i][j][m]``: the best
bottleneck time of states ``(i-1, j]`` on ``m+1`` GPUs of one level. Its quirks are kept on purpose
(``pipesim plan --cost-model pipedream``), because the point of this mode is to give the same
answer as the released tool:

- a stage of r replicas takes ``(compute + 4 (r-1)/r x weights / B) / r``: the all-reduce adds to
  compute, at twice the bytes of a ring all-reduce;
- the one-stage base case divides that all-reduce by the GPUs inside one machine of the level;
  the recurrence's last stage does not;
- a cut costs ``2 x activation / (B r')`` on both sides of the last stage, r' its replicas;
- exactly the level's GPUs are used; with a memory limit a stage is refused when
  ``(stash + weights) x ceil((GPUs after it) / r) > limit``;
- a hierarchy is solved innermost level first, for every start state, and each outer level
  takes the inner level's best time on one whole machine as a range's compute time.

A chain's states are its prefixes. A leading PipeDream ``Input`` layer (zero time and weights)
is zeroed and always belongs to stage 0, as the optimizer does with its input nodes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pipesim.errors import ConfigError
from pipesim.plan.costs import StageSpec
from pipesim.spec.profile import Profile
from pipesim.spec.topology import Topology

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Level:
    """One level of PipeDream's hierarchy: ``num_machines`` machines joined by ``bandwidth_bytes_per_s``.

    Level 1 (the first given) is innermost: GPUs inside a server; the next level's machines are
    whole servers.
    """

    num_machines: int
    bandwidth_bytes_per_s: float


@dataclass(frozen=True)
class CompatPlan:
    """The released optimizer's answer.

    Attributes:
        stages: per stage ``(start_layer, end_layer, replicas)``, replicas multiplied over levels.
        time_per_minibatch_s: the optimizer's objective ``A[0][S-1][M-1]``, per profiled minibatch.
        data_parallel_time_per_minibatch_s: its printed estimate for data parallelism on all GPUs.
    """

    stages: tuple[StageSpec, ...]
    time_per_minibatch_s: float
    data_parallel_time_per_minibatch_s: float


@dataclass(frozen=True, eq=False)
class _States:
    """Range sums over the chain's states: ``x[i, j]`` covers states ``(i-1, j]`` (row 0: from the start)."""

    compute_s: FloatArray  # (S+1, S), nan where j < i
    stash_bytes: FloatArray
    param_bytes: FloatArray
    output_bytes: FloatArray  # (S,): bytes crossing the cut after state j
    first_layer: int  # layer index of state 0's last layer (1 after an Input layer)


def levels_of(topology: Topology) -> tuple[Level, ...]:
    """PipeDream's ``-n``/``-b`` levels of a flat or hierarchical topology, innermost first.

    Raises:
        ConfigError: pairwise links, or a level whose groups do not divide the next one's.
    """
    if topology.links:
        raise ConfigError("topology.links", len(topology.links), "PipeDream's optimizer takes levels, not pairwise links")
    levels: list[Level] = []
    below = 1
    for level in topology.levels:
        if level.group_size % below or topology.num_devices % level.group_size:
            raise ConfigError("topology.levels", level.group_size,
                              f"group sizes must divide each other and the {topology.num_devices} devices")
        if level.group_size > below:
            levels.append(Level(level.group_size // below, level.bandwidth_bytes_per_s))
        below = level.group_size
    if topology.num_devices > below or not levels:
        levels.append(Level(topology.num_devices // below, topology.bandwidth_bytes_per_s))
    return tuple(levels)


def solve_work(num_layers: int, levels: Sequence[Level]) -> float:
    """Roughly how many table entries ``pipedream_optimizer`` evaluates: S^2 M^2 / 2 for the outermost
    level (solved from state 0), S^3 M^2 / 4 for each inner one (solved from every start state).

    About 3e8 a second here (ResNet-50's 177 layers on 2 servers of 8: 9e7, 0.3 s).
    """
    work = 0.0
    for index, level in enumerate(levels):
        rows = 1 if index == len(levels) - 1 else num_layers / 2
        work += rows * num_layers**2 * level.num_machines**2 / 2
    return work


def _states(profile: Profile) -> _States:
    layers = profile.layers
    first = 1 if len(layers) > 1 and _is_input(profile) else 0
    compute = np.array([layer.forward_s + layer.backward_s for layer in layers])
    stash = np.array([float(layer.stashed_bytes) for layer in layers])
    params = np.array([layer.param_bytes for layer in layers])
    compute[:first], stash[:first], params[:first] = 0.0, 0.0, 0.0

    def ranges(values: FloatArray) -> FloatArray:
        prefix = np.cumsum(values)[first:]  # through state j
        before = np.concatenate(([0.0], prefix))  # through state i-1 (nothing for row 0)
        table = prefix[None, :] - before[:, None]
        valid = np.arange(len(prefix))[None, :] >= np.arange(len(prefix) + 1)[:, None]
        return np.where(valid, table, math.nan)

    return _States(
        compute_s=ranges(compute), stash_bytes=ranges(stash), param_bytes=ranges(params),
        output_bytes=np.array([layer.activation_bytes for layer in layers])[first:],
        first_layer=first,
    )


def _is_input(profile: Profile) -> bool:
    layer = profile.layers[0]
    words = layer.name.split()
    is_named_input = len(words) >= 2 and words[1].startswith("Input")
    return is_named_input and layer.forward_s == 0 and layer.backward_s == 0 and layer.param_bytes == 0


@dataclass(frozen=True, eq=False)
class _Table:
    """``A[i][j][m]`` of one level: time (inf for None), the split ``(k, m - r')`` and the last stage's r'."""

    time_s: FloatArray  # (S+1, S, M), inf where no plan
    split_state: IntArray  # -1: the base case (one stage)
    split_machines: IntArray
    replicas: IntArray


def _solve_level(compute: FloatArray, states: _States, level: Level, inner: int, *, final: bool, straight: bool,
                 memory_bytes: float | None) -> _Table:
    """One level of ``compute_partitioning``: base cases for every range, then the recurrence.

    The final (outermost) level runs the recurrence from state 0 only; inner levels from every
    start state, since an outer stage may start anywhere.
    """
    num_rows, num_states = compute.shape
    n, bandwidth = level.num_machines, level.bandwidth_bytes_per_s
    act, par, out = states.stash_bytes, states.param_bytes, states.output_bytes
    time = np.full((n, num_rows, num_states), math.inf)  # [m, i, j]; inf: no plan (the optimizer's None)
    replicas = np.zeros((num_rows, num_states, n), dtype=np.int64)
    split_state = np.full((num_rows, num_states, n), -1, dtype=np.int64)
    split_machines = np.full((num_rows, num_states, n), -1, dtype=np.int64)
    for m in range(1 if straight else n):
        r = m + 1
        base = (compute + 4 * m * par / (bandwidth * r) / inner) / r
        if memory_bytes is not None:
            base = np.where(math.ceil((n - r) / r) * (act + par) > memory_bytes, math.inf, base)
        time[m], replicas[:, :, m] = np.where(np.isnan(base), math.inf, base), r
    for m in range(1, n):
        primes = np.arange(1, 2 if straight else m + 1)[:, None]  # r' as a column
        for j in range(1, num_states):
            live = np.arange(1 if final else min(j, num_rows))  # rows i with i < j
            k = np.arange(j)
            last = (compute[k + 1, j] + 4 * (primes - 1) * par[k + 1, j] / (bandwidth * primes)) / primes  # [r', k]
            if memory_bytes is not None:
                inflight = np.array([[math.ceil((n - (m + 1)) / p)] for p in primes[:, 0].tolist()])
                last = np.where((act[k + 1, j] + par[k + 1, j]) * inflight > memory_bytes, math.inf, last)
            last = np.maximum(last, 2.0 * out[k] / (bandwidth * primes))
            if j < num_states - 1:
                last = np.maximum(last, 2.0 * out[j] / (bandwidth * primes))
            candidate = np.maximum(time[m - primes[:, 0], : len(live), :j], last[:, None, :])  # [r', i, k]
            # The optimizer's order: split states ascending, then r' ascending; the first minimum stays.
            by_split, prime_index = candidate.min(axis=0), candidate.argmin(axis=0)
            split = by_split.argmin(axis=1)
            best = by_split[live, split]
            better = best < time[m, live, j]
            winners, split, prime_index = live[better], split[better], prime_index[live, split][better]
            time[m, winners, j] = best[better]
            split_state[winners, j, m] = split
            split_machines[winners, j, m] = m - primes[prime_index, 0]
            replicas[winners, j, m] = primes[prime_index, 0]
    return _Table(np.moveaxis(time, 0, -1), split_state, split_machines, replicas)


def _unroll(table: _Table, start: int, end: int, num_machines: int) -> list[tuple[int, int, int]]:
    """The stages ``(first_state, end_state, replicas)`` of states ``[start, end)`` (``analyze_partitioning``)."""
    stages: list[tuple[int, int, int]] = []
    j, m = end - 1, num_machines - 1
    while table.split_state[start, j, m] >= 0:
        k = int(table.split_state[start, j, m])
        stages.append((k + 1, j + 1, int(table.replicas[start, j, m])))
        j, m = k, int(table.split_machines[start, j, m])
    stages.append((start, j + 1, int(table.replicas[start, j, m])))
    return stages[::-1]


def pipedream_optimizer(profile: Profile, levels: Sequence[Level], *, straight: bool = False,
                        memory_bytes: float | None = None) -> CompatPlan:
    """The released optimizer's plan for ``profile`` on ``levels`` (innermost first).

    Args:
        levels: e.g. ``[Level(16, 1e9)]`` flat, ``[Level(4, 1e10), Level(4, 1.25e9)]`` for four
            servers of four GPUs.
        straight: one replica per stage (``--straight_pipeline``): exactly as many stages as GPUs.
        memory_bytes: ``--use_memory_constraint -s``; None leaves memory unchecked, as its default.

    Raises:
        ConfigError: no level given, or no plan exists (too few states for a straight pipeline, or
            nothing meets the memory limit).
    """
    if not levels:
        raise ConfigError("levels", [], "give at least one level")
    states = _states(profile)
    compute = states.compute_s
    tables: list[_Table] = []
    inner = 1
    for index, level in enumerate(levels):
        final = index == len(levels) - 1
        table = _solve_level(compute, states, level, inner, final=final, straight=straight, memory_bytes=memory_bytes)
        tables.append(table)
        compute = table.time_s[:, :, -1]
        inner = level.num_machines
    num_states = states.output_bytes.shape[0]
    objective = float(tables[-1].time_s[0, num_states - 1, -1])
    if math.isinf(objective):
        if memory_bytes is not None:
            raise ConfigError("memory", memory_bytes, "no plan meets it under PipeDream's rule: (stash + weights) x "
                              "ceil(GPUs after the stage / replicas) per GPU")
        raise ConfigError("devices", math.prod(level.num_machines for level in levels),
                          "a straight pipeline needs as many layers as GPUs")
    splits = [(0, num_states, 1)]
    for level, table in zip(reversed(levels), reversed(tables), strict=True):
        splits = [(first, end, replicas * outer) for start, stop, outer in splits
                  for first, end, replicas in _unroll(table, start, stop, level.num_machines)]
    offset = states.first_layer
    stages = tuple((0 if first == 0 else first + offset, end + offset, replicas) for first, end, replicas in splits)
    return CompatPlan(stages=stages, time_per_minibatch_s=objective,
                      data_parallel_time_per_minibatch_s=_data_parallel(states, levels))


def _data_parallel(states: _States, levels: Sequence[Level]) -> float:
    """The optimizer's printed data-parallel estimate: the base formula on the whole model, level by level."""
    total = float(states.compute_s[0, -1])
    params = float(states.param_bytes[0, -1])
    inner = 1
    for level in levels:
        n = level.num_machines
        total = (total + 4 * (n - 1) * params / (level.bandwidth_bytes_per_s * n) / inner) / n
        inner = n
    return total
