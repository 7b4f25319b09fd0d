"""The set-up every harness process shares (torch threads, allocator), so profiles and runs time the same thing."""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator

import torch

from pipesim.allocator import keep_freed_memory

# The thresholds a harness process keeps freed memory by (pipesim.allocator): every tensor of up to
# 32 MiB reused from the heap, and up to 1 GiB of freed memory kept. By default a CPU tensor of 128 KB
# or more gets fresh pages from mmap and every page faults on first touch, which is slow under
# virtualization; how often that happens depends on the order of allocations, so a layer timed alone
# and the same layer inside a pipeline would pay differently.
MMAP_THRESHOLD_BYTES = 32 << 20
TRIM_THRESHOLD_BYTES = 1 << 30


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
    keep_freed_memory(MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES)


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
