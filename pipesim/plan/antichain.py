"""The states PipeDream's optimizer cuts a layer DAG at: down-sets grown one node's ancestry at a time.

``optimizer_graph_hierarchical.py`` (msr-fiddle/pipedream) does not cut a linearized chain: it
builds an "antichain DAG" whose states are down-closed sets of layers, starting from the first
source's own set, and where a state D leads to ``D | down(n)`` for every layer n outside D that
reads a layer inside D (``down(n)``: n and everything it depends on). A stage is the difference
of two states, one an ancestor of the other in that DAG, so stages are convex and no edge runs
backwards. A chain's states are its prefixes; a branchy model (a residual block) has more, e.g.
"everything up to both ends of the two branches" and "one branch done, the other half-way".

What crosses a cut is the optimizer's own sum: the outputs of the state's maximal layers plus
those of its layers that feed a layer not below the same maximal layer (which, for a layer read
by two maximal layers, counts an output both readers already hold: kept, as in the released code).

The state count grows with the DAG's width (NASNet's cells give millions), so enumeration stops
at a budget and the caller falls back to the chain's prefixes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, eq=False)
class DagStates:
    """The antichain DAG's states in a topological order (by size, then discovery).

    Attributes:
        members: ``[state, layer]`` True when the layer belongs to the state's down-set.
        ancestors: ``[j, k]`` True when state k is an ancestor of state j in the antichain DAG.
        output_bytes: per state, what a cut after it sends (see the module).
    """

    members: BoolArray
    ancestors: BoolArray
    output_bytes: FloatArray

    @property
    def num_states(self) -> int:
        """Number of states."""
        return int(self.members.shape[0])


def _bits(mask: int) -> list[int]:
    """The set bits of ``mask``, ascending."""
    found = []
    while mask:
        low = mask & -mask
        found.append(low.bit_length() - 1)
        mask ^= low
    return found


def antichain_states(inputs: Sequence[Sequence[int]], activation_bytes: Sequence[float], *,
                     max_states: int) -> DagStates | None:
    """The optimizer's states of the DAG ``inputs`` (per layer, the earlier layers it reads).

    Layers are given in a topological order; the first source starts the enumeration. Returns
    None when there are more than ``max_states`` states.
    """
    num_layers = len(inputs)
    readers = [0] * num_layers
    below = [0] * num_layers  # down(n) as a bit mask
    for layer, sources in enumerate(inputs):
        below[layer] = 1 << layer
        for source in sources:
            readers[source] |= 1 << layer
            below[layer] |= below[source]
    first = next(layer for layer, sources in enumerate(inputs) if not sources)
    index = {below[first]: 0}
    found = [below[first]]
    edges: list[tuple[int, int]] = []
    cursor = 0
    while cursor < len(found):
        state = found[cursor]
        read_by_state = 0
        for layer in _bits(state):
            read_by_state |= readers[layer]
        for layer in _bits(read_by_state & ~state):
            grown = state | below[layer]
            if grown not in index:
                if len(found) == max_states:
                    return None
                index[grown] = len(found)
                found.append(grown)
            edges.append((cursor, index[grown]))
        cursor += 1
    order = sorted(range(len(found)), key=lambda state: (found[state].bit_count(), state))
    rank = {state: position for position, state in enumerate(order)}
    members = np.array([[bool(found[state] >> layer & 1) for layer in range(num_layers)] for state in order],
                       dtype=bool).reshape(len(order), num_layers)
    parents: list[list[int]] = [[] for _ in order]
    for source, target in edges:
        parents[rank[target]].append(rank[source])
    ancestors = np.zeros((len(order), len(order)), dtype=bool)
    for state in range(len(order)):
        for parent in parents[state]:
            ancestors[state] |= ancestors[parent]
            ancestors[state, parent] = True
    output = np.array([_output_bytes(found[state], below, readers, activation_bytes) for state in order])
    return DagStates(members=members, ancestors=ancestors, output_bytes=output)


def _output_bytes(state: int, below: Sequence[int], readers: Sequence[int], activation_bytes: Sequence[float]) -> float:
    """The optimizer's bytes out of ``state``: its maximal layers, and each layer below a maximal
    layer m that feeds a layer neither below m nor m itself."""
    layers = _bits(state)
    maximal = [layer for layer in layers if not readers[layer] & state]
    counted = set(maximal)
    for top in maximal:
        strictly_below = below[top] & ~(1 << top)
        for layer in _bits(strictly_below):
            if readers[layer] & ~below[top]:
                counted.add(layer)
    return float(sum(activation_bytes[layer] for layer in sorted(counted)))
