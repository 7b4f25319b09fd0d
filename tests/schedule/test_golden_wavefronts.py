"""Golden wavefront tables of every schedule for the smallest cases (p = 2..3, m = 3..4; the
schedules with several stages per rank on R = 2..3 ranks of 2 stages).

The files under tests/golden/wavefronts/ change only on purpose: run
``PIPESIM_REGEN_GOLDEN=1 pytest tests/schedule/test_golden_wavefronts.py`` and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from pipesim.schedule.registry import SCHEDULES, build_schedule, default_num_minibatches
from wavefront import draw_wavefront
from pipesim.spec.files import write_text_atomic

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "wavefronts"
REGENERATE = os.environ.get("PIPESIM_REGEN_GOLDEN") == "1"

# Asynchronous schedules run 2 minibatches, enough to show one crossing into the next.
VARIANTS: dict[str, list[dict[str, Any]]] = {name: [{}] for name in SCHEDULES}
VARIANTS["pipemare"].append({"update": "microbatch"})
# Schedules with several stages per rank: drawn on R ranks of two stages each.
MULTI_STAGE = ("interleaved-1f1b", "looped-bfs", "interleaved-zb", "zbv", "dualpipev")


def shapes(name: str) -> list[tuple[int, int, dict[str, Any]]]:
    """``(num_stages, num_microbatches, extra options)`` of the tables drawn for ``name``."""
    if name not in MULTI_STAGE:
        return [(p, m, {}) for p in (2, 3) for m in (3, 4)]
    # DualPipeV needs m >= its number of stages.
    return [(2 * r, m, {"num_ranks": r}) for r in (2, 3)
            for m in ((2 * r, 2 * r + 1) if name == "dualpipev" else (3, 4))]


def render(name: str) -> str:
    k = min(2, default_num_minibatches(name))
    lines = [
        f"# Wavefront tables of {name!r} (tests/schedule/test_golden_wavefronts.py; regenerate with PIPESIM_REGEN_GOLDEN=1).",
        "# Every op, U included, takes one step after the op before it and the ops it needs; blanks are idle.",
    ]
    for options in VARIANTS[name]:
        for p, m, extra in shapes(name):
            shown = "".join(f" {key}={value}" for key, value in {**extra, **options}.items())
            lines += ["", f"## p={p} m={m} K={k}{shown}"]
            lines.append(draw_wavefront(build_schedule(name, p, m, num_minibatches=k, **extra, **options)))
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_wavefront_matches_the_golden_table(name: str) -> None:
    path = GOLDEN / f"{name}.txt"
    text = render(name)
    if REGENERATE:
        write_text_atomic(path, text)
        pytest.skip(f"regenerated {path}")
    assert path.exists(), f"{path} is missing: run PIPESIM_REGEN_GOLDEN=1 pytest {__file__}"
    assert text == path.read_text(encoding="utf-8")


def test_gpipe_golden_table_reads_as_the_drawn_wavefront() -> None:
    # The first table, spelled out: forwards fill diagonally, backwards drain back.
    table = (GOLDEN / "gpipe.txt").read_text(encoding="utf-8").split("## p=2 m=3 K=1\n")[1].split("\n\n")[0]
    assert table.splitlines() == [
        "rank 0 | 0F0 0F1 0F2         0B0 0B1 0B2 0U0",
        "rank 1 |     1F0 1F1 1F2 1B0 1B1 1B2 1U0",
    ]
