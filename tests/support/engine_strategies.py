"""Hypothesis strategies for engine tests: small random profiles, topologies and plans."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from pipesim import Profile, Topology
from pipesim.schedule.registry import build_schedule
from pipesim.spec.validation import build

# One stage per rank, the five of issue 2 and the zero-bubble ones; then several stages per rank.
SCHEDULE_NAMES = ("gpipe", "1f1b", "pipedream", "2bw", "pipemare", "zb-h1", "zb-h2", "zb-auto")
MULTI_STAGE_NAMES = ("interleaved-1f1b", "looped-bfs", "interleaved-zb", "zbv", "dualpipev")
ALL_SCHEDULE_NAMES = SCHEDULE_NAMES + MULTI_STAGE_NAMES
RECOMPUTE_MODES = ("none", "full", "selective")

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
def layers(draw: st.DrawFn, index: int, split: bool) -> dict[str, Any]:
    """One layer; with ``split`` its backward is given as I + W. It may keep part of its stash
    for W (``weight_stash_bytes``) and be marked for selective recomputation."""
    layer: dict[str, Any] = {
        "name": f"layer{index}",
        "forward_s": draw(seconds),
        "activation_bytes": draw(sizes),
        "param_bytes": draw(sizes),
        "stash_bytes": draw(st.none() | sizes),
        "selective_recompute": draw(st.none() | st.booleans()),
    }
    if split:
        layer["backward_input_s"], layer["backward_weight_s"] = draw(seconds), draw(seconds)
        layer["backward_s"] = layer["backward_input_s"] + layer["backward_weight_s"]
    else:
        layer["backward_s"] = draw(seconds)
    stashed = layer["activation_bytes"] if layer["stash_bytes"] is None else layer["stash_bytes"]
    layer["weight_stash_bytes"] = draw(st.none() | st.floats(0.0, 1.0).map(lambda share: share * stashed))
    return layer


@st.composite
def profiles(draw: st.DrawFn, num_stages: int) -> Profile:
    """A profile of ``num_stages`` to ``num_stages + 3`` layers with random times and sizes,
    with a measured split backward or without one."""
    num_layers = draw(st.integers(num_stages, num_stages + 3))
    split = draw(st.booleans())
    drawn = [draw(layers(index, split)) for index in range(num_layers)]
    return build(Profile, {"name": "random", "layers": drawn, "microbatch_size": draw(st.integers(1, 4))})


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
def shapes(draw: st.DrawFn, name: str, max_stages: int = 6, max_microbatches: int = 8) -> tuple[int, int, int]:
    """``(num_stages, stages_per_rank, num_microbatches)`` that schedule ``name`` accepts, by
    construction: V = 2 for the V schedules, m >= p for 2bw and dualpipev, and for the
    interleaved ones m a multiple of its rounds max(1, m // R), as torch requires."""
    if name in ("zbv", "dualpipev"):
        per_rank = 2
    elif name in MULTI_STAGE_NAMES:
        per_rank = draw(st.integers(1, 3))
    else:
        per_rank = 1
    num_ranks = draw(st.integers(1, max(1, max_stages // per_rank)))
    p = num_ranks * per_rank
    low = p if name in ("2bw", "dualpipev") else 1
    high = max(low, max_microbatches)
    if name.startswith("interleaved"):
        m = draw(st.sampled_from([m for m in range(low, high + 1) if m % max(1, m // num_ranks) == 0]))
    else:
        m = draw(st.integers(low, high))
    return p, per_rank, m


@st.composite
def cases(draw: st.DrawFn, max_stages: int = 6, max_microbatches: int = 8, max_minibatches: int = 3,
          names: tuple[str, ...] = ALL_SCHEDULE_NAMES) -> Case:
    """A random run of one of ``names`` (all twelve schedules by default): p <= 6 stages in all,
    m <= 8, K <= 3 by default; recomputation full, selective or none per stage; ranks placed on
    a random permutation of the devices; PipeMare on either device model, DualPipeV's pairs as
    overlapped chunks or op by op."""
    name = draw(st.sampled_from(names))
    p, per_rank, m = draw(shapes(name, max_stages, max_microbatches))
    num_ranks = p // per_rank
    kwargs: dict[str, Any] = {
        "schedule": name,
        "num_stages": p,
        "num_microbatches": m,
        "num_minibatches": draw(st.integers(1, max_minibatches)),
        "optimizer_state_multiplier": draw(st.sampled_from([0.0, 1.0, 2.0])),
        "replicas": tuple(draw(st.lists(st.integers(1, 3), min_size=p, max_size=p))),
    }
    if per_rank > 1:
        kwargs["stages_per_rank"] = per_rank
    if draw(st.booleans()):
        kwargs["recompute"] = draw(st.booleans())
    else:
        kwargs["recompute_stages"] = tuple(draw(st.lists(st.sampled_from(RECOMPUTE_MODES), min_size=p, max_size=p)))
    # The devices of the ranks, written per stage (stages of one rank share its device).
    stage_to_rank = build_schedule(name, p, m, num_ranks=num_ranks).stage_to_rank if per_rank > 1 else range(p)
    devices = draw(st.permutations(range(num_ranks)))
    kwargs["placement"] = tuple(devices[rank] for rank in stage_to_rank)
    if name == "pipemare":
        kwargs["pipemare_update"] = draw(st.sampled_from(["minibatch", "microbatch"]))
        kwargs["pipemare_model"] = draw(st.sampled_from(["1f1b", "paper"]))
    if name == "dualpipev":
        kwargs["fb_chunks"] = draw(st.sampled_from(["dualpipe", "torch"]))
        kwargs["fb_overlap"] = draw(st.sampled_from([0.0, 0.5, 1.0]))
    return Case(profile=draw(profiles(p)), topology=draw(topologies(num_ranks)), kwargs=kwargs)
