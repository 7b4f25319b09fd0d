"""PipeDream's graph.txt profiles: parse the DAG, linearize it, merge branch bytes into a Profile."""

from __future__ import annotations

import heapq
import math
import re
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from collections.abc import Sequence
from pathlib import PurePath

from pipesim.errors import ConfigError
from pipesim.spec.profile import Profile
from pipesim.spec.validation import build

DEVICE = "V100 (assumed; PipeDream profiles)"
SEPARATOR = " -- "
NAME_LIMIT = 64
_KEYS = ("forward_compute_time", "backward_compute_time", "activation_size", "parameter_size")
# A plain decimal number, as PipeDream writes them; float() alone would also take "nan", "inf", "1_0".
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_DIGITS = re.compile(r"(\d+)(?!.*\d)")
_PLAIN_LSTM = re.compile(r"LSTM\((\d+), (\d+)\)")
# Side of the square input image per model family: 224 (most) or 299 (Inception).
_IMAGE_SIDES = (224, 299)


@dataclass(frozen=True)
class _Node:
    node_id: str
    desc: str
    forward_ms: Decimal
    backward_ms: Decimal
    activation_parts: tuple[Fraction, ...]
    param_bytes: Fraction
    line_number: int

    @property
    def activation_bytes(self) -> Fraction:
        return sum(self.activation_parts, Fraction(0))

    @property
    def is_input(self) -> bool:
        return self.desc.startswith("Input")


def parse_graph_txt(
    text: str,
    *,
    source: str,
    microbatch_size: int | None = None,
    name: str | None = None,
) -> Profile:
    """Parse a PipeDream ``graph.txt`` into a layer-chain Profile.

    Nodes are linearized by Kahn's algorithm, ready nodes taken in order of the numeric part of
    their id, then the id string, so the original files come out in node-number order. A layer's
    ``activation_bytes`` is what crosses the cut right after it (PipeDream's antichain rule: the
    outputs of every node at or before it with an edge to a node after it); ``stash_bytes`` is the
    node's own output; ``inputs`` keeps the DAG's edges (the positions each node reads).

    Args:
        text: the file's content.
        source: where it came from; names the profile (parent folder of a ``graph.txt``) and
            every error.
        microbatch_size: samples per microbatch; default: inferred from the input node's size
            (images at 224 or 299 pixels) or from plain LSTM hidden states, else 1.
        name: profile name; default derived from ``source``.

    Returns:
        The profile, times in seconds and sizes in bytes.

    Raises:
        ConfigError: a malformed line (field ``line N.<key>``), a duplicate node, an edge naming
            an unknown node, or a cycle; always with ``source`` set.
    """
    nodes, edges = _parse_lines(text, source)
    order = _topological_order(nodes, edges, source)
    crossing = _cut_bytes(order, edges)
    inputs = _inputs(order, edges)
    layers = [
        {
            "name": _layer_name(node),
            # PipeDream's optimizer ignores data loading: an input node's "forward time" is the
            # loader's wait per minibatch, not compute, so it must not weigh on stage 0.
            "forward_s": 0.0 if node.is_input else _seconds(node.forward_ms),
            "backward_s": 0.0 if node.is_input else _seconds(node.backward_ms),
            "activation_bytes": float(cut),
            "stash_bytes": float(node.activation_bytes),
            "param_bytes": float(node.param_bytes),
            "inputs": reads,
        }
        for node, cut, reads in zip(order, crossing, inputs, strict=True)
    ]
    data = {
        "name": name if name is not None else _profile_name(source),
        "layers": layers,
        "microbatch_size": microbatch_size if microbatch_size is not None else _infer_microbatch(order),
        "dtype": "float32",
        "device": DEVICE,
        "source": source,
    }
    return build(Profile, data, source=source)


def _parse_lines(text: str, source: str) -> tuple[dict[str, _Node], list[tuple[str, str, int]]]:
    nodes: dict[str, _Node] = {}
    edges: list[tuple[str, str, int]] = []
    for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if line.startswith("\t"):
            edges.append(_parse_edge(line, line_number, source))
            continue
        node = _parse_node(line, line_number, source)
        if node.node_id in nodes:
            first = nodes[node.node_id].line_number
            rule = f"is defined twice (first on line {first})"
            raise ConfigError(f"line {line_number}.node_id", node.node_id, rule, source=source)
        nodes[node.node_id] = node
    if not nodes:
        raise ConfigError("nodes", 0, "graph.txt must define at least one node line", source=source)
    for src, dst, line_number in edges:
        for role, node_id in (("src", src), ("dst", dst)):
            if node_id not in nodes:
                raise ConfigError(
                    f"line {line_number}.{role}", node_id, "names no node defined in the file", source=source
                )
    return nodes, edges


def _parse_edge(line: str, line_number: int, source: str) -> tuple[str, str, int]:
    parts = line.strip().split(SEPARATOR)
    if len(parts) != 2 or not all(parts):
        rule = "an edge line must be '\\t<src_id> -- <dst_id>'"
        raise ConfigError(f"line {line_number}", line.strip(), rule, source=source)
    return parts[0], parts[1], line_number


