"""The input files' models refuse bad values in one line naming the real field and value."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipesim.errors import ConfigError
from pipesim.spec.files import load_plan, load_profile, load_topology

LAYER = {"name": "l", "forward_s": 1, "backward_s": 2, "activation_bytes": 10, "param_bytes": 0}
PROFILE = {"schema": "pipesim.profile/1", "layers": [LAYER, LAYER, LAYER, LAYER]}
TOPOLOGY = {"schema": "pipesim.topology/1", "devices": [{"name": f"d{index}"} for index in range(4)]}
PLAN = {"schema": "pipesim.plan/1", "schedule": "1f1b", "num_stages": 4, "num_microbatches": 8}
LINK = {"src": 0, "dst": 1, "bandwidth_bytes_per_s": 1e9}


def _with_layer(index: int, **changes: Any) -> dict[str, Any]:
    layers = [dict(layer) for layer in PROFILE["layers"]]  # type: ignore[attr-defined]
    layers[index].update(changes)
    return {**PROFILE, "layers": layers}


CASES = [
    (load_profile, _with_layer(3, inputs=[99]), "layers[3].inputs=99: a layer reads only earlier layers (0 to 2)"),
    (load_profile, _with_layer(0, forward_s=True), "layers[0].forward_s=True: must be a number, not a boolean"),
    (load_profile, _with_layer(0, forward_s="1"), "layers[0].forward_s='1': must be a number, not a string"),
    (load_profile, _with_layer(1, selective_recompute="yes"),
     "layers[1].selective_recompute='yes': must be true or false, not a string"),
    (load_profile, _with_layer(2, backward_input_s=1), "layers[2].backward_input_s=1.0: must be given together "
                                                       "with backward_weight_s"),
    (load_profile, {**PROFILE, "microbatch_size": "2"}, "microbatch_size='2': must be a number, not a string"),
    (load_profile, {**PROFILE, "schema": "x"}, "schema='x': must be 'pipesim.profile/1'"),
    (load_topology, {**TOPOLOGY, "links": [{**LINK, "dst": 7}]}, "links[0].dst=7: must name a device (0 to 3)"),
    (load_topology, {**TOPOLOGY, "bandwidth_bytes_per_s": True},
     "bandwidth_bytes_per_s=True: must be a number, not a boolean"),
    (load_topology, {**TOPOLOGY, "links": [{**LINK, "src": False}]},
     "links[0].src=False: must be a number, not a boolean"),
    (load_topology, {**TOPOLOGY, "links": [LINK, {**LINK, "bandwidth_bytes_per_s": 2e9}]},
     "links[1]='0->1': links[0] already joins device 0 to device 1: give each pair of devices one link"),
    (load_topology, {**TOPOLOGY, "links": [LINK, {**LINK, "src": 1, "dst": 0}]},
     "links[1]='1->0': links[0] already joins device 1 to device 0: give each pair of devices one link"),
    (load_topology, {**TOPOLOGY, "levels": [{"group_size": 2, "bandwidth_bytes_per_s": 1e9},
                                            {"group_size": 2, "bandwidth_bytes_per_s": 2e9}]},
     "levels[1].group_size=2: must be > levels[0].group_size (2): levels go from inner to outer, group sizes rising"),
    (load_plan, {**PLAN, "num_stages": True}, "num_stages=True: must be a number, not a boolean"),
    (load_plan, {**PLAN, "num_stages": "4"}, "num_stages='4': must be a number, not a string"),
    (load_plan, {**PLAN, "recompute": "yes"}, "recompute='yes': must be true or false, not a string"),
    (load_plan, {**PLAN, "recompute": 1}, "recompute=1: must be true or false, not a number"),
    (load_plan, {**PLAN, "replicas": [1, 0, 1, 1]}, "replicas[1]=0: must be >= 1"),
    (load_plan, {**PLAN, "placement": [0, 1, -2, 3]}, "placement[2]=-2: must be a device index >= 0"),
    (load_plan, {**PLAN, "placement": [0, 1]}, "placement=[0, 1]: must have one entry per stage (2 entries, "
                                               "num_stages: 4)"),
    (load_plan, {**PLAN, "partition": [[0, 1], [1, 2], [3, 4], [4, 5]]},
     "partition[2]=[3, 4]: must be a non-empty layer range starting at 2: stages cut the layers into contiguous "
     "ranges from layer 0"),
    (load_plan, {**PLAN, "partition": [[0, 1], [1, 1], [1, 2], [2, 3]]},
     "partition[1]=[1, 1]: must be a non-empty layer range starting at 1: stages cut the layers into contiguous "
     "ranges from layer 0"),
    (load_topology, {**TOPOLOGY, "devices": [{"name": "d0", "speed": 0}]},
     "devices[0].speed=0: Input should be greater than 0"),
    (load_plan, {**PLAN, "schema": "pipesim.plan/2"}, "schema='pipesim.plan/2': must be 'pipesim.plan/1'"),
    (load_plan, {**PLAN, "placement": [0, 0, 1, 2]},
     "placement[1]=0: device 0 already runs stage 0: a device runs one rank (1 stage)"),
    (load_plan, {**PLAN, "placement": [0, 2, 1, 3], "replicas": [2, 1, 1, 1], "replica_model": "round-robin"},
     "placement[2]=1: device 1 already runs stage 0: a device runs one rank (1 stage)"),
    (load_plan, {**PLAN, "stages_per_rank": 2, "placement": [0, 1, 1, 1]},
     "placement[3]=1: device 1 already runs stages 1, 2: a device runs one rank (2 stages)"),
]


@pytest.mark.parametrize(("load", "data", "message"), CASES, ids=[case[2].split(":")[0] for case in CASES])
def test_bad_values_name_their_field_and_value(tmp_path: Path, load: Any, data: dict[str, Any], message: str) -> None:
    path = tmp_path / "input.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ConfigError) as refused:
        load(path)
    assert str(refused.value) == f"{path}: {message}"


def test_ints_are_numbers_and_distinct_pairs_and_rising_levels_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "input.json"
    one_way = {**LINK, "bidirectional": False}
    path.write_text(json.dumps({**TOPOLOGY, "links": [one_way, {**one_way, "src": 1, "dst": 0}],
                                "levels": [{"group_size": 2, "bandwidth_bytes_per_s": 10**9},
                                           {"group_size": 4, "bandwidth_bytes_per_s": 10**8}]}), encoding="utf-8")
    assert load_topology(path).link_cost(1, 0) == (0.0, 1e9)
    path.write_text(json.dumps({**PLAN, "placement": [0, 1, 2, 3], "optimizer_state_multiplier": 2}), encoding="utf-8")
    assert load_plan(path).optimizer_state_multiplier == 2.0


def test_a_link_from_a_device_to_itself_is_refused() -> None:
    from pipesim.spec.topology import Topology
    from pipesim.spec.validation import build

    data = {"schema": "pipesim.topology/1", "devices": [{"name": "a"}, {"name": "b"}],
            "links": [{"src": 1, "dst": 1, "bandwidth_bytes_per_s": 1e9}]}
    with pytest.raises(ConfigError) as raised:
        build(Topology, data)
    assert str(raised.value) == ("links[0].dst=1: must differ from src: a link joins two devices (a device sends to "
                                 "itself without one)")


def test_an_op_text_takes_ascii_digits_only() -> None:
    from pipesim.schedule.ir import Op

    assert Op.parse("1B2") == Op.parse(" 1B2 ")
    with pytest.raises(ConfigError, match="^op='1B\u0661': must look like"):
        Op.parse("1B\u0661")
