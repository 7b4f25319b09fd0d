"""zb-auto: the zero-bubble paper's heuristic against the reference code's own figures, and never
slower than the handcrafted ZB-H1/ZB-H2 under the same memory limit.

The reference figures come from sail-sg/zero-bubble-pipeline-parallelism, the heuristic
``Graph.manual_order`` of megatron/core/pipeline_parallel/zerobubble/scheduler/zb.py at commit
39f2c186 (its newest), run outside this project on the examples of the ``__main__`` block of
megatron/core/pipeline_parallel/auto_schedule.py at commit 4769e08d ("merge all code into one
commit"), once per setting of its three flags (allow_bubble_before_first_b, prioritize_b,
no_bubble_greedy). Per setting, the two figures are its ``best_time`` (the longest stage's span,
first F start to last W end) and the latest end of any op (``max(t)``).
"""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from cli_runner import pipesim
from hypothesis import strategies as st

from pipesim import Topology, simulate
from pipesim.errors import ConfigError
from pipesim.schedule.ir import OpKind
from pipesim.schedule.registry import build_schedule
from pipesim.schedule.validate import validate
from pipesim.schedule.zb_auto import F, Knobs, ZeroBubbleCosts, greedy
from pipesim.spec.profile import Profile
from pipesim.spec.validation import build


def equal_stages(p: int, f: float, b: float, w: float, comm: float) -> ZeroBubbleCosts:
    """The reference's ``simple_schedule``: equal stages, mem_f = 2, mem_b = mem_w = -1."""
    return ZeroBubbleCosts((f,) * p, (b,) * p, (w,) * p, (comm,) * (p - 1), (comm,) * (p - 1), (2.0,) * p, (-1.0,) * p)


# The reference's 8-stage GPT runs (times in its timer's units, memory in its units).
MEASURED = ZeroBubbleCosts(
    forward_s=(30715, 29233, 29106, 29078, 28850, 28919, 28924, 41678),
    backward_input_s=(31308, 29344, 29357, 29455, 29217, 29384, 29354, 38731),
    backward_weight_s=(18746, 18789, 19062, 19367, 19455, 19967, 20096, 32833),
    forward_comm_s=(473,) * 7, backward_comm_s=(473,) * 7,
    forward_bytes=(943,) + (1240,) * 6 + (1071,), input_bytes=(-533,) + (-688,) * 6 + (-588,),
)
UNIFORM = ZeroBubbleCosts((29850,) * 8, (29767,) * 8, (18868,) * 8, (466,) * 7, (466,) * 7, (3720,) * 8, (-2048,) * 8)

# name: (costs, microbatches, memory limit in the reference's units, {flags: (best_time, max(t))}).
# Flags in the order allow_bubble_before_first_b, prioritize_b, no_bubble_greedy (1 = True).
REFERENCE: dict[str, tuple[ZeroBubbleCosts, int, float, dict[str, tuple[int, int]]]] = {
    "p4 m12 mem 10": (equal_stages(4, 5, 6, 4, 0), 12, 10, {
        "111": (194, 195), "110": (193, 198), "101": (198, 198), "100": (195, 196),
        "011": (194, 195), "010": (193, 198), "001": (198, 198), "000": (195, 196)}),
    "p4 m12 mem 14": (equal_stages(4, 5, 6, 4, 0), 12, 14, {
        "111": (183, 195), "110": (183, 195), "101": (183, 195), "100": (183, 195),
        "011": (188, 195), "010": (187, 198), "001": (188, 195), "000": (188, 195)}),
    "p4 m12 comm 200": (equal_stages(4, 5478, 5806, 3534, 200), 12, 32, {
        "111": (180354, 194850), "110": (180000, 194850), "101": (180354, 194850), "100": (180000, 194850),
        "011": (178898, 194850), "010": (178898, 194850), "001": (178898, 194850), "000": (178898, 194850)}),
    "p32 m16": (equal_stages(32, 1, 1, 1, 0), 16, 64, {flags: (95, 95) for flags in
                                                        ("111", "110", "101", "100", "011", "010", "001", "000")}),
    "gpt p8 m32 measured": (MEASURED, 32, 1240 * 16, {flags: (3623744, 3831880) for flags in
                                                     ("111", "110", "101", "100", "011", "010", "001", "000")}),
    "gpt p8 m32 uniform": (UNIFORM, 32, 3720 * 16, {
        "111": (2517463, 2723732), "110": (2517463, 2723732), "101": (2517463, 2723732), "100": (2517463, 2723732),
        "011": (2777378, 2777378), "010": (2603617, 2732120), "001": (2693167, 2723732), "000": (2639359, 2723732)}),
}


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_every_flag_setting_reproduces_the_reference_heuristic(name: str) -> None:
    costs, m, limit, expected = REFERENCE[name]
    costs = costs.checked(len(costs.forward_s))
    got = {}
    for flags in expected:
        placed = greedy(costs, m, limit, Knobs(*(bit == "1" for bit in flags)))
        assert placed is not None
        got[flags] = (placed.span_s(), placed.makespan_s())
    assert got == {flags: (float(span), float(end)) for flags, (span, end) in expected.items()}


