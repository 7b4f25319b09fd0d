"""Overlapped forward-and-backward chunks (DualPipeV), against DualPipe's published bubble.

Source: deepseek-ai/DualPipe, README.md, "Pipeline Bubbles and Memory Usage Comparison": the
bubble of DualPipe and DualPipeV is (PP/2-1)(F&B+B-3W) for PP stages, with F a forward chunk,
B a full backward chunk, W a backward-for-weights chunk and F&B two mutually overlapped
forward and backward chunks. The table counts the time slots of a uniform pipeline whose
forward, backward-for-inputs and backward-for-weights take equal time (F = I = W, B = 2W),
the zero-bubble papers' assumption. The tests below find it exact for the most idle device (the
busiest idles less) whenever F = I and W <= F, and not otherwise.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from pipesim import Topology, simulate, uniform_profile
from pipesim.engine.chunks import chunk_starts
from pipesim.errors import ConfigError
from pipesim.schedule.registry import build_schedule


def run(num_ranks: int, m: int, *, f: float, b: float, w: float, overlap: float, chunks: str, latency: float = 0.0,
        bandwidth: float = math.inf):
    profile = uniform_profile(num_layers=2 * num_ranks, forward_s=f, backward_s=b, backward_input_s=b - w,
                              backward_weight_s=w, activation_bytes=1e3)
    topology = Topology.uniform(num_devices=num_ranks, latency=latency, bandwidth=bandwidth)
    return simulate(profile, topology, schedule="dualpipev",
                    num_stages=2 * num_ranks, num_microbatches=m, stages_per_rank=2, fb_chunks=chunks,
                    fb_overlap=overlap)


def device_bubbles(result) -> list[float]:  # type: ignore[no-untyped-def]
    """Per device, the run's makespan less its compute time."""
    s = result.trace.spans
    compute = s["stream"] == 0
    makespan = float(s["end_s"][compute].max())
    busy = s["end_s"] - s["start_s"]
    return [makespan - float(busy[compute & (s["device"] == d)].sum()) for d in range(result.schedule.num_ranks)]


@pytest.mark.parametrize("num_ranks", [2, 3, 4, 5])
def test_dualpipe_bubble_table(num_ranks: int) -> None:
    pp, w = 2 * num_ranks, 1.0
    f, b = w, 2 * w
    for m in (pp, pp + 3, 3 * pp):
        for overlap in (0.0, 0.5, 1.0):
            fb = f + b - overlap * min(f, b)
            bubbles = device_bubbles(run(num_ranks, m, f=f, b=b, w=w, overlap=overlap, chunks="dualpipe"))
            assert math.isclose(max(bubbles), (pp / 2 - 1) * (fb + b - 3 * w), rel_tol=1e-12), (m, overlap, bubbles)
        # torch's runtime runs each OVERLAP_F_B's two ops one after the other, each on its own
        # input: the bubble is (PP/2-1)(2B-3W) whatever the overlap would have been.
        bubbles = device_bubbles(run(num_ranks, m, f=f, b=b, w=w, overlap=1.0, chunks="torch"))
        assert math.isclose(max(bubbles), (pp / 2 - 1) * (2 * b - 3 * w), rel_tol=1e-12), (m, bubbles)


@pytest.mark.parametrize(("f", "i", "w"), [(2.0, 2.0, 1.0), (3.0, 3.0, 1.0), (3.0, 3.0, 2.0), (4.0, 4.0, 3.0)])
def test_the_table_is_exact_for_the_most_idle_device_whenever_f_equals_i_and_w_is_no_longer(
        f: float, i: float, w: float) -> None:
    b = i + w
    for num_ranks in (2, 3, 4):
        pp = 2 * num_ranks
        for m in (pp, pp + 3):
            for overlap in (0.0, 0.5, 1.0):
                table = (pp / 2 - 1) * (f + b - overlap * min(f, b) + b - 3 * w)
                bubbles = device_bubbles(run(num_ranks, m, f=f, b=b, w=w, overlap=overlap, chunks="dualpipe"))
                assert math.isclose(max(bubbles), table, rel_tol=1e-12), (num_ranks, m, overlap, bubbles)


