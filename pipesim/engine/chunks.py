"""Overlapped forward-and-backward chunks: which F, B pairs of a rank run as one op, and for how long.

DualPipe and DualPipeV (deepseek-ai/DualPipe, ``_forward_backward_chunk``) run the forward of
one microbatch on one of a rank's stages and the full backward of another on its other stage as
one chunk: it receives both inputs, computes both overlapped (the communication of one hidden
under the compute of the other), then sends both outputs. torch's ScheduleDualPipeV writes the
same pairs as OVERLAP_F_B actions but its runtime performs them one after the other, each op
waiting for its own input and sending at its own end, which is the order run op by op.

A chunk is the pair of an F and the B right after it on the rank, of the other stage; in the
steady state the order alternates such pairs. The first pair of the last rank in each minibatch
is not one: both DualPipe and torch run it as two chunks, to shorten the bubble, and both run
each minibatch apart (DualPipe's ``step()``), so every minibatch has that pair.

The PipeMare paper's pipeline (``pipemare_model="paper"``) is the same op on one stage: in each
time step a stage runs one forward and one backward at once, F(i + w) beside B(i), so the pair
takes max(F, B) and the next step starts when both are done.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

from pipesim.errors import ConfigError
from pipesim.schedule.ir import B_CODE, F_CODE, Schedule, read_only

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

ChunkModel = Literal["dualpipe", "torch"]
CHUNK_MODELS = ("dualpipe", "torch")
PipemareModel = Literal["1f1b", "paper"]


def chunk_starts(schedule: Schedule, *, pipemare_model: PipemareModel = "1f1b") -> IntArray:
    """Flat indices of the F that opens each overlapped chunk (its B is the next op): dualpipev's
    pairs, or every step of PipeMare's paper pipeline; none for other schedules."""
    is_steps = schedule.name == "pipemare" and pipemare_model == "paper"
    if not (schedule.name == "dualpipev" or is_steps) or schedule.num_ops < 2:
        return np.empty(0, dtype=np.int64)
    t = schedule.table
    kind, stage, rank = t.kind, t.stage, t.rank
    same_stage = stage[:-1] == stage[1:]
    if is_steps:  # F(i + w) beside B(i), w = 2(p - s) - 1: a warm-up cut short by few microbatches has no step
        lag = 2 * (schedule.num_stages - stage[:-1]) - 1
        same_stage &= t.microbatch[:-1] - t.microbatch[1:] == lag
    pair = (kind[:-1] == F_CODE) & (kind[1:] == B_CODE) & (rank[:-1] == rank[1:]) & (same_stage if is_steps else ~same_stage)
    starts = np.flatnonzero(pair)
    if is_steps:
        return starts
    on_last = starts[rank[starts] == t.num_ranks - 1]
    # The last rank's first pair of each minibatch (microbatches of minibatch k: k m .. k m + m - 1).
    _, first = np.unique(t.microbatch[on_last] // schedule.num_microbatches, return_index=True)
    return np.setdiff1d(starts, on_last[first], assume_unique=True)


def overlap_chunks(
    schedule: Schedule, duration: FloatArray, wait: IntArray, *, model: ChunkModel, fb_overlap: float,
    pipemare_model: PipemareModel = "1f1b",
) -> tuple[FloatArray, IntArray]:
    """Per op its duration and second input, with every chunk of ``schedule`` made one op.

    Under ``model="dualpipe"`` a chunk's F waits for its own input and its B's, and takes the
    overlapped time ``F&B = F + B - fb_overlap * min(F, B)`` (``fb_overlap`` 0: no overlap,
    F + B; 1: the shorter op hidden entirely); its B then takes no time, so both outputs leave
    at the chunk's end. Under ``model="torch"`` the two ops run one after the other, unchanged.
    A step of PipeMare's paper pipeline is such a chunk with the shorter op hidden: max(F, B).

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
    if schedule.name == "pipemare":
        model, fb_overlap = "dualpipe", 1.0
    starts = chunk_starts(schedule, pipemare_model=pipemare_model) if model == "dualpipe" else \
        np.empty(0, dtype=np.int64)
    if starts.size == 0:  # one column of -1 serves every program of the schedule
        none: IntArray | None = schedule.derived.get("no_chunk_wait")
        if none is None:
            none = schedule.derived["no_chunk_wait"] = read_only(np.full(duration.shape[0], -1, dtype=np.int64))
        return duration, none
    chunk_wait = np.full(duration.shape[0], -1, dtype=np.int64)
    forward, backward = duration[starts], duration[starts + 1]
    duration = duration.copy()
    duration[starts] = forward + backward - fb_overlap * np.minimum(forward, backward)
    duration[starts + 1] = 0.0
    chunk_wait[starts] = wait[starts + 1]
    return duration, chunk_wait
