"""Hypothesis strategies for pipesim inputs, built by construction (no filtering).

Times and sizes are small multiples of powers of two (dyadic numbers), so sums, products by
powers of two and the closed forms are exact in floating point: properties can use ``==``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from pipesim.engine.des import run_des
from pipesim.engine.lowering import Program
from pipesim.engine.trace import Trace
from pipesim.schedule.ir import Schedule
from pipesim.schedule.registry import SCHEDULES, build_schedule
from pipesim.simulation import prepare
from pipesim.spec.plan import Plan
from pipesim.spec.profile import Profile
from pipesim.spec.topology import Topology
from pipesim.spec.validation import build

UNIT_S = 2.0 ** -10
# Schedules that place several stages on a rank (``build_schedule(..., num_ranks=R)``).
MULTI_STAGE = frozenset({"interleaved-1f1b", "looped-bfs", "interleaved-zb", "zbv", "dualpipev"})
MAX_STAGES, MAX_MICROBATCHES, MAX_MINIBATCHES = 6, 8, 3


def seconds(low: int = 1, high: int = 16) -> st.SearchStrategy[float]:
    """A duration of ``low..high`` units of 2**-10 s."""
    return st.integers(low, high).map(lambda units: units * UNIT_S)


@dataclass(frozen=True)
class ScheduleParams:
    """A registry key with counts and options; ``build()`` makes the schedule."""

    name: str
    num_stages: int
    num_microbatches: int
    num_minibatches: int
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def stages_per_rank(self) -> int:
        """Model stages on each rank (``options["num_ranks"]`` for the multi-stage schedules)."""
        return self.num_stages // int(self.options.get("num_ranks", self.num_stages))

    def build(self) -> Schedule:
        """The schedule these parameters name."""
        return build_schedule(self.name, self.num_stages, self.num_microbatches,
                              num_minibatches=self.num_minibatches, **self.options)


@st.composite
def schedule_params(
    draw: st.DrawFn,
    names: tuple[str, ...] = tuple(SCHEDULES),
    max_stages: int = MAX_STAGES,
    max_microbatches: int = MAX_MICROBATCHES,
    max_minibatches: int = MAX_MINIBATCHES,
) -> ScheduleParams:
    """Any registered schedule with p, m and K small, its rules met by construction: m >= p for
    2bw and dualpipev; for the multi-stage schedules R ranks of V stages (V = 2 for zbv and
    dualpipev, up to 3 for the interleaved ones), p = R * V <= ``max_stages``, and for the
    interleaved ones m a multiple of max(1, m // R)."""
    name = draw(st.sampled_from(names))
    options: dict[str, Any] = {}
    if name in MULTI_STAGE:
        per_rank = 2 if name in ("zbv", "dualpipev") else draw(st.integers(1, 3))
        num_ranks = draw(st.integers(1, max(1, max_stages // per_rank)))
        p = num_ranks * per_rank
        options["num_ranks"] = num_ranks
    else:
        p = draw(st.integers(1, max_stages))
    low = p if name in ("2bw", "dualpipev") else 1
    high = max(low, max_microbatches)
    if name.startswith("interleaved"):
        rounds = options["num_ranks"]
        m = draw(st.sampled_from([m for m in range(low, high + 1) if m % max(1, m // rounds) == 0]))
    else:
        m = draw(st.integers(low, high))
    k = draw(st.integers(1, max_minibatches))
    if name == "pipemare":
        options["update"] = draw(st.sampled_from(["minibatch", "microbatch"]))
    return ScheduleParams(name, p, m, k, options)


@st.composite
def uniform_profiles(draw: st.DrawFn, num_layers: int) -> Profile:
    """Identical layers: one forward and backward time, one activation and parameter size."""
    layer = {
        "forward_s": draw(seconds()), "backward_s": draw(seconds()),
        "activation_bytes": draw(st.integers(0, 64)) * 1024.0, "param_bytes": draw(st.integers(0, 64)) * 4096.0,
    }
    return _profile([dict(layer, name=f"layer{index}") for index in range(num_layers)], "uniform")


@st.composite
def ragged_profiles(draw: st.DrawFn, num_layers: int) -> Profile:
    """Layers that differ: times, activation, stash and parameter sizes drawn per layer."""
    layers = []
    for index in range(num_layers):
        layers.append({
            "name": f"layer{index}",
            "forward_s": draw(seconds(0, 16)), "backward_s": draw(seconds(0, 32)),
            "activation_bytes": draw(st.integers(0, 64)) * 1024.0,
            "stash_bytes": draw(st.none() | st.integers(0, 64).map(lambda units: units * 1024.0)),
            "param_bytes": draw(st.integers(0, 64)) * 4096.0,
        })
    return _profile(layers, "ragged")


def _profile(layers: list[dict[str, Any]], name: str) -> Profile:
    return build(Profile, {"name": name, "layers": layers, "device": "synthetic", "source": "tests/support/strategies.py"})


def profiles(num_layers: int) -> st.SearchStrategy[Profile]:
    """Uniform or ragged profiles of ``num_layers`` layers."""
    return uniform_profiles(num_layers) | ragged_profiles(num_layers)


def _bandwidth() -> st.SearchStrategy[float]:
    return st.integers(20, 30).map(lambda exponent: 2.0 ** exponent)


@st.composite
def topologies(draw: st.DrawFn, num_devices: int) -> Topology:
    """Free links, one uniform link class, two hierarchy levels, or pairwise links; device
    speeds of 0.5, 1 or 2."""
    kind = draw(st.sampled_from(["free", "uniform", "levels", "pairwise"]))
    speeds = draw(st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=num_devices, max_size=num_devices))
    data: dict[str, Any] = {"devices": [{"name": f"d{index}", "speed": speed} for index, speed in enumerate(speeds)]}
    if kind != "free":
        data["bandwidth_bytes_per_s"] = draw(_bandwidth())
        data["latency_s"] = draw(seconds(0, 4))
    if kind == "levels":
        data["levels"] = [{"group_size": draw(st.integers(1, num_devices)), "bandwidth_bytes_per_s": draw(_bandwidth()),
                           "latency_s": draw(seconds(0, 2))}]
    if kind == "pairwise" and num_devices > 1:
        pairs = [(a, a + 1) for a in range(num_devices - 1)]
        chosen = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=len(pairs)))
        data["links"] = [{"src": a, "dst": b, "bandwidth_bytes_per_s": draw(_bandwidth()),
                          "latency_s": draw(seconds(0, 4)), "bidirectional": draw(st.booleans())}
                         for a, b in chosen]
    return build(Topology, data)


@st.composite
def plans(draw: st.DrawFn, params: ScheduleParams, num_layers: int) -> Plan:
    """A plan for ``params`` over ``num_layers`` layers: contiguous partition, replicas,
    recomputation and optimizer state drawn."""
    p = params.num_stages
    cuts = sorted(draw(st.permutations(range(1, num_layers)))[: p - 1])
    bounds = [0, *cuts, num_layers]
    return build(Plan, {
        "schedule": params.name,
        "num_stages": p,
        "num_microbatches": params.num_microbatches,
        "num_minibatches": params.num_minibatches,
        "partition": [[bounds[i], bounds[i + 1]] for i in range(p)],
        "replicas": draw(st.lists(st.integers(1, 2), min_size=p, max_size=p)),
        "recompute": draw(st.booleans()),
        "optimizer_state_multiplier": draw(st.sampled_from([0.0, 1.0, 2.0])),
        "pipemare_update": params.options.get("update", "minibatch"),
        "stages_per_rank": params.stages_per_rank,
    })


@dataclass(frozen=True)
class Case:
    """A complete simulation input: profile, topology and plan."""

    profile: Profile
    topology: Topology
    plan: Plan

    def program(self) -> Program:
        """The plan's schedule lowered onto the profile and topology."""
        return prepare(self.profile, self.topology, self.plan)

    def run(self) -> tuple[Program, Trace]:
        """The program and the DES engine's trace of it."""
        program = self.program()
        return program, run_des(program)


@st.composite
def cases(draw: st.DrawFn, params: st.SearchStrategy[ScheduleParams] | None = None,
          uniform: bool = False) -> Case:
    """A case for any schedule (or ``params``) with up to three more layers than stages."""
    chosen = draw(params if params is not None else schedule_params())
    num_layers = chosen.num_stages + draw(st.integers(0, 3))
    profile = draw(uniform_profiles(num_layers) if uniform else profiles(num_layers))
    return Case(profile, draw(topologies(chosen.num_stages)), draw(plans(chosen, num_layers)))
