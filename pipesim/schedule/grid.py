"""A schedule drawn one row per rank, with cells marked: how errors and the CLI show schedules."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipesim.schedule.ir import Op


def grid(
    ranks: tuple[tuple[Op, ...], ...] | list[list[str]],
    marked: set[tuple[int, int]] | None = None,
    *,
    max_cells: int = 48,
) -> str:
    """Draw a schedule one row per rank; cells in ``marked`` (rank, position) show as ``>0B3<``.

    Long rows are cut to a window of ``max_cells`` around the first marked cell.
    """
    marked = marked or set()
    rows: list[list[str]] = [[str(op) for op in ops] for ops in ranks]
    width = max((len(cell) for row in rows for cell in row), default=3) + 2
    first = min((position for _, position in marked), default=0)
    start = max(0, first - max_cells // 2)
    lines = []
    for rank_index, row in enumerate(rows):
        cells = []
        for position in range(start, min(len(row), start + max_cells)):
            text = row[position]
            if (rank_index, position) in marked:
                text = f">{text}<"
            cells.append(text.center(width))
        prefix = "..." if start > 0 else ""
        suffix = "..." if len(row) > start + max_cells else ""
        lines.append(f"rank {rank_index:>2} | {prefix}{''.join(cells).rstrip()}{suffix}")
    return "\n".join(lines)
