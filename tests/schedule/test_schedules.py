"""Literal schedule tables for the smallest cases, the text form, and the CSV round trip."""

from __future__ import annotations

import pytest

from pipesim.errors import ConfigError, ScheduleError
from pipesim.schedule import SCHEDULES, Op, OpKind, Schedule, build_schedule, from_csv, to_csv, validate


def rows(name: str, p: int, m: int, k: int = 1) -> list[str]:
    return [" ".join(cells) for cells in build_schedule(name, p, m, num_minibatches=k).to_text()]


def test_gpipe_p3_m3_table() -> None:
    assert rows("gpipe", 3, 3) == [
        "0F0 0F1 0F2 0B0 0B1 0B2 0U0",
        "1F0 1F1 1F2 1B0 1B1 1B2 1U0",
        "2F0 2F1 2F2 2B0 2B1 2B2 2U0",
    ]


def test_1f1b_p3_m4_table() -> None:
    # Warm-up of p-s-1 forwards, then F/B pairs, then the remaining backwards.
    assert rows("1f1b", 3, 4) == [
        "0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3 0U0",
        "1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3 1U0",
        "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3 2U0",
    ]


def test_1f1b_with_fewer_microbatches_than_stages() -> None:
    assert rows("1f1b", 3, 1) == ["0F0 0B0 0U0", "1F0 1B0 1U0", "2F0 2B0 2U0"]


def test_pipedream_p2_m3_two_minibatches_updates_after_every_backward() -> None:
    assert rows("pipedream", 2, 3, 2) == [
        "0F0 0F1 0B0 0U0 0F2 0B1 0U1 0F3 0B2 0U2 0F4 0B3 0U3 0F5 0B4 0U4 0B5 0U5",
        "1F0 1B0 1U0 1F1 1B1 1U1 1F2 1B2 1U2 1F3 1B3 1U3 1F4 1B4 1U4 1F5 1B5 1U5",
    ]


def test_2bw_p2_m3_two_minibatches_updates_once_per_minibatch() -> None:
    assert rows("2bw", 2, 3, 2) == [
        "0F0 0F1 0B0 0F2 0B1 0F3 0B2 0U0 0F4 0B3 0F5 0B4 0B5 0U1",
        "1F0 1B0 1F1 1B1 1F2 1B2 1U0 1F3 1B3 1F4 1B4 1F5 1B5 1U1",
    ]


def test_pipemare_has_the_2bw_order_and_a_per_microbatch_option() -> None:
    assert rows("pipemare", 2, 3, 2) == rows("2bw", 2, 3, 2)
    per_micro = build_schedule("pipemare", 2, 3, num_minibatches=1, update="microbatch")
    assert [str(op) for op in per_micro.ranks[1]] == ["1F0", "1B0", "1U0", "1F1", "1B1", "1U1", "1F2", "1B2", "1U2"]


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_every_generated_schedule_validates(name: str) -> None:
    for p in range(1, 6):
        for m in range(p, p + 4):
            if name.startswith("interleaved") and m % max(1, m // p):
                continue  # m must split into whole rounds of max(1, m // p), as in torch
            if name in ("zbv", "dualpipev"):  # exactly two stages per rank, in a V
                validate(build_schedule(name, 2 * p, max(m, 2 * p), num_ranks=p, num_minibatches=3))
            else:
                validate(build_schedule(name, p, m, num_minibatches=3))


def test_text_form_round_trips() -> None:
    for text in ("0F0", "12B345", "3I2", "3W2", "0U7"):
        assert str(Op.parse(text)) == text
    assert Op.parse("2F5") == Op(2, OpKind.F, 5)


@pytest.mark.parametrize("text", ["", "F0", "0X1", "1F", "-1F0", "0F0 junk"])
def test_text_form_rejects_garbage(text: str) -> None:
    with pytest.raises(ConfigError, match="op="):
        Op.parse(text)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_csv_round_trip_is_exact(name: str) -> None:
    schedule = build_schedule(name, 4, 6)
    text = to_csv(schedule, include_updates=True)
    again = from_csv(text, name=name, num_microbatches=6)
    assert again.ranks == schedule.ranks
    assert to_csv(again, include_updates=True) == text
    # PyTorch's format has no U action: by default the cells are compute ops only.
    assert "U" not in to_csv(schedule)


def test_csv_rejects_a_stage_on_two_ranks() -> None:
    with pytest.raises(ConfigError, match="row 2 column 1"):
        from_csv("0F0,0B0\n0F1,0B1\n")


def test_2bw_needs_m_at_least_p() -> None:
    with pytest.raises(ConfigError, match="num_microbatches=3: must be >= num_stages for 2bw, got 3 < 4"):
        build_schedule("2bw", 4, 3)


def test_unknown_schedule_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="known: gpipe, 1f1b, pipedream, 2bw, pipemare"):
        build_schedule("zb", 2, 2)


def test_deadlock_is_reported_with_the_grid_marked() -> None:
    schedule = build_schedule("1f1b", 3, 3)
    rank0 = schedule.ranks[0]
    # 0B0 moved before 0F1: it waits for 1B0, which 1F1 (waiting for 0F1) keeps from running.
    broken = (rank0[0], rank0[3], rank0[1], rank0[2], *rank0[4:])
    with pytest.raises(ScheduleError) as info:
        validate(Schedule.from_ranks(schedule.name, 3, 3, 1, (broken, *schedule.ranks[1:]), schedule.stage_to_rank))
    assert "deadlock" in str(info.value)
    assert ">0B0<" in info.value.grid
