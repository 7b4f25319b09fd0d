"""When the analytic engine's compiled kernels pay for numba's start-up in this process."""

from __future__ import annotations

from pipesim import jit

# numba's first call in a process (its own start-up and loading the cached kernels) takes
# about 0.3 to 0.5 s on an idle core and seconds on a loaded one; the numpy paths run 1 to 2
# million ops/s, about 4 times slower than the kernels. Below this many ops, in one run or
# all runs so far in this process, the numpy paths finish before numba would have started.
KERNELS_FROM_OPS = 500_000

_ops_so_far = 0


def kernels_pay_off(num_ops: int) -> bool:
    """Whether a run of ``num_ops`` ops should use the compiled kernels; counts it as run.

    True when numba compiles the kernels (``pipesim.jit.ENABLED``) and this run together with
    the runs before it in this process reach ``KERNELS_FROM_OPS`` ops: a large run, or a sweep
    of many small ones, uses the kernels; a single small run (a CLI call, a test) never starts
    numba. Results are the same either way, bit for bit.
    """
    global _ops_so_far
    _ops_so_far += num_ops
    return jit.ENABLED and _ops_so_far >= KERNELS_FROM_OPS
