"""The C allocator's thresholds, fixed once per process, so that a run's speed does not depend on
what the process freed before it.

glibc's malloc adapts two thresholds to the largest block freed so far: blocks above the mmap
threshold are mapped afresh for each allocation, and free memory beyond the trim threshold at
the top of the heap goes back to the OS. A run allocates and frees columns of a few MB, so with
the adaptive thresholds each run could take its memory back from the OS one page fault per
4 KiB, and the same call ran several times slower in a process that had freed only smaller
blocks before (benchmarks/RESULTS.md, "Page faults"). Fixed thresholds keep up to KEEP_BYTES of
freed memory for the next run. Where the C library is not glibc nothing changes;
``PIPESIM_MALLOC=default`` leaves glibc's own thresholds.
"""

from __future__ import annotations

import ctypes
import os
import sys

#: Blocks up to this size come from the heap, and this much freed memory stays with the process.
KEEP_BYTES = 256 << 20
#: The same thresholds for a process started from here (glibc reads them at its start).
ENVIRONMENT = {"MALLOC_TRIM_THRESHOLD_": str(KEEP_BYTES), "MALLOC_MMAP_THRESHOLD_": str(KEEP_BYTES)}
# glibc's mallopt parameters (malloc.h), and the largest mmap threshold that glibc's manual allows
# on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX), tried where a larger one is refused.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
OLDER_MMAP_LIMIT = 32 << 20


def keep_freed_memory(mmap_bytes: int = KEEP_BYTES, trim_bytes: int = KEEP_BYTES) -> bool:
    """Fix glibc's mmap threshold at ``mmap_bytes`` and its trim threshold at ``trim_bytes`` (see
    the module); True if they were set."""
    if os.environ.get("PIPESIM_MALLOC", "").strip().lower() == "default" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)  # the C library this process already runs on
        if not hasattr(libc, "gnu_get_libc_version"):
            return False
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    mapped = mallopt(M_MMAP_THRESHOLD, mmap_bytes) or mallopt(M_MMAP_THRESHOLD, min(mmap_bytes, OLDER_MMAP_LIMIT))
    return bool(mapped) and bool(mallopt(M_TRIM_THRESHOLD, trim_bytes))