def _parse_node(line: str, line_number: int, source: str) -> _Node:
    where = f"line {line_number}"
    parts = line.split(SEPARATOR)
    if len(parts) not in (3, 4):
        rule = f"a node line has 3 or 4 fields separated by {SEPARATOR!r}, got {len(parts)}"
        raise ConfigError(where, line, rule, source=source)
    node_id, desc, values = parts[0].strip(), parts[1].strip(), parts[2].strip()
    if not node_id or any(char.isspace() for char in node_id):
        raise ConfigError(f"{where}.node_id", parts[0], "must be one word", source=source)
    if len(parts) == 4 and not re.fullmatch(r"stage_id=\d+", parts[3].strip()):
        rule = "the 4th field must be 'stage_id=<int>'"
        raise ConfigError(f"{where}.stage_id", parts[3], rule, source=source)
    items: dict[str, str] = {}
    for item in values.split(", "):
        key, equals, value = item.partition("=")
        key = key.strip()
        if not equals or key not in _KEYS:
            rule = f"expected key=value with a key in {_KEYS}"
            raise ConfigError(f"{where}.values", item, rule, source=source)
        if key in items:
            raise ConfigError(f"{where}.{key}", value, "is given twice", source=source)
        items[key] = value.strip()
    missing = [key for key in _KEYS if key not in items]
    if missing:
        raise ConfigError(f"{where}.{missing[0]}", None, "is missing", source=source)

    def number(key: str, text: str | None = None) -> Decimal:
        raw = items[key] if text is None else text
        return _parse_number(raw, f"{where}.{key}", source)

    activation = items["activation_size"]
    if activation.startswith("[") and activation.endswith("]"):
        parts_text = activation[1:-1].split(";")
        activation_parts = tuple(Fraction(number("activation_size", part.strip())) for part in parts_text)
    else:
        activation_parts = (Fraction(number("activation_size")),)
    return _Node(
        node_id=node_id,
        desc=desc,
        forward_ms=number("forward_compute_time"),
        backward_ms=number("backward_compute_time"),
        activation_parts=activation_parts,
        param_bytes=Fraction(number("parameter_size")),
        line_number=line_number,
    )


def _parse_number(text: str, field: str, source: str) -> Decimal:
    if not _NUMBER.fullmatch(text):
        raise ConfigError(field, text, "must be a plain decimal number (no NaN, inf or units)", source=source)
    value = Decimal(text)
    if not math.isfinite(float(value)):
        raise ConfigError(field, text, "must be finite", source=source)
    if value < 0:
        raise ConfigError(field, text, "must be >= 0", source=source)
    return value


def _tie_key(node_id: str) -> tuple[int, str]:
    """Sort key among ready nodes: the id's last number (-1 if none), then the id itself."""
    match = _DIGITS.search(node_id)
    return (int(match.group(1)) if match else -1, node_id)


def _topological_order(
    nodes: dict[str, _Node], edges: list[tuple[str, str, int]], source: str
) -> list[_Node]:
    successors: dict[str, list[str]] = {node_id: [] for node_id in nodes}
    in_degree = dict.fromkeys(nodes, 0)
    for src, dst, _ in edges:
        successors[src].append(dst)
        in_degree[dst] += 1
    ready = [_tie_key(node_id) for node_id, degree in in_degree.items() if degree == 0]
    heapq.heapify(ready)
    order: list[_Node] = []
    while ready:
        _, node_id = heapq.heappop(ready)
        order.append(nodes[node_id])
        for dst in successors[node_id]:
            in_degree[dst] -= 1
            if in_degree[dst] == 0:
                heapq.heappush(ready, _tie_key(dst))
    if len(order) < len(nodes):
        raise _cycle_error(in_degree, edges, source)
    return order


def _cycle_error(in_degree: dict[str, int], edges: list[tuple[str, str, int]], source: str) -> ConfigError:
    """Name one cycle among the nodes Kahn's algorithm could not place, and the edge line closing it."""
    stuck = {node_id for node_id, degree in in_degree.items() if degree > 0}
    predecessor: dict[str, tuple[str, int]] = {}
    for src, dst, line_number in edges:
        if src in stuck and dst in stuck and dst not in predecessor:
            predecessor[dst] = (src, line_number)
    # Every stuck node has a stuck predecessor, so walking backwards must revisit a node.
    walk = [min(stuck, key=_tie_key)]
    seen = {walk[0]: 0}
    while True:
        previous = predecessor[walk[-1]][0]
        if previous in seen:
            cycle = walk[seen[previous] :][::-1]
            break
        seen[previous] = len(walk)
        walk.append(previous)
    # Each node in `cycle` feeds the next and the last feeds the first; start at the smallest id.
    start = cycle.index(min(cycle, key=_tie_key))
    cycle = cycle[start:] + cycle[:start]
    closing_line = predecessor[cycle[0]][1]
    shown = " -> ".join([*cycle, cycle[0]])
    rule = "edges form a cycle; graph.txt must be a DAG"
    return ConfigError(f"line {closing_line}", shown, rule, source=source)


