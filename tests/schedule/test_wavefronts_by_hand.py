"""The golden wavefront files against expectations that do not come from the code that writes them:
every table against the wavefront rule worked out here, the smallest table of each 1F1B-family and
ZB-H2 schedule drawn by hand, and the multi-stage and ZB-H1 orders against torch's. A golden refresh
(``PIPESIM_REGEN_GOLDEN=1``) that changed an order or a dependency would fail here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "wavefronts"
OP = re.compile(r"(\d+)([FBIWU])(\d+)")
Table = list[list[tuple[str, int]]]  # per rank, each op's text and its column


def tables(name: str) -> dict[str, Table]:
    """The tables of ``name``'s golden file by heading (``"p=2 m=3 K=1"``), each cell read back
    from the column it is drawn in."""
    text = (GOLDEN / f"{name}.txt").read_text(encoding="utf-8")
    found: dict[str, Table] = {}
    for block in text.split("\n## ")[1:]:
        heading, *lines = block.strip("\n").splitlines()
        contents = [line.split(" | ", 1)[1] if " | " in line else "" for line in lines]
        width = max(len(cell) for content in contents for cell in content.split()) + 1
        found[heading] = [[(content[at: at + width].strip(), at // width) for at in range(0, len(content), width)
                           if content[at: at + width].strip()] for content in contents]
    return found


def needs(op: str, present: set[str], num_stages: int) -> list[str]:
    """What an op waits for: an F the previous stage's F; a B or I the gradient from the next stage
    (its B, or its I where the backward is split) or, on the last stage, its own F; a W its I.
    A U waits for nothing but the op before it on its rank."""
    stage_text, kind, micro = OP.fullmatch(op).groups()  # type: ignore[union-attr]
    stage = int(stage_text)
    if kind == "F":
        return [f"{stage - 1}F{micro}"] if stage > 0 else []
    if kind in "BI":
        if stage == num_stages - 1:
            return [f"{stage}F{micro}"]
        gradient = f"{stage + 1}B{micro}"
        return [gradient if gradient in present else f"{stage + 1}I{micro}"]
    return [f"{stage}I{micro}"] if kind == "W" else []


def columns_by_the_rule(rows: list[list[str]], num_stages: int) -> list[list[int]]:
    """Each op's step when every op takes one step, after the op before it on its rank and after
    every op it needs: rank by rank, as far as each can go, until no rank moves."""
    present = {op for row in rows for op in row}
    step: dict[str, int] = {}
    placed: list[list[int]] = [[] for _ in rows]
    moved = True
    while moved:
        moved = False
        for rank, row in enumerate(rows):
            while len(placed[rank]) < len(row):
                op = row[len(placed[rank])]
                if any(dep not in step for dep in needs(op, present, num_stages)):
                    break
                step[op] = max([placed[rank][-1] + 1 if placed[rank] else 0,
                                *(step[dep] + 1 for dep in needs(op, present, num_stages))])
                placed[rank].append(step[op])
                moved = True
    assert all(len(done) == len(row) for done, row in zip(placed, rows, strict=True)), "the order deadlocks"
    return placed


NAMES = sorted(path.stem for path in GOLDEN.glob("*.txt"))


@pytest.mark.parametrize("name", NAMES)
def test_every_golden_table_places_its_ops_by_the_wavefront_rule(name: str) -> None:
    found = tables(name)
    assert found
    for heading, table in found.items():
        num_stages = int(heading.split()[0].removeprefix("p="))
        rows = [[op for op, _ in row] for row in table]
        drawn = [[column for _, column in row] for row in table]
        assert drawn == columns_by_the_rule(rows, num_stages), f"{name} {heading}"


# The smallest table of each schedule without torch's order to compare with, worked out by hand.
HAND_DRAWN = {
    # p=2, m=3. Stage 0 warms up with p-s-1 = 1 forward, then pairs F(i+1) B(i), then B2; stage 1
    # has no warm-up. 0B0 waits for 1B0 (step 2), so it runs at 3, leaving step 2 idle; 0B2 waits
    # for 1B2 (6), leaving 6 idle.
    "1f1b": ("p=2 m=3 K=1", ["rank 0 | 0F0 0F1     0B0 0F2 0B1     0B2 0U0",
                             "rank 1 |     1F0 1B0 1F1 1B1 1F2 1B2 1U0"]),
    # K=2: one stream of 6 microbatches in 1F1B order, a U after every backward. Every later
    # forward of stage 1 waits for its own U, so the ranks interlock without a gap until 0B5
    # waits for 1B5 (step 17).
    "pipedream": ("p=2 m=3 K=2", [
        "rank 0 | 0F0 0F1     0B0 0U0 0F2 0B1 0U1 0F3 0B2 0U2 0F4 0B3 0U3 0F5 0B4 0U4     0B5 0U5",
        "rank 1 |     1F0 1B0 1U0 1F1 1B1 1U1 1F2 1B2 1U2 1F3 1B3 1U3 1F4 1B4 1U4 1F5 1B5 1U5"]),
    # K=2: 6 microbatches in 1F1B order, a U after every m = 3 backwards (no flush between them).
    "2bw": ("p=2 m=3 K=2", ["rank 0 | 0F0 0F1     0B0 0F2 0B1 0F3 0B2 0U0 0F4 0B3 0F5 0B4     0B5 0U1",
                            "rank 1 |     1F0 1B0 1F1 1B1 1F2 1B2 1U0 1F3 1B3 1F4 1B4 1F5 1B5 1U1"]),
    # PipeMare runs 2BW's order; only the weights differ.
    "pipemare": ("p=2 m=3 K=2", ["rank 0 | 0F0 0F1     0B0 0F2 0B1 0F3 0B2 0U0 0F4 0B3 0F5 0B4     0B5 0U1",
                                 "rank 1 |     1F0 1B0 1F1 1B1 1F2 1B2 1U0 1F3 1B3 1F4 1B4 1F5 1B5 1U1"]),
    # ZB-H2 (Qi et al. 2024): stage s warms up with 2(p-1-s) forwards and runs each W 2s behind its
    # I: stage 0 is F0 F1 F2 then I W pairs; stage 1 pairs F I and leaves its W's to the end. No
    # stage waits after its start: the zero bubble.
    "zb-h2": ("p=2 m=3 K=1", ["rank 0 | 0F0 0F1 0F2 0I0 0W0 0I1 0W1 0I2 0W2 0U0",
                              "rank 1 |     1F0 1I0 1F1 1I1 1F2 1I2 1W0 1W1 1W2 1U0"]),
}


@pytest.mark.parametrize("name", sorted(HAND_DRAWN))
def test_the_smallest_golden_table_is_the_one_drawn_by_hand(name: str) -> None:
    heading, lines = HAND_DRAWN[name]
    text = (GOLDEN / f"{name}.txt").read_text(encoding="utf-8")
    assert text.split(f"## {heading}\n")[1].split("\n\n")[0].splitlines() == lines


@pytest.mark.parametrize("name", ["zb-h1", "zb-auto"])
def test_zero_bubble_tables_last_zb_h1s_closed_form(name: str) -> None:
    # ZB-H1's iteration time is m(tF + tI + tW) + (p - 1)(tF + tI - tW) (Qi et al. 2024, section
    # 2.2): 3m + p - 1 steps when every op takes one, and the U one step more. zb-auto's heuristic,
    # on stages this alike and under ZB-H1's memory limit, reaches the same and no better.
    for heading, table in tables(name).items():
        fields = dict(item.split("=") for item in heading.split())
        p, m = int(fields["p"]), int(fields["m"])
        assert max(column for row in table for _, column in row) + 1 == 3 * m + p - 1 + 1, f"{name} {heading}"


# Schedules whose order torch's pipelining runtime builds: per golden table, torch's class and
# stages per rank (ZB-H1 is torch's interleaved zero bubble on one stage per rank).
TORCH = {"interleaved-1f1b": "interleaved-1f1b", "looped-bfs": "looped-bfs", "interleaved-zb": "interleaved-zb",
         "zbv": "zbv", "dualpipev": "dualpipev", "zb-h1": "interleaved-zb"}


@pytest.mark.parametrize("name", sorted(TORCH))
def test_golden_orders_are_the_orders_torch_runs(name: str) -> None:
    pytest.importorskip("torch.distributed.pipelining.schedules")
    from test_torch_orders import torch_order  # noqa: PLC0415 - it needs torch

    for heading, table in tables(name).items():
        fields = dict(item.split("=") for item in heading.split())
        p, m = int(fields["p"]), int(fields["m"])
        ranks = int(fields.get("num_ranks", p))
        expected = torch_order(TORCH[name], ranks, p // ranks, m)
        assert [[op for op, _ in row] for row in table] == expected, f"{name} {heading}"
