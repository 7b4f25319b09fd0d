"""Overlapped forward-and-backward chunks: which F, B pairs of a rank run as one op, and for how long.

DualPipe and DualPipeV (deepseek-ai/DualPipe, ``_forward_backward_chunk``) run the forward of
one microbatch on one of a rank's stages and the full backward of another on its other stage as
one chunk: it receives both inputs, computes both overlapped (the communication of one hidden
under the compute of the other), then sends both outputs. torch's ScheduleDualPipeV writes the
same pairs as OVERLAP_F_B actions but its runtime performs them one after the other, each op
waiting for its own input and sending at its own end, which is the order run op by op.

A chunk is the pair of an F and the B right after it on the rank, of the other stage; in the
steady state the order alternates such pairs. The first pair of the last rank is not one: both
DualPipe and torch run it as two chunks, to shorten the bubble.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

from pipesim.errors import ConfigError
from pipesim.schedule.ir import B_CODE, F_CODE, Schedule

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

ChunkModel = Literal["dualpipe", "torch"]
CHUNK_MODELS = ("dualpipe", "torch")
OVERLAPPED_SCHEDULES = ("dualpipev",)


def chunk_starts(schedule: Schedule) -> IntArray:
    """Flat indices of the F that opens each overlapped chunk (its B is the next op)."""
    if schedule.name not in OVERLAPPED_SCHEDULES or schedule.num_ops < 2:
        return np.empty(0, dtype=np.int64)
    t = schedule.table
    kind, stage, rank = t.kind, t.stage, t.rank
    pair = (kind[:-1] == F_CODE) & (kind[1:] == B_CODE) & (rank[:-1] == rank[1:]) & (stage[:-1] != stage[1:])
    starts = np.flatnonzero(pair)
    on_last = starts[rank[starts] == t.num_ranks - 1]
    if on_last.size:
        starts = starts[starts != on_last[0]]
    return starts


def overlap_chunks(
    schedule: Schedule, duration: FloatArray, wait: IntArray, *, model: ChunkModel, fb_overlap: float,
) -> tuple[FloatArray, IntArray]:
    """Per op its duration and second input, with every chunk of ``schedule`` made one op.

    Under ``model="dualpipe"`` a chunk's F waits for its own input and its B's, and takes the
    overlapped time ``F&B = F + B - fb_overlap * min(F, B)`` (``fb_overlap`` 0: no overlap,
    F + B; 1: the shorter op hidden entirely); its B then takes no time, so both outputs leave
    at the chunk's end. Under ``model="torch"`` the two ops run one after the other, unchanged.

    Returns:
        ``(duration, chunk_wait)``: the durations (a copy where chunks change them) and, per op,
        the second input it waits for, or -1.

    Raises:
        ConfigError: an unknown model or an overlap outside [0, 1].
    """
    if model not in CHUNK_MODELS:
        raise ConfigError("fb_chunks", model, f"must be one of {', '.join(CHUNK_MODELS)}")
    if not 0.0 <= fb_overlap <= 1.0:
        raise ConfigError("fb_overlap", fb_overlap, "must be between 0 and 1 (the hidden share of the shorter op)")
    chunk_wait = np.full(duration.shape[0], -1, dtype=np.int64)
    starts = chunk_starts(schedule) if model == "dualpipe" else np.empty(0, dtype=np.int64)
    if starts.size == 0:
        return duration, chunk_wait
    forward, backward = duration[starts], duration[starts + 1]
    duration = duration.copy()
    duration[starts] = forward + backward - fb_overlap * np.minimum(forward, backward)
    duration[starts + 1] = 0.0
    chunk_wait[starts] = wait[starts + 1]
    return duration, chunk_wait
