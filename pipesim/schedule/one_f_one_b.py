"""1F1B order on one stage, the building block of PipeDream-Flush and the asynchronous schedules."""

from __future__ import annotations

from collections.abc import Iterator

from pipesim.schedule.ir import B, F, Op


def one_f_one_b_order(num_stages: int, stage: int, num_microbatches: int) -> Iterator[Op]:
    """Yield stage ``stage``'s 1F1B order over microbatches ``0..num_microbatches-1``.

    A warm-up of ``min(p - s - 1, n)`` forwards, then forward/backward pairs, then the
    remaining backwards. Stage s, p = 3, n = 4::

        s=0: 0F0 0F1 0F2 0B0 0F3 0B1     0B2 0B3
        s=1:     1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3
        s=2:         2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3

    This is the same sequence as PyTorch's Schedule1F1B, which counts the warm-up as
    ``min(n, p - s)`` forwards followed by backward/forward pairs.
    """
    warmup = min(num_stages - stage - 1, num_microbatches)
    for microbatch in range(warmup):
        yield F(stage, microbatch)
    for microbatch in range(num_microbatches - warmup):
        yield F(stage, microbatch + warmup)
        yield B(stage, microbatch)
    for microbatch in range(num_microbatches - warmup, num_microbatches):
        yield B(stage, microbatch)