def test_the_table_is_not_exact_otherwise_nor_for_the_busiest_device() -> None:
    # F = 2W, I = W: the table's count of slots understates the most idle device's idle time
    # (9 W against 6 W).
    f, b, w, overlap = 2.0, 2.0, 1.0, 0.5
    bubbles = device_bubbles(run(4, 16, f=f, b=b, w=w, overlap=overlap, chunks="dualpipe"))
    assert (max(bubbles), (4 - 1) * (f + b - overlap * min(f, b) + b - 3 * w)) == (9.0, 6.0)
    # F = I = 1, W = 2 (W > F): 2 idle against the table's 1, though F = I.
    bubbles = device_bubbles(run(2, 4, f=1.0, b=3.0, w=2.0, overlap=0.0, chunks="dualpipe"))
    assert (max(bubbles), (2 - 1) * (1.0 + 3.0 + 3.0 - 3 * 2.0)) == (2.0, 1.0)
    # F = I = W, R = 3, half overlap: the most idle device idles the table's 3 W, the busiest 2.5 W.
    bubbles = device_bubbles(run(3, 6, f=1.0, b=2.0, w=1.0, overlap=0.5, chunks="dualpipe"))
    assert (max(bubbles), min(bubbles)) == (3.0, 2.5)


def test_the_docs_state_what_these_tests_show(root: Path) -> None:
    text = (root / "docs" / "schedules.md").read_text(encoding="utf-8")
    paragraph = text[text.index("**Overlapped F&B chunks (dualpipev).**"):]
    paragraph = paragraph[:paragraph.index("\n\n")]
    assert "busiest device idles exactly" not in paragraph
    assert "the most idle device idles exactly" in paragraph
    assert "whenever F = I and W ≤ F" in paragraph


def test_chunk_waits_for_both_inputs_and_sends_both_at_its_end() -> None:
    # A chunk's two inputs often come from one chunk of the neighbour rank over one link, where
    # the second queues behind the first for bytes / bandwidth (1 s here): the chunk starts after
    # the later one (and after the rank's previous op), lasts F&B, and its B is empty at its end.
    result = run(3, 8, f=1.0, b=2.0, w=1.0, overlap=0.5, chunks="dualpipe", latency=0.25, bandwidth=1e3)
    schedule, s = result.schedule, result.trace.spans
    compute = np.flatnonzero(s["stream"] == 0)
    start, end = s["start_s"][compute], s["end_s"][compute]  # compute spans are in op order
    program_wait = schedule.wait
    arrival = {}
    for row in np.flatnonzero(s["stream"] == 1).tolist():
        g = int(np.flatnonzero((s["stage"][compute] == s["stage"][row]) & (s["kind"][compute] == s["kind"][row])
                               & (s["microbatch"][compute] == s["microbatch"][row]))[0])
        arrival[g] = float(s["end_s"][row])
    starts = chunk_starts(schedule)
    assert starts.size > 0
    offsets = schedule.table.rank_offsets
    bound_by_backward_input = 0
    for g in starts.tolist():
        inputs = [arrival.get(int(p), float(end[p])) if p >= 0 else 0.0 for p in (program_wait[g], program_wait[g + 1])]
        previous = float(end[g - 1]) if g > offsets[schedule.table.rank[g]] else 0.0
        assert start[g] == max([previous, *inputs])
        bound_by_backward_input += inputs[1] > max(previous, inputs[0])
        assert end[g] - start[g] == 1.0 + 2.0 - 0.5 * 1.0
        assert start[g + 1] == end[g + 1] == end[g]
    assert bound_by_backward_input > 0  # the case tells a chunk from its F alone


