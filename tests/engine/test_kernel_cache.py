"""numba's disk cache of a kernel follows what the kernel froze in from other modules.

numba keys a cached kernel on its own source file; a constant it imports from another module, or
a kernel of another file that it calls, is compiled into its machine code too. Each step below is
a fresh process on the same cache folder, with one of those changed and the kernel's file not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipesim import jit

pytestmark = pytest.mark.skipif(not jit.AVAILABLE, reason="numba is not installed (the fast extra)")

KERNEL = """\
from pipesim.jit import jit
import constants
from constants import SCALE, OFFSETS, SHIFT
from helper import bump


@jit
def scaled(x):
    return (bump(x) + OFFSETS[1] + SHIFT) * SCALE * constants.FACTOR
"""
HELPER = """\
from pipesim.jit import jit


@jit
def bump(x):
    return {choose}(x + {step}, 0.0)
"""
CONSTANTS = ("import numpy as np\nSCALE = {scale}\nOFFSETS = np.array([0.0, {offset}])\nSHIFT = np.float64({shift})\n"
             "FACTOR = {factor}\n")
RUN = """\
import json
import kernel
from pipesim.jit import pick
value = pick(kernel.scaled, True)(2.0)
stats = kernel.scaled.dispatcher().stats
print(json.dumps({"value": value, "hits": sum(stats.cache_hits.values()), "misses": sum(stats.cache_misses.values())}))
"""


def run(folder: Path, scale: float = 1.0, offset: float = 0.0, step: float = 1.0, choose: str = "max",
        shift: float = 0.0, factor: float = 1.0) -> tuple[float, str]:
    """Write the modules with these values (``kernel.py`` itself never changes), call the kernel
    compiled in a new process; its value and whether numba loaded it from the cache or compiled it."""
    (folder / "constants.py").write_text(CONSTANTS.format(scale=scale, offset=offset, shift=shift, factor=factor))
    (folder / "helper.py").write_text(HELPER.format(step=step, choose=choose))
    if not (folder / "kernel.py").exists():
        (folder / "kernel.py").write_text(KERNEL)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(folder / "numba-cache"), "PIPESIM_JIT": "always"}
    done = subprocess.run([sys.executable, "-B", "-c", RUN], cwd=folder, env=env, capture_output=True, text=True,
                          check=True)
    found = json.loads(done.stdout)
    assert found["hits"] + found["misses"] == 1, found
    return found["value"], "loaded" if found["hits"] else "compiled"


def test_a_change_to_a_frozen_constant_or_a_called_kernel_in_another_file_compiles_afresh(tmp_path: Path) -> None:
    assert run(tmp_path) == (3.0, "compiled")  # (max(2 + 1, 0) + 0 + 0) * 1 * 1
    assert run(tmp_path) == (3.0, "loaded")  # nothing changed: numba's cache serves it
    assert run(tmp_path, scale=2.0) == (6.0, "compiled")  # a number of another module
    assert run(tmp_path, scale=2.0, offset=4.0) == (14.0, "compiled")  # an array of another module
    assert run(tmp_path, scale=2.0, offset=4.0, step=10.0) == (32.0, "compiled")  # a kernel of another file
    # The same kernel calling another function: min(12, 0) + 4, times 2.
    assert run(tmp_path, scale=2.0, offset=4.0, step=10.0, choose="min") == (8.0, "compiled")
    assert run(tmp_path, shift=1.0) == (4.0, "compiled")  # a numpy scalar of another module
    assert run(tmp_path, factor=5.0) == (15.0, "compiled")  # read as a module's attribute
    assert run(tmp_path) == (3.0, "loaded")  # back as at first: that machine code is still in the cache


def test_the_cache_key_is_the_same_in_every_process_whatever_the_string_hashes() -> None:
    """``x in {"a", "b"}`` compiles to a frozenset constant whose repr follows the string hashes:
    a key built from it would differ from process to process (a fresh compile in each)."""
    probe = ("import hashlib\nfrom pipesim.jit import _code_bytes\n"
             "def f(x):\n    return x in {'alpha', 'beta', 'gamma', 'delta', 'epsilon'}\n"
             "print(hashlib.sha256(_code_bytes(f.__code__)).hexdigest())\n")
    digests = {subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout for seed in (1, 2, 3, 4)}
    assert len(digests) == 1
