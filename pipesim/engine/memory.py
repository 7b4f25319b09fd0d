"""Memory accounting: the byte events of a run, from the order in which its ops ended."""

from __future__ import annotations

from collections.abc import Sequence

from pipesim.engine.lowering import Program
from pipesim.engine.trace import CATEGORIES, TraceBuilder
from pipesim.schedule.ir import OpKind

WEIGHTS, GRADIENTS, OPTIMIZER, ACTIVATIONS = (CATEGORIES.index(c) for c in CATEGORIES)


def record_memory(program: Program, end_s: Sequence[Sequence[float]], builder: TraceBuilder) -> None:
    """Add the memory events of a run whose op ``j`` on rank ``r`` ended at ``end_s[r][j]``.

    At time 0 each stage holds one weight version, one gradient buffer and its optimizer state.
    An F's end stashes the stage's activation bytes for that microbatch and a B's end frees
    them. With split backward, W frees what I keeps: I's end frees the stash and keeps the
    stage's weight-stash bytes (what W still needs; re-materialized when the stage recomputes),
    and W's end frees those; the microbatch counts as held from F's end to W's end. With STASH
    or DOUBLE_BUFFER weights a U's end adds the new version, and a version is freed once it is
    superseded and its last user has ended; FLUSH and SINGLE update in place. Ops are taken in
    order of (end, rank, position), as both engines finish them.
    """
    meta = program.meta
    params = program.costs.param_bytes
    stash = program.costs.stash_bytes
    kept = program.costs.weight_stash_bytes or stash
    multiplier = float(meta["optimizer_state_multiplier"])
    schedule = program.schedule
    for stage in range(schedule.num_stages):
        device = schedule.stage_to_rank[stage]
        builder.memory_event(0.0, device, stage, WEIGHTS, params[stage], 1)
        builder.memory_event(0.0, device, stage, GRADIENTS, params[stage], 1)
        builder.memory_event(0.0, device, stage, OPTIMIZER, params[stage] * multiplier, 1)
    order = sorted(
        (end, rank_index, position)
        for rank_index, ends in enumerate(end_s)
        for position, end in enumerate(ends)
    )
    last_use = program.versions.last_use
    latest = [0] * schedule.num_stages
    ended_last_use: set[tuple[int, int]] = set()
    for end, rank_index, position in order:
        lowered = program.ranks[rank_index][position]
        op = lowered.op
        stage = op.stage
        kind = op.kind
        if kind is OpKind.F:
            builder.memory_event(end, rank_index, stage, ACTIVATIONS, stash[stage], 1)
        elif kind is OpKind.B:
            builder.memory_event(end, rank_index, stage, ACTIVATIONS, -stash[stage], -1)
        elif kind is OpKind.I and kept[stage] != stash[stage]:
            builder.memory_event(end, rank_index, stage, ACTIVATIONS, kept[stage] - stash[stage], 0)
        elif kind is OpKind.W:
            builder.memory_event(end, rank_index, stage, ACTIVATIONS, -kept[stage], -1)
        if not program.keeps_versions:
            continue
        if kind is OpKind.U:
            old = lowered.version
            latest[stage] = old + 1
            builder.memory_event(end, rank_index, stage, WEIGHTS, params[stage], 1)
            if (stage, old) in ended_last_use or (stage, old) not in last_use:
                builder.memory_event(end, rank_index, stage, WEIGHTS, -params[stage], -1)
        elif last_use.get((stage, lowered.version)) == op:
            ended_last_use.add((stage, lowered.version))
            if lowered.version < latest[stage]:
                builder.memory_event(end, rank_index, stage, WEIGHTS, -params[stage], -1)