def _inputs(order: list[_Node], edges: list[tuple[str, str, int]]) -> list[list[int]]:
    """Per position, the positions of the nodes it reads, ascending (the DAG kept beside the chain)."""
    position = {node.node_id: index for index, node in enumerate(order)}
    reads: list[set[int]] = [set() for _ in order]
    for src, dst, _ in edges:
        reads[position[dst]].add(position[src])
    return [sorted(sources) for sources in reads]


def _cut_bytes(order: list[_Node], edges: list[tuple[str, str, int]]) -> list[Fraction]:
    """Bytes crossing the cut after each position of ``order`` (see ``cut_bytes``)."""
    position = {node.node_id: index for index, node in enumerate(order)}
    reads: list[list[int]] = [[] for _ in order]
    for src, dst, _ in edges:
        reads[position[dst]].append(position[src])
    return cut_bytes([node.activation_bytes for node in order], reads)


def cut_bytes(output_bytes: Sequence[Fraction], reads: Sequence[Sequence[int]]) -> list[Fraction]:
    """Bytes crossing the cut after each position: outputs of earlier nodes still awaited later.

    ``reads[i]`` are the positions node i reads. A node's output is live from its own position up
    to (not including) its last consumer's, so a difference array over positions gives every cut
    in O(N + E). Sums are exact fractions, so a cut that nothing crosses is exactly 0.
    """
    last_use = list(range(len(output_bytes)))
    for dst, sources in enumerate(reads):
        for src in sources:
            last_use[src] = max(last_use[src], dst)
    delta = [Fraction(0)] * (len(output_bytes) + 1)
    for index, size in enumerate(output_bytes):
        if last_use[index] > index:
            delta[index] += size
            delta[last_use[index]] -= size
    crossing: list[Fraction] = []
    running = Fraction(0)
    for index in range(len(output_bytes)):
        running += delta[index]
        crossing.append(running)
    return crossing


def reorder_layers(profile: Profile, order: Sequence[int]) -> Profile:
    """A DAG profile's layers in another topological ``order`` (old indices, new order first).

    Inputs are renumbered and each layer's ``activation_bytes`` is the new cut's, with a node's
    output taken as its ``stash_bytes``, as ``parse_graph_txt`` writes them.

    Raises:
        ConfigError: ``order`` is no permutation of the layers, or puts a layer before one it reads.
    """
    if sorted(order) != list(range(profile.num_layers)):
        raise ConfigError("order", list(order), f"must list each of the {profile.num_layers} layers once")
    position = {old: new for new, old in enumerate(order)}
    reads = [sorted(position[source] for source in (profile.layers[old].inputs or ())) for old in order]
    if any(source >= new for new, sources in enumerate(reads) for source in sources):
        raise ConfigError("order", list(order), "must put every layer after the layers it reads")
    crossing = cut_bytes([Fraction(profile.layers[old].stashed_bytes) for old in order], reads)
    layers = [profile.layers[old].model_copy(update={"inputs": tuple(sources), "activation_bytes": float(cut)})
              for old, sources, cut in zip(order, reads, crossing, strict=True)]
    return profile.model_copy(update={"layers": tuple(layers)})


def _seconds(milliseconds: Decimal) -> float:
    # Scaling the decimal text keeps "2.211" ms as the float nearest 0.002211 s.
    return float(milliseconds.scaleb(-3))


def _layer_name(node: _Node) -> str:
    text = " ".join(f"{node.node_id} {node.desc}".split())
    return text if len(text) <= NAME_LIMIT else text[: NAME_LIMIT - 3].rstrip() + "..."


def _profile_name(source: str) -> str:
    path = PurePath(source)
    folder = path.parent.name
    if path.name == "graph.txt" and folder:
        return folder
    if path.stem.startswith("graph_") and folder:
        return f"{folder}_{path.stem[len('graph_') :]}"
    return path.stem or "model"


def _infer_microbatch(order: list[_Node]) -> int:
    """Samples per minibatch from the data: the README's rules, or 1 when they do not apply.

    Images: the ``Input`` node holds float32 3xSxS images, S in 224 or 299. GNMT: a plain
    ``LSTM(in, hidden)`` outputs ``[output; h_n; c_n]`` with h_n of batch x hidden floats.
    """
    for node in order:
        if node.desc == "Input" and node.activation_bytes > 0:
            found = {
                int(node.activation_bytes / (3 * side * side * 4))
                for side in _IMAGE_SIDES
                if (node.activation_bytes / (3 * side * side * 4)).denominator == 1
            }
            if len(found) == 1:
                return found.pop()
    batches: set[Fraction] = set()
    for node in order:
        match = _PLAIN_LSTM.fullmatch(node.desc)
        if match and len(node.activation_parts) == 3:
            batches.add(node.activation_parts[1] / (4 * int(match.group(2))))
    if len(batches) == 1:
        batch = batches.pop()
        if batch.denominator == 1 and batch >= 1:
            return int(batch)
    return 1
