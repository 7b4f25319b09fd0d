"""`--cost-model pipedream` against the released optimizer's own outputs (tests/data, 45 cases)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from pipesim.errors import ConfigError
from pipesim.plan.compat import Level, levels_of, pipedream_optimizer
from pipesim.spec.files import load_profile
from pipesim.spec.topology import Topology

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "tests" / "data" / "pipedream_optimizer.json"  # PipeDream's optimizer, run (tests/data/README.md)
CASES: list[dict[str, Any]] = json.loads(REFERENCE.read_text())["cases"]
MORE = json.loads((ROOT / "tests" / "golden" / "pipedream_optimizer_more.json").read_text())["cases"]
def _run(case: dict[str, Any]) -> tuple[float, str, float]:
    inputs = case["inputs"]
    levels = [Level(n, b) for n, b in zip(inputs["num_machines_per_level"],
                                          inputs["network_bandwidths_bytes_per_s_per_level"], strict=True)]
    found = pipedream_optimizer(
        load_profile(ROOT / "traces" / f"{case['model']}.json"), levels, straight=inputs["straight_pipeline"],
        memory_bytes=inputs["memory_size_bytes"] if inputs["memory_constraint_enforced"] else None,
    )
    config = "-".join(str(replicas) for _, _, replicas in found.stages)
    return found.time_per_minibatch_s, config, found.data_parallel_time_per_minibatch_s


@pytest.mark.parametrize("case", [pytest.param(case, id=case["case_id"]) for case in CASES])
def test_the_released_optimizers_objective_is_reproduced(case: dict[str, Any]) -> None:
    outputs = case["outputs"]
    time_s, config, data_parallel_s = _run(case)
    assert time_s == pytest.approx(outputs["pipeline_time_per_minibatch_s"], rel=1e-9)
    single = outputs["single_gpu_time_per_minibatch_s"]
    assert single / data_parallel_s == pytest.approx(outputs["optimizer_dp_estimate_speedup_vs_1gpu"], rel=1e-9)
    reproducible = case["reproducibility"]
    if isinstance(reproducible, dict) and reproducible["distinct_partitions"] == 1:
        assert config == outputs["config_string"]


def _more_id(case: dict[str, Any]) -> str:
    return f"{case['model']}__{case['setting']}"


@pytest.mark.parametrize("case", [pytest.param(case, id=_more_id(case)) for case in MORE])
def test_no_slower_than_the_released_optimizer_on_more_profiles(case: dict[str, Any]) -> None:
    """tests/golden/pipedream_optimizer_more.json: the released optimizer run on more shipped profiles.

    Equal within 1e-9 except GNMT's wider settings, where our chain (which keeps the unused
    ``__getitem__`` sinks the optimizer drops, and whose prefixes are not its antichain states)
    finds a lower objective.
    """
    levels = [Level(n, b) for n, b in zip(case["num_machines_per_level"], case["bandwidths_bytes_per_s_per_level"],
                                          strict=True)]
    found = pipedream_optimizer(load_profile(ROOT / "traces" / f"{case['model']}.json"), levels,
                                straight=case["straight_pipeline"], memory_bytes=case["memory_constraint_bytes"])
    released = case["released_pipeline_time_per_minibatch_s"]
    assert found.time_per_minibatch_s <= released * (1 + 1e-9)
    if case["model"] != "gnmt":
        assert found.time_per_minibatch_s == pytest.approx(released, rel=1e-9)


def test_stages_cover_the_layers_and_use_every_gpu_of_the_levels() -> None:
    profile = load_profile(ROOT / "traces" / "vgg16.json")
    found = pipedream_optimizer(profile, [Level(4, 1e10), Level(4, 1.25e9)])
    assert found.stages[0][0] == 0 and found.stages[-1][1] == profile.num_layers
    assert all(a[1] == b[0] for a, b in zip(found.stages, found.stages[1:]))
    assert sum(replicas for _, _, replicas in found.stages) == 16


def test_levels_of_a_topology() -> None:
    flat = Topology.uniform(num_devices=16, bandwidth=1e9)
    assert levels_of(flat) == (Level(16, 1e9),)
    servers = Topology.hierarchical(num_devices=16, devices_per_server=8, intra_bandwidth=5e10, inter_bandwidth=3.125e9)
    assert levels_of(servers) == (Level(8, 5e10), Level(2, 3.125e9))
    one_server = Topology.hierarchical(num_devices=4, devices_per_server=4, intra_bandwidth=5e10, inter_bandwidth=1e9)
    assert levels_of(one_server) == (Level(4, 5e10),)


def test_a_straight_pipeline_longer_than_the_chain_is_refused() -> None:
    profile = load_profile(ROOT / "traces" / "alexnet.json")
    with pytest.raises(ConfigError, match="straight pipeline needs as many layers as GPUs"):
        pipedream_optimizer(profile, [Level(64, 1e9)], straight=True)
    assert math.isfinite(pipedream_optimizer(profile, [Level(22, 1e9)], straight=True).time_per_minibatch_s)