def per_stage_profile(costs: ZeroBubbleCosts) -> Profile:
    """One layer per stage with the stage's F, I and W, its stash (F's memory) and what W keeps."""
    layers = [{"name": f"stage{s}", "forward_s": float(costs.forward_s[s]),
               "backward_s": float(costs.backward_input_s[s] + costs.backward_weight_s[s]),
               "backward_input_s": float(costs.backward_input_s[s]),
               "backward_weight_s": float(costs.backward_weight_s[s]),
               "activation_bytes": float(costs.forward_bytes[s]),
               "weight_stash_bytes": float(costs.forward_bytes[s] + costs.input_bytes[s]), "param_bytes": 1.0}
              for s in range(len(costs.forward_s))]
    return build(Profile, {"name": "reference", "layers": layers})


@pytest.mark.parametrize(("costs", "limit", "best_span", "best_end"),
                         [(MEASURED, 16, 3623744, 3831880), (UNIFORM, 16, 2517463, 2723732)])
def test_the_engines_time_the_reference_runs_as_the_heuristic_does(costs: ZeroBubbleCosts, limit: float,
                                                                   best_span: int, best_end: int) -> None:
    # The profile's stages and a link of latency 473 (466) carry the reference's figures; a lone
    # minibatch takes the shortest makespan, minibatches back to back the shortest stage span.
    p, profile = 8, per_stage_profile(costs)
    topology = Topology.uniform(num_devices=p, latency=float(costs.forward_comm_s[0]))
    for engine in ("des", "analytic"):
        for k, expected in ((1, best_end), (3, best_span)):
            result = simulate(profile, topology, schedule="zb-auto", num_stages=p, num_microbatches=32,
                              num_minibatches=k, zb_memory_limit=limit, engine=engine)
            assert result.metrics.iteration_time_s == expected, (engine, k)


def case_profile(p: int, times: list[tuple[float, float, float]], stash: list[float], update_s: float = 0.0) -> Profile:
    layers = [{"name": f"layer{s}", "forward_s": f, "backward_s": i + w, "backward_input_s": i,
               "backward_weight_s": w, "activation_bytes": a, "param_bytes": 1.0, "update_s": update_s * (s + 1)}
              for s, ((f, i, w), a) in enumerate(zip(times, stash, strict=True))]
    return build(Profile, {"name": "case", "layers": layers})


# Dyadic times (multiples of 2**-13 s, about 0.12 ms) keep every sum exact.
op_times = st.tuples(*(st.integers(1, 24).map(lambda n: n * 2.0**-13) for _ in range(3)))


@settings(max_examples=60)
@given(p=st.integers(1, 5), m=st.integers(1, 10), k=st.sampled_from([1, 2, 3]), data=st.data())
def test_never_slower_than_zb_h1_and_zb_h2_under_the_same_limit(p: int, m: int, k: int, data: st.DataObject) -> None:
    times = data.draw(st.lists(op_times, min_size=p, max_size=p))
    stash = data.draw(st.lists(st.sampled_from([1e6, 2e6, 3e6]), min_size=p, max_size=p))
    # Links free, faster than any op, or slow enough that their sends queue.
    latency = data.draw(st.sampled_from([0.0, min(min(f, i) for f, i, _ in times) / 2, 3 * 24 * 2.0**-13]))
    update_s = data.draw(st.sampled_from([0.0, 2.0**-12]))
    profile, topology = case_profile(p, times, stash, update_s), Topology.uniform(num_devices=p, latency=latency)

    def iteration(name: str, **options: Any) -> float:
        return simulate(profile, topology, schedule=name, num_stages=p, num_microbatches=m, num_minibatches=k,
                        engine="analytic", **options).metrics.iteration_time_s

    # ZB-H1 holds p microbatches on every stage (the default limit, ZB-1p), ZB-H2 2p - 1.
    assert iteration("zb-auto") <= iteration("zb-h1")
    assert iteration("zb-auto", zb_memory_limit=2 * p) <= iteration("zb-h2")


