"""Hypothesis strategies for engine tests: small random profiles, topologies and plans."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from pipesim import Profile, Topology
from pipesim.spec.validation import build

SCHEDULE_NAMES = ("gpipe", "1f1b", "pipedream", "2bw", "pipemare")

# Times in seconds and sizes in bytes, zero included so that ties between ends occur.
seconds = st.one_of(st.just(0.0), st.floats(1e-6, 1e-2, allow_nan=False, allow_infinity=False))
sizes = st.one_of(st.just(0.0), st.floats(1.0, 1e8, allow_nan=False, allow_infinity=False))
bandwidths = st.one_of(st.just(math.inf), st.floats(1e6, 1e11, allow_nan=False, allow_infinity=False))
latencies = st.one_of(st.just(0.0), st.floats(1e-7, 1e-3, allow_nan=False, allow_infinity=False))


@dataclass(frozen=True)
class Case:
    """One generated simulation: inputs for ``pipesim.simulate``."""

    profile: Profile
    topology: Topology
    kwargs: dict[str, Any]


@st.composite
def profiles(draw: st.DrawFn, num_stages: int) -> Profile:
    """A profile of ``num_stages`` to ``num_stages + 3`` layers with random times and sizes."""
    num_layers = draw(st.integers(num_stages, num_stages + 3))
    layers = [
        {
            "name": f"layer{index}",
            "forward_s": draw(seconds),
            "backward_s": draw(seconds),
            "activation_bytes": draw(sizes),
            "param_bytes": draw(sizes),
            "stash_bytes": draw(st.none() | sizes),
        }
        for index in range(num_layers)
    ]
    return build(Profile, {"name": "random", "layers": layers, "microbatch_size": draw(st.integers(1, 4))})


@st.composite
def topologies(draw: st.DrawFn, num_devices: int) -> Topology:
    """``num_devices`` devices of random speed, a default link, and maybe a level or a pairwise link."""
    devices = [{"name": f"d{i}", "speed": draw(st.floats(0.5, 2.0))} for i in range(num_devices)]
    data: dict[str, Any] = {"devices": devices, "bandwidth_bytes_per_s": draw(bandwidths), "latency_s": draw(latencies)}
    if draw(st.booleans()):
        data["levels"] = [{"group_size": draw(st.integers(1, 3)), "bandwidth_bytes_per_s": draw(bandwidths),
                           "latency_s": draw(latencies)}]
    if num_devices >= 2 and draw(st.booleans()):
        data["links"] = [{"src": 0, "dst": 1, "bandwidth_bytes_per_s": draw(bandwidths), "latency_s": draw(latencies),
                          "bidirectional": draw(st.booleans())}]
    return build(Topology, data)


@st.composite
def cases(draw: st.DrawFn, max_stages: int = 6, max_microbatches: int = 8, max_minibatches: int = 3) -> Case:
    """A random run of one of the five schedules: p <= 6, m <= 8, K <= 3 by default."""
    name = draw(st.sampled_from(SCHEDULE_NAMES))
    p = draw(st.integers(1, max_stages))
    low = p if name == "2bw" else 1  # 2bw needs m >= p
    m = draw(st.integers(low, max(low, max_microbatches)))
    kwargs: dict[str, Any] = {
        "schedule": name,
        "num_stages": p,
        "num_microbatches": m,
        "num_minibatches": draw(st.integers(1, max_minibatches)),
        "recompute": draw(st.booleans()),
        "optimizer_state_multiplier": draw(st.sampled_from([0.0, 1.0, 2.0])),
        "replicas": tuple(draw(st.lists(st.integers(1, 3), min_size=p, max_size=p))),
        "placement": tuple(draw(st.permutations(range(p)))),
    }
    if name == "pipemare":
        kwargs["pipemare_update"] = draw(st.sampled_from(["minibatch", "microbatch"]))
    return Case(profile=draw(profiles(p)), topology=draw(topologies(p)), kwargs=kwargs)
