"""The emulated host's cost per op (pipesim.harness.overheads): where the prediction adds it."""

from __future__ import annotations

import pytest

from pipesim.errors import ConfigError
from pipesim.spec.profile import Profile
from pipesim.spec.topology import Topology
from pipesim.spec.validation import build


def four_layers(split: bool) -> Profile:
    layers = [{"name": f"l{i}", "forward_s": 0.001 * (i + 1), "backward_s": 0.002 * (i + 1),
               **({"backward_input_s": 0.001 * (i + 1), "backward_weight_s": 0.001 * (i + 1)} if split else {}),
               "activation_bytes": 64, "param_bytes": 16} for i in range(4)]
    return build(Profile, {"name": "four", "layers": layers, "microbatch_size": 1})


@pytest.mark.parametrize("split", [False, True])
def test_host_cost_goes_on_the_ops_whose_input_comes_from_another_rank(split: bool) -> None:
    from pipesim.harness.overheads import with_host_cost

    profile, cost = four_layers(split), 0.0005
    # a V: stages 1 and 2 share rank 1, stages 0 and 3 rank 0
    slower = with_host_cost(profile, cost, ((0, 1), (1, 2), (2, 3), (3, 4)), (0, 1, 1, 0))
    fed_forward = {1, 3}  # stage 2 is fed by stage 1 on its own rank
    fed_backward = {0, 2}  # stage 1's gradient comes from stage 2 on its own rank
    for i, (before, after) in enumerate(zip(profile.layers, slower.layers, strict=True)):
        assert after.forward_s == before.forward_s + (cost if i in fed_forward else 0.0)
        assert after.backward_s == before.backward_s + (cost if i in fed_backward else 0.0)
        if split:
            assert after.backward_input_s == before.backward_input_s + (cost if i in fed_backward else 0.0)
            assert after.backward_weight_s == before.backward_weight_s
        assert after.update_s == before.update_s
    assert slower.forward_overhead_s == profile.forward_overhead_s
    assert with_host_cost(profile, 0.0, ((0, 2), (2, 4)), (0, 1)) is profile


def test_a_host_cost_is_refused_with_real_compute() -> None:
    from pipesim.harness.config import ModelSpec
    from pipesim.harness.validate import ScheduleValidation

    topology = Topology.uniform(num_devices=2, bandwidth=1e9, latency=0.0)
    common = {"schedule": "1f1b", "num_stages": 2, "num_microbatches": 2, "num_minibatches": 3}
    with pytest.raises(ConfigError, match="host_cost_s"):
        ScheduleValidation(four_layers(False), topology, ModelSpec("mlp", depth=3, width=16), host_cost_s=0.001,
                           **common)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="host_cost_s"):
        ScheduleValidation(four_layers(False), topology, ModelSpec("mlp", depth=3, width=16), host_cost_s=-0.001,
                           compute="emulated", **common)  # type: ignore[arg-type]


def test_late_ops_finds_the_host_cost_a_prediction_carries() -> None:
    from pipesim.harness.config import ModelSpec, RunConfig
    from pipesim.harness.overheads import late_ops, with_host_cost
    from pipesim.harness.prediction import predict

    profile, cost = four_layers(False), 0.0003
    topology = Topology.uniform(num_devices=4, bandwidth=1e6, latency=0.0002)
    partition = ((0, 1), (1, 2), (2, 3), (3, 4))
    config = RunConfig(model=ModelSpec("mlp", depth=3, width=16), schedule="1f1b", num_stages=4, num_microbatches=4,
                       num_minibatches=4, microbatch_size=1, partition=partition)
    device = predict(profile, topology, config).trace
    assert late_ops(device, device) == pytest.approx([0.0] * 2 * 4 * 3 * 2, abs=1e-12)
    slower = predict(with_host_cost(profile, cost, partition, range(4)), topology, config).trace
    # every steady-state F of stages 1-3 and B of stages 0-2 (4 microbatches, minibatches 1 and 2)
    assert late_ops(device, slower) == pytest.approx([cost] * 2 * 4 * 3 * 2, rel=1e-9)
