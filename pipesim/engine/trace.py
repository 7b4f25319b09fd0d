"""Trace: what an engine (or a real run) did: timed spans and memory events, stored by column."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from pipesim.engine.run_info import RunInfo
from pipesim.errors import ConfigError
from pipesim.schedule.ir import KIND_ORDER
from pipesim.spec.files import check_int_digits

TRACE_SCHEMA = "pipesim.trace/1"

# Span kinds, in code order; communication spans have kind "F" or the gradient kind of their op.
KINDS = tuple(kind.value for kind in KIND_ORDER)
STREAMS = ("compute", "send")
CATEGORIES = ("weights", "gradients", "optimizer", "activations", "working")

SPAN_COLUMNS = (
    "device", "stream", "kind", "stage", "microbatch", "minibatch", "weight_version",
    "start_s", "end_s", "bytes", "peer", "position",
)
MEMORY_COLUMNS = ("time_s", "device", "stage", "category", "delta_bytes", "delta_count")
_FLOAT_COLUMNS = frozenset({"start_s", "end_s", "bytes", "time_s", "delta_bytes"})


@dataclass(frozen=True)
class Span:
    """One timed interval on one device's stream.

    Attributes:
        device: rank index the span ran on.
        stream: ``"compute"`` or ``"send"`` (a transfer from ``device`` to ``peer``).
        op: the op's text form, e.g. ``"1B3"``; for a send, the op whose output is sent.
        stage: model stage; microbatch: global microbatch (update index for U);
        minibatch: step index; weight_version: version used (-1 for sends);
        start_s, end_s: seconds from the start of the run; bytes: bytes moved (sends);
        peer: receiving rank of a send, -1 otherwise.
        position: index of the op in its rank's order (for a send, of the op whose output it is).
    """

    device: int
    stream: str
    op: str
    stage: int
    microbatch: int
    minibatch: int
    weight_version: int
    start_s: float
    end_s: float
    bytes: float
    peer: int
    position: int


@dataclass
class TraceBuilder:
    """Collects spans and memory events row by row; ``build()`` freezes them into a Trace."""

    info: RunInfo
    spans: dict[str, list[float]] = field(default_factory=lambda: {c: [] for c in SPAN_COLUMNS})
    memory: dict[str, list[float]] = field(default_factory=lambda: {c: [] for c in MEMORY_COLUMNS})

    def span(self, device: int, stream: int, kind: int, stage: int, microbatch: int, minibatch: int,
             weight_version: int, start_s: float, end_s: float, num_bytes: float, peer: int,
             position: int) -> None:
        """Add one span (codes index KINDS and STREAMS)."""
        row = (device, stream, kind, stage, microbatch, minibatch, weight_version, start_s, end_s,
               num_bytes, peer, position)
        for column, value in zip(SPAN_COLUMNS, row, strict=True):
            self.spans[column].append(value)

    def memory_event(self, time_s: float, device: int, stage: int, category: int,
                     delta_bytes: float, delta_count: int) -> None:
        """Add one memory event (category indexes CATEGORIES)."""
        row = (time_s, device, stage, category, delta_bytes, delta_count)
        for column, value in zip(MEMORY_COLUMNS, row, strict=True):
            self.memory[column].append(value)

    def build(self) -> Trace:
        """The finished Trace, rows in the order they were added."""
        return Trace(
            info=self.info,
            spans={c: _column(c, v) for c, v in self.spans.items()},
            memory={c: _column(c, v) for c, v in self.memory.items()},
        )


def _column(name: str, values: Any) -> npt.NDArray[Any]:
    return np.asarray(values, dtype=np.float64 if name in _FLOAT_COLUMNS else np.int64)


def _read_column(field: str, name: str, values: list[Any], source: str) -> npt.NDArray[Any]:
    """A column of a trace file: finite numbers for times and bytes, integers for the rest.

    Raises:
        ConfigError: naming the column and its first value of another type.
    """
    floats = name in _FLOAT_COLUMNS
    allowed = (int, float) if floats else (int,)  # bool is an int to Python, not to a trace
    if set(map(type, values)) <= set(allowed):
        try:
            column = _column(name, values)
        except OverflowError:
            wide = next(value for value in values if type(value) is int and not -2**63 <= value < 2**63)
            raise ConfigError(field, wide, "must fit in 64 bits", source=source) from None
        if not floats or bool(np.isfinite(column).all()):
            return column
        bad: Any = float(column[~np.isfinite(column)][0])
    else:
        bad = next(value for value in values if type(value) not in allowed)
    raise ConfigError(field, bad, "must be a finite number" if floats else "must be an integer", source=source)


def _check_codes(tables: dict[str, dict[str, npt.NDArray[Any]]], info: RunInfo, source: str) -> None:
    """The integer columns of a trace file that index tables or group rows, each in its range
    (from the run's counts where it depends on the run), and one compute span per device and
    position: otherwise a metric or a figure would fail deep inside, or count a row in another group.

    Raises:
        ConfigError: naming the column, its first value outside the range and the range.
    """
    num_ranks, num_stages = info.num_ranks, info.num_stages
    ranges = (
        ("spans", "stream", 0, len(STREAMS) - 1), ("spans", "kind", 0, len(KINDS) - 1),
        ("spans", "device", 0, num_ranks - 1), ("spans", "stage", 0, num_stages - 1),
        ("spans", "peer", -1, num_ranks - 1), ("spans", "microbatch", 0, None),
        ("spans", "minibatch", 0, info.num_minibatches - 1), ("spans", "position", 0, None),
        ("memory", "device", 0, num_ranks - 1), ("memory", "stage", 0, num_stages - 1),
        ("memory", "category", 0, len(CATEGORIES) - 1),
    )
    for table, column, low, high in ranges:
        values = tables[table][column]
        outside = (values < low) if high is None else (values < low) | (values > high)
        if values.size and bool(outside.any()):
            rule = f"must be >= {low}" if high is None else f"must be in {low}..{high}"
            raise ConfigError(f"{table}.{column}", int(values[outside][0]), rule, source=source)
    spans = tables["spans"]
    compute = np.flatnonzero(spans["stream"] == STREAMS.index("compute"))
    order = np.lexsort((spans["position"][compute], spans["device"][compute]))
    twice = shared_position(spans, compute[order], source)
    if twice is not None:
        raise twice


def shared_position(spans: dict[str, npt.NDArray[Any]], rows: npt.NDArray[Any],
                    source: str | None = None) -> ConfigError | None:
    """The error naming two compute spans of one device at one position among ``rows`` (sorted
    by device, then position), or None: a device runs one op per position of its order."""
    device, position = spans["device"][rows], spans["position"][rows]
    twice = np.flatnonzero((device[1:] == device[:-1]) & (position[1:] == position[:-1]))
    if not twice.size:
        return None
    return ConfigError("spans.position", int(position[twice[0]]), "must differ between the compute spans of one "
                       f"device (device {int(device[twice[0]])} has two)", source=source)


@dataclass(frozen=True, eq=False)
class Trace:
    """Spans and memory events of one run, by column, plus what produced them.

    Attributes:
        info: the run it records (schedule, counts, sizes, engine), the JSON's ``meta``.
        spans: SPAN_COLUMNS to numpy arrays (kind and stream as integer codes).
        memory: MEMORY_COLUMNS to numpy arrays (category as integer code).
    """

    info: RunInfo
    spans: dict[str, npt.NDArray[Any]]
    memory: dict[str, npt.NDArray[Any]]

    def __repr__(self) -> str:
        meta = self.info.to_dict()
        return (f"<Trace {meta.get('schedule', '?')} p={meta.get('num_stages', '?')} m={meta.get('num_microbatches', '?')} "
                f"K={meta.get('num_minibatches', '?')}: {self.num_spans} spans, {len(self.memory['time_s'])} memory "
                f"events, makespan {self.makespan_s * 1e3:.4g} ms>")

    def _repr_html_(self) -> str:
        """A summary table for notebooks; ``import pipesim.plots`` adds the timeline under it."""
        rows = [(key, self.info.to_dict().get(key, "")) for key in ("schedule", "num_stages", "num_microbatches",
                                                           "num_minibatches", "num_ranks", "engine")]
        rows += [("spans", self.num_spans), ("makespan", f"{self.makespan_s * 1e3:.4g} ms")]
        cells = "".join(f"<tr><th style='text-align:left'>{k}</th><td>{v}</td></tr>" for k, v in rows)
        return f"<table>{cells}</table>"

    @property
    def num_spans(self) -> int:
        """Number of spans."""
        return int(self.spans["start_s"].shape[0])

    @property
    def makespan_s(self) -> float:
        """End of the last span, seconds."""
        return float(self.spans["end_s"].max()) if self.num_spans else 0.0

    def iter_spans(self) -> Iterator[Span]:
        """The spans as Span objects, in stored order."""
        s = self.spans
        for row in range(self.num_spans):
            kind = KINDS[int(s["kind"][row])]
            yield Span(
                device=int(s["device"][row]),
                stream=STREAMS[int(s["stream"][row])],
                op=f"{int(s['stage'][row])}{kind}{int(s['microbatch'][row])}",
                stage=int(s["stage"][row]),
                microbatch=int(s["microbatch"][row]),
                minibatch=int(s["minibatch"][row]),
                weight_version=int(s["weight_version"][row]),
                start_s=float(s["start_s"][row]),
                end_s=float(s["end_s"][row]),
                bytes=float(s["bytes"][row]),
                peer=int(s["peer"][row]),
                position=int(s["position"][row]),
            )

    def to_frame(self) -> Any:
        """A pandas DataFrame, one row per span, columns: device, stream, op, kind, stage,
        microbatch, minibatch, weight_version, start_s, end_s, duration_s, bytes, peer, position."""
        import pandas as pd

        s = self.spans
        kinds = np.asarray(KINDS, dtype=object)[s["kind"]] if self.num_spans else np.asarray([], dtype=object)
        streams = np.asarray(STREAMS, dtype=object)[s["stream"]] if self.num_spans else np.asarray([], dtype=object)
        ops = [f"{stage}{kind}{mb}" for stage, kind, mb in zip(s["stage"].tolist(), kinds, s["microbatch"].tolist(), strict=True)]
        return pd.DataFrame({
            "device": s["device"], "stream": streams, "op": ops, "kind": kinds, "stage": s["stage"],
            "microbatch": s["microbatch"], "minibatch": s["minibatch"],
            "weight_version": s["weight_version"], "start_s": s["start_s"], "end_s": s["end_s"],
            "duration_s": s["end_s"] - s["start_s"], "bytes": s["bytes"], "peer": s["peer"],
            "position": s["position"],
        })

    def memory_frame(self) -> Any:
        """A pandas DataFrame of memory events: time_s, device, stage, category, delta_bytes, delta_count."""
        import pandas as pd

        m = self.memory
        categories = np.asarray(CATEGORIES, dtype=object)[m["category"]] if len(m["time_s"]) else []
        return pd.DataFrame({
            "time_s": m["time_s"], "device": m["device"], "stage": m["stage"], "category": categories,
            "delta_bytes": m["delta_bytes"], "delta_count": m["delta_count"],
        })

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: schema, meta (the run info), and columns as lists."""
        return {
            "schema": TRACE_SCHEMA,
            "meta": self.info.to_dict(),
            "spans": {c: self.spans[c].tolist() for c in SPAN_COLUMNS},
            "memory": {c: self.memory[c].tolist() for c in MEMORY_COLUMNS},
        }

    def to_json(self) -> str:
        """Deterministic JSON text (sorted keys); ``Trace.from_json`` inverts it exactly."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")) + "\n"

    @classmethod
    def from_json(cls, text: str, *, source: str = "<trace>") -> Trace:
        """Parse the JSON written by ``to_json``.

        Raises:
            ConfigError: not a pipesim trace, a column missing or of the wrong length, or a
                meta key missing or of the wrong type.
        """
        try:
            data = json.loads(text, parse_int=check_int_digits)
        except json.JSONDecodeError as exc:
            raise ConfigError("trace", source, f"is not valid JSON: {exc.msg} at line {exc.lineno}") from None
        except ConfigError as exc:  # an integer of more digits than Python converts
            raise ConfigError(exc.field, exc.value, exc.rule, source=source) from None
        if not isinstance(data, dict) or data.get("schema") != TRACE_SCHEMA:
            raise ConfigError("schema", data.get("schema") if isinstance(data, dict) else data,
                              f"must be {TRACE_SCHEMA!r}", source=source)
        tables = {}
        for table, columns in (("spans", SPAN_COLUMNS), ("memory", MEMORY_COLUMNS)):
            raw = data.get(table)
            if not isinstance(raw, dict):
                raise ConfigError(table, raw, "must be an object of columns", source=source)
            lengths = set()
            for column in columns:
                if not isinstance(raw.get(column), list):
                    raise ConfigError(f"{table}.{column}", raw.get(column), "must be a list", source=source)
                lengths.add(len(raw[column]))
            if len(lengths) > 1:
                raise ConfigError(table, sorted(lengths), "columns must all have the same length", source=source)
            tables[table] = {c: _read_column(f"{table}.{c}", c, raw[c], source) for c in columns}
        meta = data.get("meta")
        if not isinstance(meta, dict):
            raise ConfigError("meta", meta, "must be an object", source=source)
        info = RunInfo.from_dict(meta, source=source)
        _check_codes(tables, info, source)
        return cls(info=info, spans=tables["spans"], memory=tables["memory"])

    def equals(self, other: Trace) -> bool:
        """True when the run info and every column are identical."""
        return self.info == other.info and all(
            np.array_equal(self.spans[c], other.spans[c]) for c in SPAN_COLUMNS
        ) and all(np.array_equal(self.memory[c], other.memory[c]) for c in MEMORY_COLUMNS)