def test_chunks_are_torch_overlap_pairs() -> None:
    # torch 2.13 ScheduleDualPipeV, R = 2, m = 4 (the order in dualpipev's docstring): rank 0
    # overlaps (0F3, 3B1), (3F2, 0B0), (3F3, 0B1); rank 1 runs its first step-4 pair (1F2, 2B0)
    # as two chunks ("We don't overlap these two chunks to further reduce bubble size") and
    # overlaps (2F2, 1B0), (1F3, 2B1), (2F3, 1B1).
    schedule = build_schedule("dualpipev", 4, 4, num_ranks=2)
    flat = [str(op) for ops in schedule.ranks for op in ops]
    pairs = [(flat[g], flat[g + 1]) for g in chunk_starts(schedule).tolist()]
    assert pairs == [("0F3", "3B1"), ("3F2", "0B0"), ("3F3", "0B1"), ("2F2", "1B0"), ("1F3", "2B1"), ("2F3", "1B1")]


# R = 2, m = 4, F = 1, B = 3, I = 2, W = 1 (ms), no overlap (a chunk takes F + B = 4), free links;
# [xFi+yBj] is a chunk. Worked by hand, each op at max(its rank free, its inputs' ends):
#   rank 1: 1F0 1-2, 2F0 2-3, 1F1 3-4, 2F1 4-5, 1F2 5-6, 2B0 6-9 (not a chunk: the last rank's
#           first pair), [2F2+1B0] 9-13, [1F3+2B1] 13-17, [2F3+1B1] 17-21, 2B2 21-24, 1B2 24-27,
#           2I3 28-30, 1I3 30-32, 2W3 32-33, 1W3 33-34
#   rank 0: 0F0 0-1, 0F1 1-2, 0F2 2-3, 3F0 3-4, 3I0 4-6, 3W0 6-7, 3F1 7-8, [0F3+3B1] 8-12,
#           [3F2+0B0] 13-17, 3B2 17-20, [3F3+0B1] 21-25, 3B3 25-28, 0I2 28-30, 0W2 30-31,
#           0I3 32-34, 0W3 34-35
# One minibatch takes 35. DualPipe's step() runs each minibatch apart, so minibatch k is that
# table shifted by 35 k: rank 0 starts it at its own end, and rank 1 (done at 34) waits for 0F0.
DUALPIPEV_MINIBATCH_MS = 35.0


@pytest.mark.parametrize("num_minibatches", [1, 2, 3])
def test_each_minibatch_runs_apart_as_dualpipes_step(num_minibatches: int) -> None:
    profile = uniform_profile(num_layers=4, forward_s=1e-3, backward_s=3e-3, backward_input_s=2e-3,
                              backward_weight_s=1e-3)
    result = simulate(profile, Topology.uniform(num_devices=2), schedule="dualpipev", num_stages=4,
                      num_microbatches=4, num_minibatches=num_minibatches, stages_per_rank=2)
    assert result.metrics.makespan_s == pytest.approx(num_minibatches * DUALPIPEV_MINIBATCH_MS * 1e-3, rel=1e-12)
    # Every minibatch leaves the last rank's first pair as two chunks, not only the first one.
    flat = [str(op) for ops in result.schedule.ranks for op in ops]
    last_rank = [(flat[g], flat[g + 1]) for g in chunk_starts(result.schedule).tolist()
                 if result.schedule.table.rank[g] == 1]
    expected = [(f"2F{2 + 4 * k}", f"1B{4 * k}") for k in range(num_minibatches)]
    assert last_rank[::3] == expected and ("1F6", "2B4") not in last_rank


def test_overlap_outside_its_range_names_the_field() -> None:
    with pytest.raises((ConfigError, ValueError), match="fb_overlap"):
        run(2, 4, f=1.0, b=2.0, w=1.0, overlap=1.5, chunks="dualpipe")
