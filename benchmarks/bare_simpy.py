"""The bare SimPy loop the engines are measured against: one process per rank, a timeout per op."""

from __future__ import annotations

from typing import Any

import simpy


def bare_simpy_loop(num_ranks: int, ops_per_rank: int) -> simpy.Environment:
    """An environment holding the loop, not yet run (``env.run()`` runs it)."""
    env = simpy.Environment()

    def rank() -> Any:
        for _ in range(ops_per_rank):
            yield env.timeout(1e-3)

    for _ in range(num_ranks):
        env.process(rank())
    return env
