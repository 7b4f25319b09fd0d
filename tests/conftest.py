"""Shared test set-up: hypothesis profiles and small fixtures."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings

settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=200, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
# The mutation benchmark (benchmarks/mutants.py): ci's examples, but a failure is reported as found,
# not shrunk to its smallest form (only whether a test fails matters there, and shrinking takes minutes).
settings.register_profile("mutants", settings.get_profile("ci"),
                          phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target])
settings.register_profile("dev", deadline=None, max_examples=50)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

ROOT = Path(__file__).resolve().parents[1]
# Shared helpers (strategies, the reference scheduler, trace invariants) import by module name.
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))


@pytest.fixture
def root() -> Path:
    """The repository root."""
    return ROOT
