"""Memory accounting: the byte events of a run, from the order in which its ops ended."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from pipesim.engine.columns import B_CODE, F_CODE, I_CODE, U_CODE, W_CODE
from pipesim.engine.lowering import Program
from pipesim.engine.trace import CATEGORIES, MEMORY_COLUMNS, TraceBuilder

WEIGHTS, GRADIENTS, OPTIMIZER, ACTIVATIONS = (CATEGORIES.index(c) for c in CATEGORIES)


def memory_columns(program: Program, end_s: npt.NDArray[np.float64]) -> dict[str, npt.NDArray[np.generic]]:
    """The memory events of a run whose op ``g`` (flat OpTable index) ended at ``end_s[g]``.

    At time 0 each stage holds one weight version, one gradient buffer and its optimizer state.
    An F's end stashes the stage's activation bytes for that microbatch; the B (or, split, the
    W) that ends it frees them. With STASH or DOUBLE_BUFFER weights a U's end adds the new
    version, and a version is freed once it is superseded and its last user has ended; FLUSH
    and SINGLE update in place. Events are in order of (end, rank, position), as both engines
    finish ops; the events of one op in the order stash, free, add version, free version.

    Which op frees what depends on the order alone: a stage lives on one rank, whose ops end
    in their order, so "the U of version v ended before v's last user" means "comes before it".
    """
    ops = program.ops
    schedule = program.schedule
    p = schedule.num_stages
    params = np.asarray(program.costs.param_bytes, dtype=np.float64)
    stash = np.asarray(program.costs.stash_bytes, dtype=np.float64)
    multiplier = float(program.meta["optimizer_state_multiplier"])
    stage_to_rank = np.asarray(schedule.stage_to_rank, dtype=np.int64)
    stages = np.arange(p, dtype=np.int64)

    frees_code = W_CODE if bool((ops.kind == I_CODE).any()) else B_CODE
    # One activation event per F (stash) and per freeing op, in flat order.
    g = np.flatnonzero((ops.kind == F_CODE) | (ops.kind == frees_code))
    stashing = ops.kind[g] == F_CODE
    category = np.full(g.size, ACTIVATIONS, np.int64)
    delta = np.where(stashing, 1.0, -1.0) * stash[ops.stage[g]]
    count = np.where(stashing, 1, -1).astype(np.int64)
    if program.keeps_versions and ops.num_ops:
        added, freed_at_update, freed_at_last_use = _version_events(program)
        g = np.concatenate([g, added, freed_at_update, freed_at_last_use])
        sub = np.concatenate([np.zeros(category.size, np.int64), np.full(added.size, 1, np.int64),
                              np.full(freed_at_update.size, 2, np.int64),
                              np.full(freed_at_last_use.size, 1, np.int64)])
        sign = np.concatenate([np.ones(added.size), -np.ones(freed_at_update.size + freed_at_last_use.size)])
        category = np.concatenate([category, np.full(sign.size, WEIGHTS, np.int64)])
        delta = np.concatenate([delta, sign * params[ops.stage[g[count.size:]]]])
        count = np.concatenate([count, sign.astype(np.int64)])
        flat_order = np.lexsort((sub, g))
        g, category, delta, count = g[flat_order], category[flat_order], delta[flat_order], count[flat_order]
    # Events are in flat order (rank, position, event within the op); a stable sort by end keeps it on ties.
    order = np.argsort(end_s[g], kind="stable")
    time = end_s[g][order]
    g = g[order]
    initial = 3 * p
    return {
        "time_s": np.concatenate([np.zeros(initial), time]),
        "device": np.concatenate([np.repeat(stage_to_rank, 3), ops.rank[g]]),
        "stage": np.concatenate([np.repeat(stages, 3), ops.stage[g]]),
        "category": np.concatenate([np.tile(np.array([WEIGHTS, GRADIENTS, OPTIMIZER], np.int64), p),
                                    category[order]]),
        "delta_bytes": np.concatenate([np.stack([params, params, params * multiplier], axis=1).reshape(-1),
                                       delta[order]]),
        "delta_count": np.concatenate([np.ones(initial, np.int64), count[order]]),
    }


def _version_events(program: Program) -> tuple[npt.NDArray[np.int64], ...]:
    """Flat indices of: every U (adds a version); the U that frees the version it supersedes
    (its last user came before it, or it has none); the last user that frees a version
    already superseded."""
    ops = program.ops
    updates = np.flatnonzero(ops.kind == U_CODE)
    users = np.flatnonzero(ops.kind != U_CODE)
    width = int(ops.version.max()) + 2
    last_user = np.full(program.schedule.num_stages * width, -1, dtype=np.int64)
    # Flat order within a stage is its rank's order: the largest index is the last user.
    np.maximum.at(last_user, ops.stage[users] * width + ops.version[users], users)
    update_key = ops.stage[updates] * width + ops.version[updates]
    last = last_user[update_key]
    freed_at_update = updates[last < updates]
    superseded = np.full(last_user.shape[0], -1, dtype=np.int64)
    superseded[update_key] = updates
    has_user = np.flatnonzero(last_user >= 0)
    update_of_user = superseded[has_user]
    late = (update_of_user >= 0) & (update_of_user < last_user[has_user])
    freed_at_last_use = last_user[has_user][late]
    return updates, freed_at_update, np.sort(freed_at_last_use)


def record_memory(program: Program, end_s: Sequence[Sequence[float]] | npt.NDArray[np.float64],
                  builder: TraceBuilder) -> None:
    """Add to ``builder`` the memory events of a run (see ``memory_columns``).

    Args:
        end_s: per rank, the end of each op in its order; or one flat array in OpTable order.
    """
    if isinstance(end_s, np.ndarray):
        flat = end_s.astype(np.float64, copy=False)
    else:
        flat = np.asarray([end for ends in end_s for end in ends], dtype=np.float64)
    columns = memory_columns(program, flat)
    for column in MEMORY_COLUMNS:
        builder.memory[column].extend(columns[column].tolist())
