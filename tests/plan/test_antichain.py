"""The released optimizer's antichain states of a layer DAG, and plans that cut a DAG off the chain's order."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipesim.errors import ConfigError
from pipesim.plan.antichain import antichain_states
from pipesim.plan.compat import Level, pipedream_optimizer
from pipesim.spec.files import load_profile
from pipesim.spec.profile import Profile
from pipesim.spec.validation import build

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "tests" / "data" / "pipedream_optimizer.json"  # PipeDream's optimizer, run (tests/data/README.md)

#        +-> 1 --+
#   0 ---|       |--> 3
#        +-> 2 --+
BRANCHES = [[], [0], [0], [1, 2]]
SIZES = [1.0, 10.0, 100.0, 1000.0]


def test_two_branches_give_the_state_a_chain_lacks() -> None:
    dag = antichain_states(BRANCHES, SIZES, max_states=100)
    assert dag is not None
    states = [sorted(np.flatnonzero(row).tolist()) for row in dag.members]
    assert states == [[0], [0, 1], [0, 2], [0, 1, 2], [0, 1, 2, 3]]  # [0, 2] is no prefix of 0 1 2 3
    ancestors = [sorted(np.flatnonzero(row).tolist()) for row in dag.ancestors]
    assert ancestors == [[], [0], [0], [0, 1, 2], [0, 1, 2, 3]]
    # Cut after [0, 1]: 1's output and 0's (2 still reads it). After [0, 1, 2]: both branch ends,
    # and 0's output again, which the released optimizer counts though both of its readers are in.
    assert dag.output_bytes.tolist() == [1.0, 11.0, 101.0, 111.0, 1000.0]


def test_a_dag_wider_than_the_budget_gives_none() -> None:
    fan = [[]] + [[0]] * 12 + [list(range(1, 13))]  # 12 parallel layers: 2^12 states
    assert antichain_states(fan, [1.0] * 14, max_states=1000) is None
    assert antichain_states(fan, [1.0] * 14, max_states=5000) is not None


def test_state_counts_are_the_released_optimizers() -> None:
    cases = json.loads(REFERENCE.read_text())["cases"]
    counts = {case["model"]: case["outputs"]["num_antichain_states"] for case in cases}
    for model, count in counts.items():
        profile = load_profile(ROOT / "traces" / f"{model}.json")
        kept = profile.layers[1:]  # the leading Input layer is not a state
        reads = [[source - 1 for source in layer.inputs or () if source > 0] for layer in kept]
        dag = antichain_states(reads, [layer.stashed_bytes for layer in kept], max_states=10_000)
        assert dag is not None and dag.num_states == count, model


def test_resnet50_on_two_servers_cuts_a_residual_block_as_the_released_optimizer_does() -> None:
    """Its best plan's first stage ends with a block's shortcut conv (node88) but not the main
    branch's first two layers (node86, node87): no prefix of the node-number order."""
    case = next(case for case in json.loads(REFERENCE.read_text())["cases"]
                if case["case_id"] == "resnet50__hier_8gpu_servers_25Gbps__n8x2")
    profile = load_profile(ROOT / "traces" / "resnet50.json")
    found = pipedream_optimizer(profile, [Level(8, 5e10), Level(2, 3.125e9)])
    assert found.time_per_minibatch_s == pytest.approx(case["outputs"]["pipeline_time_per_minibatch_s"], rel=1e-9)
    assert found.profile is not profile
    stages = [sorted(layer.name.split()[0] for layer in found.profile.layers[start:end])
              for start, end, _ in found.stages]
    assert stages == [sorted(stage["node_ids"]) for stage in case["outputs"]["stages"]]
    assert [replicas for _, _, replicas in found.stages] == [10, 2, 2, 2]


def test_a_layer_reading_a_later_layer_is_refused() -> None:
    layers = [{"name": f"l{index}", "forward_s": 1.0, "backward_s": 1.0, "activation_bytes": 1.0, "param_bytes": 0.0}
              for index in range(3)]
    layers[1]["inputs"] = [2]
    with pytest.raises(ConfigError) as refused:
        build(Profile, {"layers": layers}, source="dag.json")
    assert str(refused.value) == "dag.json: layers[1].inputs=2: a layer reads only earlier layers (0 to 0)"
