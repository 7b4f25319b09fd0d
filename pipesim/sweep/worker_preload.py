"""What an embedded cluster's worker processes hold before they start: imported once by the fork
server their nannies fork them from (``dask_cluster.dask_client``).

Spawned, each worker imports Dask, pipesim and numba and loads numba's kernels itself, about a
CPU-second and a half a worker; forked from a server that did it once, a worker starts with all
of it in memory (benchmarks/RESULTS.md, "Workers forked from a preloaded server").
"""

from __future__ import annotations

import distributed  # noqa: F401 - what every worker runs on
import pipesim.sweep.tasks  # noqa: F401 - the sweep's tasks (a search's import the rest on their first)
from pipesim import jit
from pipesim.sweep.points import PointRunner
from pipesim.sweep.spec import Resolved, parse_spec

#: A small sweep whose points call the compiled kernels the sweeps' points call (the engines'
#: timing, the memory levels, the exposed communication), with and without recomputation.
WARM_SPEC = {
    "profile": {"uniform": {"layers": 8, "forward_ms": 1.0, "backward_ms": 2.0, "activation_bytes": 1000,
                            "param_bytes": 4000}},
    "bandwidth": ["10GB/s"], "latency": ["5us"], "stages": [4], "microbatches": [8], "minibatches": [2],
    "schedule": ["gpipe", "1f1b", "pipedream", "2bw", "pipemare", "zb-h1"], "recompute": [False, True],
}


def load_kernels() -> None:
    """Run ``WARM_SPEC``'s points on numba's kernels, where numba is installed and ``PIPESIM_JIT``
    allows them, so that their machine code is in memory before the server forks. A failure is
    left for the tasks that use those kernels to meet again and report (this only saves time)."""
    # Inside the try: multiprocessing's fork server survives only an ImportError from a preload, and
    # any other error here (a bad PIPESIM_JIT) would end it, and with it every worker's start.
    try:
        if not jit.AVAILABLE or jit.setting_from_environment() == "never":
            return
        resolved = Resolved(parse_spec(WARM_SPEC))
        PointRunner(resolved, "always").run_batch(resolved.points())
    except Exception:  # noqa: BLE001, S110 - see the docstring
        pass


load_kernels()
