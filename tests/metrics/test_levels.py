"""The memory levels kernel against its definition: per group, a cumulative sum down a table of
the group's events (one column per category), read after the last event of each instant."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipesim import jit
from pipesim.engine.trace import CATEGORIES
from pipesim.metrics.kernels import _levels

EVENT = st.tuples(st.integers(0, 2), st.integers(0, 3), st.integers(0, len(CATEGORIES) - 1),
                  st.sampled_from([-0.0, 0.0, 1.0, -1.0, 2.5, -2.5, 1e300]), st.integers(-1, 1))


def by_definition(events: list[tuple[int, int, int, float, int]], num_groups: int) -> list[tuple[str, ...]]:
    """Per group: peak, breakdown at the peak, most versions and microbatches held (floats as hex)."""
    found = []
    for group in range(num_groups):
        rows = [e for e in events if e[0] == group]
        table = np.zeros((len(rows), len(CATEGORIES)))
        counts = np.zeros((len(rows), len(CATEGORIES)), dtype=np.int64)
        for r, (_, _, category, delta, count) in enumerate(rows):
            table[r, category], counts[r, category] = delta, count
        levels, held = np.cumsum(table, axis=0), np.cumsum(counts, axis=0)
        peak, breakdown, versions, inflight = 0.0, [0.0] * len(CATEGORIES), 0, 0
        for r in range(len(rows)):
            if r + 1 < len(rows) and rows[r + 1][1] == rows[r][1]:
                continue  # not the instant's last event
            total = 0.0
            for value in levels[r]:
                total += float(value)
            first = r == min(i for i in range(len(rows)) if i + 1 == len(rows) or rows[i + 1][1] != rows[i][1])
            if first or total > peak:
                peak, breakdown = total, levels[r].tolist()
            versions = int(held[r, CATEGORIES.index("weights")]) if first else \
                max(versions, int(held[r, CATEGORIES.index("weights")]))
            inflight = int(held[r, CATEGORIES.index("activations")]) if first else \
                max(inflight, int(held[r, CATEGORIES.index("activations")]))
        found.append((peak.hex(), *(float(v).hex() for v in breakdown), str(versions), str(inflight)))
    return found


@pytest.mark.parametrize("compiled", [False, True])
@given(st.lists(EVENT, max_size=24))
def test_levels_are_the_cumulative_sums_read_after_each_instant(compiled: bool,
                                                                events: list[tuple[int, int, int, float, int]]) -> None:
    events = sorted(events, key=lambda e: e[1])  # in time order, ties as drawn
    num_groups = 3
    keys, time, category, delta, count = (np.array([e[i] for e in events], dtype=dtype) for i, dtype in
                                          enumerate((np.int64, np.float64, np.int64, np.float64, np.int64)))
    peaks, breakdown, versions, inflight, in_order = jit.pick(_levels, compiled and jit.AVAILABLE)(
        keys.reshape(-1), time.reshape(-1), category.reshape(-1), delta.reshape(-1), count.reshape(-1), num_groups)
    assert in_order
    got = [(float(peaks[g]).hex(), *(float(v).hex() for v in breakdown[g]), str(versions[g]), str(inflight[g]))
           for g in range(num_groups)]
    assert got == by_definition(events, num_groups)


def test_events_out_of_time_order_are_reported() -> None:
    keys, category, count = np.zeros(3, np.int64), np.zeros(3, np.int64), np.ones(3, np.int64)
    assert not _levels(keys, np.array([0.0, 2.0, 1.0]), category, np.ones(3), count, 1)[4]
