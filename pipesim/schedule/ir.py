"""The schedule IR: op kinds, ops in the "1F0" text form, and a schedule as per-rank op order."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from functools import cached_property

from pipesim.errors import ConfigError


class OpKind(enum.Enum):
    """What an op does, roughly.

    F: forward of one microbatch on one stage.
    B: full backward (inputs and weights) of one microbatch.
    I: backward for inputs only (split backward); sends the gradient upstream.
    W: backward for weights only (split backward); needs the I of the same microbatch.
    U: optimizer update of one stage; bumps the stage's weight version. Its number is the
       update's index on that stage, not a microbatch.
    """

    F = "F"
    B = "B"
    I = "I"  # noqa: E741 - the field's established letter
    W = "W"
    U = "U"


# Op kinds in code order: the integer ``kind`` column of op tables, traces and metrics indexes this.
KIND_ORDER = (OpKind.F, OpKind.B, OpKind.I, OpKind.W, OpKind.U)
KIND_CODES = {kind: code for code, kind in enumerate(KIND_ORDER)}
F_CODE, B_CODE, I_CODE, W_CODE, U_CODE = range(len(KIND_ORDER))


class WeightPolicy(enum.Enum):
    """How a schedule keeps and picks weight versions (DESIGN.md section 2).

    FLUSH: one version; every F and B of a minibatch see the same one (gpipe, 1f1b).
    STASH: a B uses exactly the version its F used; old versions kept while referenced (pipedream).
    DOUBLE_BUFFER: minibatch t runs on version max(0, t-1); at most two versions live (2bw).
    SINGLE: one version; F and B each use whatever is current when they run (pipemare).
    """

    FLUSH = "flush"
    STASH = "stash"
    DOUBLE_BUFFER = "double_buffer"
    SINGLE = "single"


_OP_TEXT = re.compile(r"(\d+)([FBIWU])(\d+)")


@dataclass(frozen=True, slots=True)
class Op:
    """One op: ``stage``, ``kind`` and ``microbatch`` (the update index for U), text ``"2F5"``."""

    stage: int
    kind: OpKind
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind.value}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> Op:
        """Parse ``"<stage><kind><microbatch>"``, e.g. ``"0B3"``.

        Raises:
            ConfigError: the text is not of that form.
        """
        match = _OP_TEXT.fullmatch(text.strip())
        if match is None:
            raise ConfigError("op", text, 'must look like "<stage><F|B|I|W|U><microbatch>", e.g. "1F0"')
        stage, kind, microbatch = match.groups()
        return cls(int(stage), OpKind(kind), int(microbatch))


def F(stage: int, microbatch: int) -> Op:  # noqa: N802 - reads like the text form
    """Forward op."""
    return Op(stage, OpKind.F, microbatch)


def B(stage: int, microbatch: int) -> Op:  # noqa: N802
    """Full backward op."""
    return Op(stage, OpKind.B, microbatch)


def U(stage: int, update_index: int) -> Op:  # noqa: N802
    """Optimizer update op."""
    return Op(stage, OpKind.U, update_index)


@dataclass(frozen=True)
class Schedule:
    """The order of ops on every rank. Order only: time comes from an engine.

    Attributes:
        name: registry key that made it (or ``"custom"``).
        num_stages: model stages.
        num_microbatches: microbatches per minibatch.
        num_minibatches: minibatches; microbatch indices run over ``num_minibatches * num_microbatches``.
        ranks: per rank, its ops in execution order.
        stage_to_rank: the rank that holds each stage.
        weights: the weight-version policy.
    """

    name: str
    num_stages: int
    num_microbatches: int
    num_minibatches: int
    ranks: tuple[tuple[Op, ...], ...]
    stage_to_rank: tuple[int, ...]
    weights: WeightPolicy = WeightPolicy.FLUSH

    @property
    def num_ranks(self) -> int:
        """Number of ranks (devices)."""
        return len(self.ranks)

    def __repr__(self) -> str:
        return (f"<Schedule {self.name}: {self.num_stages} stages on {self.num_ranks} ranks, m={self.num_microbatches}, "
                f"K={self.num_minibatches}, {self.weights.value} weights>")

    @property
    def total_microbatches(self) -> int:
        """Microbatches over all minibatches."""
        return self.num_minibatches * self.num_microbatches

    @cached_property
    def num_ops(self) -> int:
        """Ops over all ranks."""
        return sum(len(ops) for ops in self.ranks)

    def minibatch_of(self, microbatch: int) -> int:
        """Minibatch index of a (global) microbatch index."""
        return microbatch // self.num_microbatches

    @cached_property
    def has_split_backward(self) -> bool:
        """True when backward is split into I and W ops."""
        return any(op.kind is OpKind.I for ops in self.ranks for op in ops)

    def to_text(self) -> list[list[str]]:
        """Per rank, the ops as text cells."""
        return [[str(op) for op in ops] for ops in self.ranks]

    def to_dict(self) -> dict[str, object]:
        """The JSON form: schedule, num_stages, num_microbatches, num_minibatches, ranks."""
        return {
            "schedule": self.name,
            "num_stages": self.num_stages,
            "num_microbatches": self.num_microbatches,
            "num_minibatches": self.num_minibatches,
            "weights": self.weights.value,
            "stage_to_rank": list(self.stage_to_rank),
            "ranks": self.to_text(),
        }


def one_stage_per_rank(num_stages: int) -> tuple[int, ...]:
    """The identity placement: stage s on rank s."""
    return tuple(range(num_stages))


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
