"""uniform_profile: a synthetic profile's layer count is bounded."""

from __future__ import annotations

import pytest

from pipesim import uniform_profile
from pipesim.errors import ConfigError


@pytest.mark.parametrize("num_layers", [0, 100_001, 100_000_000])
def test_layer_counts_outside_the_bound_are_refused(num_layers: int) -> None:
    with pytest.raises(ConfigError, match=f"^num_layers={num_layers}: must be from 1 to 100,000$"):
        uniform_profile(num_layers=num_layers, forward_s=1e-3, backward_s=2e-3)
