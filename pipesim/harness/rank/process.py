"""The set-up every harness process shares (torch threads, allocator), so profiles and runs time the same thing."""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Iterator

import torch

# glibc mallopt parameters.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # the largest glibc accepts on 64-bit
_TRIM_THRESHOLD = 1 << 30


def keep_freed_memory() -> bool:
    """Make glibc keep freed memory for reuse instead of returning it to the OS (Linux only).

    By default a CPU tensor of 128 KB or more gets fresh pages from mmap and every page faults on
    first touch, which is slow under virtualization; how often that happens depends on the order
    of allocations, so a layer timed alone and the same layer inside a pipeline would pay
    differently. With a high mmap threshold and no trimming, a steady state reuses the same memory.

    Returns:
        True when the allocator accepted both settings.
    """
    if not sys.platform.startswith("linux"):
        return False
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)) and bool(
            libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
    return False


def configure_process(threads: int, realtime_priority: int = 0) -> None:
    """Pin torch to ``threads`` intra-op threads and keep freed memory, as every rank and the profiler do;
    with ``realtime_priority`` (1-99), run this thread, and every thread it starts after, under
    SCHED_RR at that priority (an emulated device's rank: see ``config.Emulation``).

    Raises:
        OSError: the process may not take the real-time policy (root or CAP_SYS_NICE is needed).
    """
    if realtime_priority:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(realtime_priority))
    torch.set_num_threads(threads)
    keep_freed_memory()


@contextlib.contextmanager
def without_gc() -> Iterator[None]:
    """Python's cyclic garbage collector off for a timed section (it would stop an op at a moment
    that depends on every allocation before it), then a collection.

    The profiler's timing loops and the runtime's op loop both run under it, so neither times
    collections; the objects a step leaves behind are freed by reference counting either way.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        gc.collect()
