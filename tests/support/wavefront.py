"""The wavefront drawing of a schedule: every op in the column of its step when each op takes one step."""

from __future__ import annotations

from pipesim.errors import ScheduleError
from pipesim.schedule.deps import dependencies, gradient_kind, split_backwards
from pipesim.schedule.ir import Op, Schedule, grid


def wavefront_columns(schedule: Schedule) -> tuple[tuple[int, ...], ...]:
    """Per rank, the column (step) of each op when every op, U included, takes one step.

    An op runs one step after the op before it on its rank and one step after each op it
    needs (communication is free), as early as that allows::

        gpipe, p = 2, m = 2:   0F0 0F1         0B0 0B1 0U0
                                   1F0 1F1 1B0 1B1 1U0

    Raises:
        ScheduleError: the order deadlocks, so some op never gets a column.
    """
    grad_kind = gradient_kind(schedule)
    split = split_backwards(schedule)
    column_of: dict[Op, int] = {}
    columns: list[list[int]] = [[] for _ in schedule.ranks]
    progressed = True
    while progressed:
        progressed = False
        for rank_index, ops in enumerate(schedule.ranks):
            row = columns[rank_index]
            while len(row) < len(ops):
                op = ops[len(row)]
                needs = dependencies(op, schedule.num_stages, grad_kind, split=split)
                if any(dep not in column_of for dep in needs):
                    break
                column = max([row[-1] + 1 if row else 0, *(column_of[dep] + 1 for dep in needs)])
                column_of[op] = column
                row.append(column)
                progressed = True
    if any(len(row) < len(ops) for row, ops in zip(columns, schedule.ranks, strict=True)):
        marked = {(r, len(row)) for r, row in enumerate(columns) if len(row) < len(schedule.ranks[r])}
        raise ScheduleError("the order deadlocks: no wavefront", grid(schedule.ranks, marked))
    return tuple(tuple(row) for row in columns)


def draw_wavefront(schedule: Schedule) -> str:
    """One line per rank, ``"rank r | "`` then each op's text in its wavefront column (blank: idle).

    Raises:
        ScheduleError: the order deadlocks.
    """
    columns = wavefront_columns(schedule)
    width = max((len(str(op)) for ops in schedule.ranks for op in ops), default=3) + 1
    lines = []
    for rank_index, (ops, row) in enumerate(zip(schedule.ranks, columns, strict=True)):
        cells = [" " * width] * (max(row, default=-1) + 1)
        for op, column in zip(ops, row, strict=True):
            cells[column] = str(op).ljust(width)
        lines.append(f"rank {rank_index} | {''.join(cells)}".rstrip())
    return "\n".join(lines)
