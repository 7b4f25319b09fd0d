"""The schedule IR: op kinds, ops in the "1F0" text form, and a schedule as per-rank op order."""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import numpy.typing as npt

from pipesim.errors import ConfigError
from pipesim.schedule.grid import grid as grid  # the grid drawing of a schedule, used with the IR everywhere

if TYPE_CHECKING:
    from pipesim.schedule.columns import SendLinks

IntArray = npt.NDArray[np.int64]
ArrayT = TypeVar("ArrayT", bound="npt.NDArray[Any]")


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
NUM_KINDS = len(KIND_ORDER)


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


# Digits of a stage or microbatch number in an op's text: past any run (and int()'s 4,300-digit limit).
MAX_INDEX_DIGITS = 18
_OP_TEXT = re.compile(r"([0-9]+)([FBIWU])([0-9]+)")


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
        if len(stage) > MAX_INDEX_DIGITS or len(microbatch) > MAX_INDEX_DIGITS:  # int() stops at 4,300 digits
            raise ConfigError("op", text, f"stage and microbatch have at most {MAX_INDEX_DIGITS} digits")
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


def read_only(column: ArrayT) -> ArrayT:
    """``column``, made read only (a schedule's columns are shared by programs and traces)."""
    column.flags.writeable = False
    return column


@dataclass(frozen=True, eq=False)
class ScheduleTable:
    """Every op of a schedule by column, ranks one after another, each rank's ops in its order.

    Op ``g`` is op ``position[g]`` of rank ``rank[g]``; rank ``r`` holds
    ``rank_offsets[r]:rank_offsets[r + 1]``. Kinds are codes into ``KIND_ORDER``; for U the
    microbatch column holds the update's index on its stage. Every column is read only.

    Attributes:
        known_rank: the rank column, where a generator has it at hand (one stage per rank:
            the stage column); None: derived from ``rank_offsets``.
        minibatch, updates_before, forward, wait: order facts that a
            generator knows by formula, given here so that ``Schedule`` need not derive them
            (None: derived when read; see the Schedule properties of those names).
    """

    rank_offsets: IntArray
    stage: IntArray
    kind: IntArray
    microbatch: IntArray
    known_rank: IntArray | None = None
    minibatch: IntArray | None = None
    updates_before: IntArray | None = None
    forward: IntArray | None = None
    wait: IntArray | None = None

    @classmethod
    def from_ranks(cls, ranks: Sequence[Sequence[Op]]) -> ScheduleTable:
        """The table of per-rank op lists (one pass over the Op objects)."""
        lengths = [len(ops) for ops in ranks]
        total = sum(lengths)
        flat = [op for ops in ranks for op in ops]
        codes = KIND_CODES
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(
            rank_offsets=read_only(offsets),
            stage=read_only(np.fromiter((op.stage for op in flat), np.int64, total)),
            kind=read_only(np.fromiter((codes[op.kind] for op in flat), np.int64, total)),
            microbatch=read_only(np.fromiter((op.microbatch for op in flat), np.int64, total)),
        )

    @property
    def num_ops(self) -> int:
        """Number of ops."""
        return int(self.stage.shape[0])

    @property
    def num_ranks(self) -> int:
        """Number of ranks."""
        return int(self.rank_offsets.shape[0]) - 1

    @cached_property
    def rank(self) -> IntArray:
        """Per op, its rank."""
        if self.known_rank is not None:
            return self.known_rank
        lengths = np.diff(self.rank_offsets)
        return read_only(np.repeat(np.arange(self.num_ranks, dtype=np.int64), lengths))

    @cached_property
    def position(self) -> IntArray:
        """Per op, its index in its rank's order."""
        lengths = np.diff(self.rank_offsets)
        if lengths.size and (lengths == lengths[0]).all():  # every rank as long: one row, repeated
            return read_only(np.tile(np.arange(lengths[0], dtype=np.int64), lengths.size))
        return read_only(np.arange(self.num_ops, dtype=np.int64) - self.rank_offsets[self.rank])

    def to_ranks(self) -> tuple[tuple[Op, ...], ...]:
        """Per rank, its ops as Op objects."""
        kinds = KIND_ORDER
        flat = [Op(stage, kinds[kind], microbatch) for stage, kind, microbatch
                in zip(self.stage.tolist(), self.kind.tolist(), self.microbatch.tolist(), strict=True)]
        offsets = self.rank_offsets.tolist()
        return tuple(tuple(flat[offsets[r]:offsets[r + 1]]) for r in range(self.num_ranks))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ScheduleTable):
            return NotImplemented
        return all(np.array_equal(getattr(self, name), getattr(other, name))
                   for name in ("rank_offsets", "stage", "kind", "microbatch"))

    def __hash__(self) -> int:
        return hash(tuple(column.tobytes() for column in (self.rank_offsets, self.stage, self.kind, self.microbatch)))


