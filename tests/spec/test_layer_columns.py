"""Profile.columns: the layers' numbers by column that stage costs add up, made once per profile."""

from __future__ import annotations

from pipesim import Topology, uniform_profile
from pipesim.simulation import make_plan
from pipesim.spec.stages import stage_costs


def test_columns_hold_each_layers_numbers_with_unset_times_as_zero() -> None:
    profile = uniform_profile(num_layers=3, forward_s=1e-3, backward_s=2e-3, activation_bytes=8.0, param_bytes=4.0,
                              forward_std_s=3e-4)
    columns = profile.columns
    assert columns.forward_s == [1e-3] * 3 and columns.backward_s == [2e-3] * 3
    assert columns.update_s == [0.0] * 3 and columns.backward_input_s == [0.0] * 3
    assert columns.forward_var == [(3e-4) ** 2] * 3 and columns.backward_var == [0.0] * 3
    assert columns.stashed_bytes == [8.0] * 3 and columns.weight_stashed_bytes == [8.0] * 3
    assert columns.param_bytes == [4.0] * 3 and columns.selective == [False] * 3


def test_a_copy_with_other_layers_does_not_keep_the_cached_columns() -> None:
    """pydantic's model_copy copies the instance's __dict__, a cached value included."""
    profile = uniform_profile(num_layers=4, forward_s=1e-3, backward_s=2e-3)
    topology = Topology.uniform(num_devices=2)
    plan = make_plan(profile, schedule="1f1b", num_stages=2, num_microbatches=4)
    assert stage_costs(profile, plan, topology).forward_s == (2e-3, 2e-3)
    faster = profile.model_copy(update={"layers": tuple(layer.model_copy(update={"forward_s": 5e-4})
                                                        for layer in profile.layers)})
    assert faster.columns.forward_s == [5e-4] * 4
    assert stage_costs(faster, plan, topology).forward_s == (1e-3, 1e-3)
    assert profile.columns.forward_s == [1e-3] * 4
