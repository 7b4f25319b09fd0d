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
from pipesim.plan.antichain import BoolArray, DagStates, antichain_states
from pipesim.plan.costs import StageSpec
from pipesim.spec.graphtxt import reorder_layers
from pipesim.spec.profile import Layer, Profile
from pipesim.spec.topology import Topology

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
# Beyond this many antichain states per layer the DAG is too wide to search in time (NASNet's cells);
# the chain's prefixes are used instead. ResNet-50 has 240 states for 177 layers.
MAX_STATES_PER_LAYER = 2


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
        stages: per stage ``(start_layer, end_layer, replicas)`` of ``profile``, replicas multiplied
            over levels.
        time_per_minibatch_s: the optimizer's objective ``A[0][S-1][M-1]``, per profiled minibatch.
        data_parallel_time_per_minibatch_s: its printed estimate for data parallelism on all GPUs.
        profile: the profile planned, its layers in an order where every stage is contiguous: the
            given one, or, where a stage cuts a DAG at an antichain that is no prefix of the given
            order, the same layers reordered (``pipesim.spec.graphtxt.reorder_layers``).
    """

    stages: tuple[StageSpec, ...]
    time_per_minibatch_s: float
    data_parallel_time_per_minibatch_s: float
    profile: Profile


@dataclass(frozen=True, eq=False)
class _States:
    """Range sums over the optimizer's states: ``x[i, j]`` covers states ``(i-1, j]`` (row 0: from the start).

    A state is a down-closed set of layers (``members``); a chain's are its prefixes.
    """

    compute_s: FloatArray  # (S+1, S), nan where j < i
    stash_bytes: FloatArray
    param_bytes: FloatArray
    output_bytes: FloatArray  # (S,): bytes crossing the cut after state j
    members: BoolArray  # (S, L): [state, layer]
    ancestors: BoolArray  # (S, S): [j, k] when a stage (k, j] is allowed
    is_dag: bool


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


def solve_work(profile: Profile, levels: Sequence[Level]) -> float:
    """Roughly how many table entries ``pipedream_optimizer`` evaluates on S states: S^2 M^2 / 2 for
    the outermost level (solved from state 0), S^3 M^2 / 4 for each inner one (every start state).

    About 3e8 a second here (ResNet-50's 240 antichain states on 2 servers of 8: 2.2e8, 0.7 s).
    """
    zeroed = _zeroed_inputs(profile)
    dag = _dag_states(profile, zeroed) if profile.is_dag else None
    num_states = profile.num_layers - len(zeroed) if dag is None else dag.num_states
    work = 0.0
    for index, level in enumerate(levels):
        rows = 1 if index == len(levels) - 1 else num_states / 2
        work += rows * num_states**2 * level.num_machines**2 / 2
    return work


def _states(profile: Profile) -> _States:
    """The chain's prefixes, or the DAG's antichain states (``pipesim.plan.antichain``) where the
    profile names its layers' inputs and they number at most ``MAX_STATES_PER_LAYER`` per layer."""
    layers = profile.layers
    inputs = _zeroed_inputs(profile)
    compute = np.array([layer.forward_s + layer.backward_s for layer in layers])
    stash = np.array([float(layer.stashed_bytes) for layer in layers])
    params = np.array([layer.param_bytes for layer in layers])
    compute[inputs], stash[inputs], params[inputs] = 0.0, 0.0, 0.0
    dag = _dag_states(profile, inputs) if profile.is_dag else None
    if dag is None:
        first = len(inputs)
        members = np.tri(len(layers), dtype=bool)[first:]
        members[:, :first] = True
        ancestors = np.tri(len(members), k=-1, dtype=bool)
        output = np.array([layer.activation_bytes for layer in layers])[first:]
    else:
        members, ancestors, output = dag.members, dag.ancestors, dag.output_bytes
        if not members[-1].all():  # the largest state holds every layer the first source's graph reaches
            apart = int(np.flatnonzero(~members[-1])[0])
            raise ConfigError(f"layers[{apart}].inputs", layers[apart].inputs,
                              "the layers' inputs must join every layer into one graph (PipeDream's optimizer "
                              f"cuts a connected DAG); layer {apart} ({layers[apart].name}) is apart")

    def ranges(values: FloatArray) -> FloatArray:
        through = members.astype(np.float64) @ values  # through state j
        before = np.concatenate(([0.0], through))  # through state i-1 (nothing for row 0)
        table = through[None, :] - before[:, None]
        valid = np.arange(len(through))[None, :] >= np.arange(len(through) + 1)[:, None]
        return np.where(valid, table, math.nan)

    return _States(compute_s=ranges(compute), stash_bytes=ranges(stash), param_bytes=ranges(params),
                   output_bytes=output, members=members, ancestors=ancestors, is_dag=dag is not None)


def _zeroed_inputs(profile: Profile) -> list[int]:
    """The leading input layers the optimizer zeroes and ties to stage 0: layer 0 of a chain; every
    named input source of a DAG."""
    if not profile.is_dag:
        return [0] if len(profile.layers) > 1 and _is_input(profile.layers[0]) else []
    return [index for index, layer in enumerate(profile.layers) if not layer.inputs and _is_input(layer)]


def _dag_states(profile: Profile, zeroed: list[int]) -> DagStates | None:
    """The antichain states of a DAG profile without its input layers, members widened to every
    layer (input layers belong to every state); None past the state budget."""
    kept = [index for index in range(profile.num_layers) if index not in set(zeroed)]
    position = {layer: rank for rank, layer in enumerate(kept)}
    reads = [[position[source] for source in (profile.layers[layer].inputs or ()) if source in position]
             for layer in kept]
    sizes = [float(profile.layers[layer].stashed_bytes) for layer in kept]
    dag = antichain_states(reads, sizes, max_states=MAX_STATES_PER_LAYER * len(kept))
    if dag is None:
        return None
    members = np.ones((dag.num_states, profile.num_layers), dtype=bool)
    members[:, kept] = dag.members
    return DagStates(members=members, ancestors=dag.ancestors, output_bytes=dag.output_bytes)


def _is_input(layer: Layer) -> bool:
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
            k = np.flatnonzero(states.ancestors[j])  # split states: the state DAG's ancestors of j
            last = (compute[k + 1, j] + 4 * (primes - 1) * par[k + 1, j] / (bandwidth * primes)) / primes  # [r', k]
            if memory_bytes is not None:
                inflight = np.array([[math.ceil((n - (m + 1)) / p)] for p in primes[:, 0].tolist()])
                last = np.where((act[k + 1, j] + par[k + 1, j]) * inflight > memory_bytes, math.inf, last)
            last = np.maximum(last, 2.0 * out[k] / (bandwidth * primes))
            if j < num_states - 1:
                last = np.maximum(last, 2.0 * out[j] / (bandwidth * primes))
            # A chain's splits are all earlier states: a slice, much cheaper than a gather.
            rest = m - primes[:, 0]
            earlier = time[rest, : len(live), :j] if len(k) == j else time[np.ix_(rest, live, k)]
            candidate = np.maximum(earlier, last[:, None, :])  # [r', i, k]
            if not final and states.is_dag:  # row i > 0 skips splits below state i-1, as the optimizer does
                candidate[:, 1:][:, states.ancestors[live[1:] - 1][:, k]] = math.inf
            # The optimizer's order: split states ascending, then r' ascending; the first minimum stays.
            by_split, prime_index = candidate.min(axis=0), candidate.argmin(axis=0)
            split = by_split.argmin(axis=1)
            best = by_split[live, split]
            better = best < time[m, live, j]
            winners, split, prime_index = live[better], split[better], prime_index[live, split][better]
            time[m, winners, j] = best[better]
            split_state[winners, j, m] = k[split]
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
    layers = [np.flatnonzero(states.members[end - 1] & ~(states.members[first - 1] if first else False))
              for first, end, _ in splits]
    order = np.concatenate(layers)
    if (order != np.arange(profile.num_layers)).any():
        profile = reorder_layers(profile, order.tolist())
    bounds = np.cumsum([0] + [len(stage) for stage in layers])
    stages = tuple((int(start), int(end), replicas)
                   for start, end, (_, _, replicas) in zip(bounds[:-1], bounds[1:], splits, strict=True))
    return CompatPlan(stages=stages, time_per_minibatch_s=objective,
                      data_parallel_time_per_minibatch_s=_data_parallel(states, levels), profile=profile)


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