@dataclass(frozen=True)
class Schedule:
    """The order of ops on every rank, as an op table. Order only: time comes from an engine.

    The Op objects (``ranks``) and the order facts (``minibatch``, ``version``, ``wait``) are
    views of the table, built on first use and kept.

    Attributes:
        name: registry key that made it (or ``"custom"``).
        num_stages: model stages.
        num_microbatches: microbatches per minibatch.
        num_minibatches: minibatches; microbatch indices run over ``num_minibatches * num_microbatches``.
        table: every op by column.
        stage_to_rank: the rank that holds each stage.
        weights: the weight-version policy.
    """

    name: str
    num_stages: int
    num_microbatches: int
    num_minibatches: int
    table: ScheduleTable
    stage_to_rank: tuple[int, ...]
    weights: WeightPolicy = WeightPolicy.FLUSH

    @classmethod
    def from_ranks(
        cls, name: str, num_stages: int, num_microbatches: int, num_minibatches: int,
        ranks: Sequence[Sequence[Op]], stage_to_rank: tuple[int, ...], weights: WeightPolicy = WeightPolicy.FLUSH,
    ) -> Schedule:
        """The schedule of per-rank op lists (``ranks``), converted once into its table."""
        return cls(name=name, num_stages=num_stages, num_microbatches=num_microbatches,
                   num_minibatches=num_minibatches, table=ScheduleTable.from_ranks(ranks),
                   stage_to_rank=stage_to_rank, weights=weights)

    @cached_property
    def ranks(self) -> tuple[tuple[Op, ...], ...]:
        """Per rank, its ops in execution order."""
        return self.table.to_ranks()

    @property
    def num_ranks(self) -> int:
        """Number of ranks (devices)."""
        return self.table.num_ranks

    def __repr__(self) -> str:
        return (f"<Schedule {self.name}: {self.num_stages} stages on {self.num_ranks} ranks, m={self.num_microbatches}, "
                f"K={self.num_minibatches}, {self.weights.value} weights>")

    @property
    def total_microbatches(self) -> int:
        """Microbatches over all minibatches."""
        return self.num_minibatches * self.num_microbatches

    @property
    def num_ops(self) -> int:
        """Ops over all ranks."""
        return self.table.num_ops

    def minibatch_of(self, microbatch: int) -> int:
        """Minibatch index of a (global) microbatch index."""
        return microbatch // self.num_microbatches

    @cached_property
    def has_split_backward(self) -> bool:
        """True when backward is split into I and W ops."""
        return bool((self.table.kind == I_CODE).any())

    @cached_property
    def minibatch(self) -> IntArray:
        """Per op, its step index (``schedule.columns.minibatch_column``)."""
        from pipesim.schedule.columns import minibatch_column

        known = self.table.minibatch
        return read_only(minibatch_column(self)) if known is None else known

    @cached_property
    def updates_before(self) -> IntArray:
        """Per op, how many U ops of its stage ran before it on its rank: the stage's current
        weight version (``schedule.versions.updates_before_column``)."""
        from pipesim.schedule.versions import updates_before_column

        known = self.table.updates_before
        return read_only(updates_before_column(self.table)) if known is None else known

    @cached_property
    def forward(self) -> IntArray:
        """Per op, the op that is its stage's F of the same microbatch; the op itself for a U
        or an op without one (``schedule.versions.forward_column``)."""
        from pipesim.schedule.versions import forward_column

        known = self.table.forward
        return read_only(forward_column(self)) if known is None else known

    @cached_property
    def version(self) -> IntArray:
        """Per op, the weight version it uses (``schedule.versions.version_column``).

        Raises:
            ScheduleError: the policy cannot give an op its version.
        """
        from pipesim.schedule.versions import version_column

        return read_only(version_column(self))

    @cached_property
    def wait(self) -> IntArray:
        """Per op, the op of another stage whose output it waits for, or -1
        (``schedule.columns.wait_column``).

        Raises:
            ScheduleError: the op it waits for is missing, or two ops wait for one output.
        """
        from pipesim.schedule.columns import wait_column

        known = self.table.wait
        return read_only(wait_column(self)) if known is None else known

    @cached_property
    def stage_kind(self) -> IntArray:
        """Per op, ``stage * NUM_KINDS + kind``: its row in a (stage, kind) table."""
        stage_kind = self.table.stage * NUM_KINDS
        stage_kind += self.table.kind
        return read_only(stage_kind)

    @cached_property
    def send_link(self) -> IntArray:
        """Per op, the link its output goes over (``schedule.columns.send_links``)."""
        from pipesim.schedule.columns import send_link_column

        return read_only(send_link_column(self))

    @cached_property
    def send_links(self) -> SendLinks:
        """The links ops send over, with the ranks at their ends (``schedule.columns.send_links``)."""
        from pipesim.schedule.columns import send_links

        return send_links(self)

    @cached_property
    def send_rank(self) -> IntArray:
        """Per op, the rank that receives its output, or -1."""
        return read_only(self.send_links.rank.take(self.send_link))

    @cached_property
    def is_remote_send(self) -> npt.NDArray[np.bool_]:
        """True where the op's output crosses a link to another rank."""
        remote: npt.NDArray[np.bool_] = self.send_links.is_remote.take(self.send_link)
        remote.flags.writeable = False
        return remote

    @cached_property
    def derived(self) -> dict[str, Any]:
        """Values that later stages derive from the order alone, kept with it so that every
        program lowered from this schedule shares them (``engine.assemble``'s span columns)."""
        return {}

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
