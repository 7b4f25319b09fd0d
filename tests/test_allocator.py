"""The C allocator's thresholds (pipesim.allocator): fixed on import, so that repeated runs reuse
freed memory instead of taking it back from the OS page by page."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipesim import jit

# Repeated runs of one program, in a fresh process: minor page faults per run after the first.
FAULTS = """
import resource
from pipesim import Topology, uniform_profile
from pipesim.simulation import make_plan, prepare
from pipesim.engine.analytic import run_analytic
profile = uniform_profile(num_layers=64, forward_s=1e-3, backward_s=2e-3, activation_bytes=1e6, param_bytes=4e6)
topology = Topology.uniform(num_devices=64, bandwidth="25Gbit/s", latency="5us")
program = prepare(profile, topology, make_plan(profile, schedule="1f1b", num_stages=64, num_microbatches=512))
run_analytic(program, compiled=True)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    run_analytic(program, compiled=True)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5)
"""

glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
                           reason="the thresholds are glibc's")


def faults_per_run(**env: str) -> float:
    done = subprocess.run([sys.executable, "-c", FAULTS], capture_output=True, text=True, check=True,
                          env={**os.environ, **env})
    return float(done.stdout)


@glibc
def test_importing_pipesim_fixes_the_thresholds_and_the_environment_can_leave_them() -> None:
    code = "import pipesim.allocator as a; print(a.keep_freed_memory())"
    for value, expected in (("", "True"), ("default", "False")):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env={**os.environ, "PIPESIM_MALLOC": value})
        assert done.stdout.strip() == expected


@glibc
@pytest.mark.skipif(not jit.AVAILABLE, reason="numba is not installed: the plain kernels' lists live in Python's "
                                              "own arenas, which these thresholds do not govern")
def test_repeated_runs_take_no_memory_back_from_the_os() -> None:
    # 65,600 ops: each run allocates and frees some 10 MB of numpy arrays (2,500 pages).
    assert faults_per_run() < 50
