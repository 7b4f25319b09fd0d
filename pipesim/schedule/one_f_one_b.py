"""The 1F1B block formula: gpipe, 1f1b, pipedream, 2bw and pipemare written straight into op-table columns."""

from __future__ import annotations

import numpy as np

from pipesim.schedule.ir import B_CODE, F_CODE, U_CODE, Schedule, ScheduleTable, WeightPolicy, one_stage_per_rank, read_only


def one_f_one_b_schedule(
    name: str,
    num_stages: int,
    num_microbatches: int,
    num_minibatches: int,
    *,
    weights: WeightPolicy,
    warmup_all: bool = False,
    update_every: int | None = None,
    warmup_rounds: int = 1,
) -> Schedule:
    """Stage s on rank s runs blocks of n microbatches in 1F1B order, a U after every e-th backward.

    Flush schedules (``update_every=None``: gpipe, 1f1b) repeat one minibatch's block K times
    (n = m, a U after its last backward); the others run one block of n = K*m microbatches
    with a U after every e-th backward (e = ``update_every``). Within a block, stage s runs
    w = min(p - s - 1, n) warm-up forwards, then F(i + w), B(i) pairs, then the cool-down
    backwards (as PyTorch's Schedule1F1B); GPipe (``warmup_all``) is the same with w = n, and
    the PipeMare paper's pipeline (``warmup_rounds=2``) with w = min(2(p - s) - 1, n)::

        t:      0   1   2   3   4   5   6   7          p = 3, n = 4, no U
        s=0:   F0  F1  F2  B0  F3  B1  B2  B3          w = 2
        s=2:   F0  B0  F1  B1  F2  B2  F3  B3          w = 0

    So F(i) sits at t = i (i < w) or 2i - w, and B(i) at w + 2i + 1 (i < n - w) or i + n;
    each op then moves right by the U's before it: one per e backwards already run, and
    max(0, i - w) backwards run before F(i), i before B(i). The same indices give the order
    facts the table carries (minibatch, updates before, own forward, input),
    which a schedule converted from Op lists derives instead.
    """
    p, m = num_stages, num_microbatches
    if update_every is None:
        num_blocks, n, every = num_minibatches, m, m
    else:
        num_blocks, n, every = 1, num_minibatches * m, update_every
    per_block = n // every  # U's in a block (n is a multiple of e)
    width = 2 * n + per_block
    length = num_blocks * width
    stages = np.arange(p, dtype=np.int64)[:, None]
    warmup = np.full_like(stages, n) if warmup_all else np.minimum(warmup_rounds * (p - stages) - 1, n)
    i = np.arange(n, dtype=np.int64)[None, :]
    forward_updates = np.maximum(i - warmup, 0) // every
    backward_updates = i // every
    forward_pos = np.where(i < warmup, i, 2 * i - warmup) + forward_updates
    backward_pos = np.where(i < n - warmup, warmup + 2 * i + 1, i + n) + backward_updates
    update_pos = backward_pos[:, every - 1::every] + 1
    # Flat index: rank offset + block offset + position in the block.
    base = stages[:, :, None] * length + np.arange(num_blocks, dtype=np.int64)[None, :, None] * width
    forward_at = (base + forward_pos[:, None, :]).reshape(p, -1)
    backward_at = (base + backward_pos[:, None, :]).reshape(p, -1)
    update_at = (base + update_pos[:, None, :]).reshape(p, -1)

    total = p * length
    micro_index = np.arange(num_blocks * n, dtype=np.int64)
    update_index = np.arange(num_blocks * per_block, dtype=np.int64)
    kind = np.full(total, B_CODE, dtype=np.int64)
    kind[forward_at] = F_CODE
    kind[update_at] = U_CODE
    microbatch = np.empty(total, dtype=np.int64)
    microbatch[forward_at] = micro_index
    microbatch[backward_at] = micro_index
    microbatch[update_at] = update_index
    minibatch = np.empty(total, dtype=np.int64)
    if update_every is None:  # block k is minibatch k
        minibatch.reshape(p, num_blocks, width)[:] = np.arange(num_blocks, dtype=np.int64)[None, :, None]
    else:
        minibatch[forward_at] = minibatch[backward_at] = micro_index // m
        minibatch[update_at] = ((update_index + 1) * every - 1) // m  # the backward before it
    if update_every is None:
        updates_before = minibatch  # one U per block, after it: block k runs after k updates
    else:  # one block: the updates counted above
        updates_before = np.empty(total, dtype=np.int64)
        updates_before[forward_at] = forward_updates
        updates_before[backward_at] = backward_updates
        updates_before[update_at] = update_index
    # Each op's own stage's F, read by the versions of stashing and flush schedules only.
    forward = None
    if weights in (WeightPolicy.STASH, WeightPolicy.FLUSH):
        forward = np.arange(total, dtype=np.int64)  # right for the F's and U's
        forward[backward_at] = forward_at
    # Inputs from other stages: F(s, i) <- F(s-1, i), B(s, i) <- B(s+1, i).
    wait = np.full(total, -1, dtype=np.int64)
    wait[forward_at[1:]] = forward_at[:-1]
    wait[backward_at[:-1]] = backward_at[1:]
    stage = read_only(np.repeat(np.arange(p, dtype=np.int64), length))
    table = ScheduleTable(
        rank_offsets=read_only(np.arange(p + 1, dtype=np.int64) * length), stage=stage, known_rank=stage,
        kind=read_only(kind), microbatch=read_only(microbatch), minibatch=read_only(minibatch),
        updates_before=read_only(updates_before),
        forward=None if forward is None else read_only(forward), wait=read_only(wait),
    )
    return Schedule(name=name, num_stages=p, num_microbatches=m, num_minibatches=num_minibatches, table=table,
                    stage_to_rank=one_stage_per_rank(p), weights=weights)