def test_it_stays_within_its_memory_limit() -> None:
    p, m = 4, 12
    profile = case_profile(p, [(1e-3, 1.2e-3, 0.5e-3)] * p, [1e6] * p)
    for limit in (2, 3, 5, 8):
        result = simulate(profile, schedule="zb-auto", num_stages=p, num_microbatches=m, zb_memory_limit=limit)
        assert max(stage.max_inflight_microbatches for stage in result.metrics.stages) <= limit


def test_equal_stages_give_zb_h1_under_the_zb_1p_limit() -> None:
    # With F = I = W and free links, ZB-H1 meets the heuristic's best: the table is ZB-H1's makespan.
    for p, m in ((2, 4), (4, 8)):
        auto = build_schedule("zb-auto", p, m)
        validate(auto)
        h1 = simulate(case_profile(p, [(1e-3, 1e-3, 1e-3)] * p, [1e6] * p), schedule="zb-h1", num_stages=p,
                      num_microbatches=m)
        ran = simulate(case_profile(p, [(1e-3, 1e-3, 1e-3)] * p, [1e6] * p), schedule="zb-auto", num_stages=p,
                       num_microbatches=m)
        assert math.isclose(ran.metrics.iteration_time_s, h1.metrics.iteration_time_s, rel_tol=1e-12)
        assert math.isclose(h1.metrics.iteration_time_s, (3 * m + p - 1) * 1e-3, rel_tol=1e-12)


def test_bad_limits_and_costs_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"zb_memory_limit=0.5: is too small"):
        build_schedule("zb-auto", 4, 8, memory_limit=0.5)
    with pytest.raises(ConfigError, match=r"zb_memory_limit=-1: must be a number of microbatches > 0"):
        build_schedule("zb-auto", 4, 8, memory_limit=-1)
    with pytest.raises(ConfigError, match=r"zb_auto.forward_s=\[1.0, 1.0\]: must have 3 entries for 3 stages"):
        build_schedule("zb-auto", 3, 4, costs=ZeroBubbleCosts((1.0, 1.0), (1.0,) * 3, (1.0,) * 3))
    with pytest.raises(ConfigError, match=r"stages_per_rank=2: zb-auto runs one stage per rank"):
        build_schedule("zb-auto", 4, 4, num_ranks=2)



def test_a_stage_never_runs_ahead_of_the_stage_before_it_in_the_warm_up() -> None:
    # Stage 0 three times slower: warming up to fill the wait for the first gradient, stage 1
    # would run all three F while stage 0 runs two. The reference does so and times stage 1's
    # 1F2 as if 0F2 had ended at 0 (its best_time of 15 is for an order in which stage 0 never
    # runs 0F2); here stage 1 waits, and every setting gives an order the engines can run.
    costs = ZeroBubbleCosts((3.0, 1.0, 1.0), (1.0,) * 3, (1.0,) * 3).checked(3)
    for flags in itertools.product((True, False), repeat=3):
        placed = greedy(costs, 3, 3.0, Knobs(*flags))
        assert placed is not None
        for stage in range(1, 3):
            for op in placed.ops(stage):
                if op.kind is OpKind.F:
                    key, upstream = (stage, F, op.microbatch), (stage - 1, F, op.microbatch)
                    assert upstream in placed.end_s
                    assert placed.end_s[key] >= placed.end_s[upstream] + costs.forward_s[stage]


def test_the_cli_compares_it_and_refuses_a_bad_limit() -> None:
    uniform = ("layers=8,forward_ms=1,backward_ms=1.5,backward_input_ms=1.2,backward_weight_ms=0.3,"
               "activation_bytes=1000000")
    common = ("simulate", "--uniform", uniform, "--stages", "4", "--microbatches", "8")
    done = pipesim(*common, "--schedule", "zb-h1,zb-auto", "--json")
    assert done.returncode == 0, done.stderr
    runs = {run["schedule"]: run for run in json.loads(done.stdout)["runs"]}
    # W much shorter than F and I: the heuristic's order beats ZB-H1's within ZB-H1's memory.
    assert runs["zb-auto"]["iteration_time_s"] < runs["zb-h1"]["iteration_time_s"]
    assert runs["zb-auto"]["peak_memory_bytes"] <= runs["zb-h1"]["peak_memory_bytes"]
    refused = pipesim(*common, "--schedule", "zb-auto", "--zb-memory-limit", "0.5")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith("pipesim: error: zb_memory_limit=0.5: is too small")

