"""pipesim's multi-stage schedules against the orders torch 2.13's pipelining runtime executes."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import pytest

from pipesim.errors import ConfigError
from pipesim.schedule import build_schedule, validate

torch = pytest.importorskip("torch")
schedules = pytest.importorskip("torch.distributed.pipelining.schedules")

pytestmark = pytest.mark.torch

TORCH_CLASSES = {
    "interleaved-1f1b": "ScheduleInterleaved1F1B",
    "looped-bfs": "ScheduleLoopedBFS",
    "interleaved-zb": "ScheduleInterleavedZeroBubble",
    "zbv": "ScheduleZBVZeroBubble",
    "dualpipev": "ScheduleDualPipeV",
}
RANKS = (2, 3, 4, 8)
MICROBATCHES = (1, 2, 4, 8, 16)
# Stages per rank: torch accepts 1-4 for the loop-placed schedules and exactly 2 for the V ones;
# 1 and 3 are in the V grid to check that both sides reject them.
STAGES_PER_RANK = {"interleaved-1f1b": (1, 2, 3, 4), "looped-bfs": (1, 2, 3, 4), "interleaved-zb": (1, 2, 3, 4),
                   "zbv": (1, 2, 3), "dualpipev": (1, 2, 3)}


@dataclass
class StageStub:
    """What a multi-stage schedule's constructor reads from its stages, and nothing else: the
    pipeline's size, this process's rank, the number of stages, and the submodule (checked
    for torch.compile). Building the order needs no process group and no model."""

    group_size: int
    num_stages: int
    group_rank: int = 0
    submod: Any = None
    stage_index_to_group_rank: dict[int, int] = field(default_factory=dict)


def torch_order(name: str, num_ranks: int, stages_per_rank: int, num_microbatches: int) -> list[list[str]] | str:
    """Per rank, the compute actions torch executes (OVERLAP_F_B expanded into its F and B, as
    the runtime runs them), with REDUCE_GRAD written as pipesim's U; or torch's error text."""
    cls = getattr(schedules, TORCH_CLASSES[name])
    stages = [StageStub(group_size=num_ranks, num_stages=num_ranks * stages_per_rank) for _ in range(stages_per_rank)]
    logging.disable(logging.WARNING)
    try:
        schedule = cls(stages, num_microbatches)
    except ValueError as exc:
        return str(exc)
    finally:
        logging.disable(logging.NOTSET)
    rows = []
    for rank in range(num_ranks):
        row = []
        for action in schedule.pipeline_order_with_comms[rank]:
            if action.sub_actions is not None:
                row += [str(sub) for sub in action.sub_actions]
            elif action.computation_type == schedules.REDUCE_GRAD:
                row.append(f"{action.stage_index}U0")
            elif action.is_compute_op:
                row.append(str(action))
        rows.append(row)
    return rows


def grid() -> list[tuple[str, int, int, int]]:
    return [(name, r, v, m) for name in TORCH_CLASSES for r in RANKS for v in STAGES_PER_RANK[name] for m in MICROBATCHES]


@pytest.mark.parametrize("name", sorted(TORCH_CLASSES))
def test_orders_equal_torch_executed_orders(name: str) -> None:
    compared = rejected = 0
    for _, r, v, m in [case for case in grid() if case[0] == name]:
        expected = torch_order(name, r, v, m)
        try:
            schedule = build_schedule(name, r * v, m, num_ranks=r)
        except ConfigError as exc:
            assert isinstance(expected, str), f"{name} R={r} V={v} m={m}: pipesim rejects ({exc}), torch accepts"
            rejected += 1
            continue
        assert not isinstance(expected, str), f"{name} R={r} V={v} m={m}: torch rejects ({expected}), pipesim accepts"
        validate(schedule)
        assert schedule.to_text() == expected, f"{name} R={r} V={v} m={m}"
        compared += 1
    assert compared >= 8
    if name in ("zbv", "dualpipev"):
        assert rejected > 0


def test_rejections_name_the_rule_torch_applies() -> None:
    assert "multiple of the number of rounds (5)" in str(torch_order("interleaved-1f1b", 3, 2, 16))
    with pytest.raises(ConfigError, match=r"num_microbatches=16: interleaved-1f1b needs a multiple of its number "
                                          r"of rounds max\(1, m // num_ranks\) = 5"):
        build_schedule("interleaved-1f1b", 6, 16, num_ranks=3)
    assert "exactly 2 stages per rank" in str(torch_order("zbv", 2, 3, 4))
    with pytest.raises(ConfigError, match="stages_per_rank=3: zbv needs exactly 2 stages per rank"):
        build_schedule("zbv", 6, 4, num_ranks=2)
    assert "at least as many microbatches as stages" in str(torch_order("dualpipev", 4, 2, 4))
    with pytest.raises(ConfigError, match="num_microbatches=4: must be >= the number of stages for dualpipev"):
        build_schedule("dualpipev", 8, 4, num_ranks=4)


def test_a_csv_written_by_torch_simulates_like_the_named_schedule(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pipesim import Topology, simulate, uniform_profile
    from pipesim.schedule.csv_format import from_csv
    from pipesim.simulation import simulate_schedule

    # torch's default "compute_comms" CSV (UNSHARD, SEND_F, ... cells) and DualPipeV's OVERLAP_F_B
    # cells need from_csv to read torch's other actions (issue 3); compute-only CSVs of these don't.
    for name, r, v, m in (("interleaved-zb", 4, 2, 8), ("interleaved-1f1b", 2, 3, 4), ("zbv", 3, 2, 6)):
        cls = getattr(schedules, TORCH_CLASSES[name])
        path = tmp_path / f"{name}.csv"
        cls([StageStub(group_size=r, num_stages=r * v) for _ in range(v)], m)._dump_csv(str(path), "compute_only")
        profile = uniform_profile(num_layers=r * v, forward_s=1e-3, backward_s=2e-3, backward_input_s=1e-3,
                                  backward_weight_s=1e-3, activation_bytes=1e6)
        topology = Topology.uniform(num_devices=r, bandwidth="10GB/s", latency="5us")
        read = simulate_schedule(profile, topology, from_csv(path.read_text(), num_microbatches=m))
        named = simulate(profile, topology, schedule=name, num_stages=r * v, num_microbatches=m, stages_per_rank=v)
        assert read.metrics.makespan_s == named.metrics.makespan_s, name


def test_dualpipev_chunks_are_torchs_overlap_pairs() -> None:
    # engine/chunks.py times as one overlapped chunk exactly the (F, B) pairs torch's
    # ScheduleDualPipeV emits as OVERLAP_F_B actions (DualPipe's _forward_backward_chunk).
    from pipesim.engine.chunks import chunk_starts

    for r in RANKS:
        for m in (2 * r, 2 * r + 1, 3 * r + 2):
            stages = [StageStub(group_size=r, num_stages=2 * r) for _ in range(2)]
            torch_schedule = schedules.ScheduleDualPipeV(stages, m)
            expected = [(str(action.sub_actions[0]), str(action.sub_actions[1]))
                        for rank in range(r) for action in torch_schedule.pipeline_order_with_comms[rank]
                        if action.sub_actions is not None]
            schedule = build_schedule("dualpipev", 2 * r, m, num_ranks=r)
            flat = [str(op) for ops in schedule.ranks for op in ops]
            pairs = [(flat[g], flat[g + 1]) for g in chunk_starts(schedule).tolist()]
            assert pairs == expected, (r, m)
            assert len(pairs) > 0
