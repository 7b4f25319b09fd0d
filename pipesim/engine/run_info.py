"""RunInfo: what produced a Trace (schedule, sizes, engine, and for measured runs the harness's
facts), typed; its ``to_dict`` is the trace JSON's ``meta`` object."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipesim.errors import ConfigError
from pipesim.schedule.ir import Schedule


@dataclass(frozen=True)
class RunFailure:
    """Where a measured run failed: the rank, its op (text form) and the reason it gave."""

    rank: int
    op: str
    reason: str


@dataclass(frozen=True)
class RunInfo:
    """What a Trace records about its run. Numbers keep the type they were given (an int stays
    an int), so a trace's JSON reads back and writes out byte for byte.

    Attributes:
        schedule: registry name; weights: its WeightPolicy value.
        num_stages, num_microbatches, num_minibatches, num_ranks: p, m, K and the ranks.
        stage_to_rank: rank of each stage; rank_devices: topology device of each rank.
        microbatch_size: samples per microbatch.
        param_bytes, stash_bytes: per stage, its parameters and what an F stashes.
        optimizer_state_multiplier: optimizer state as a multiple of the parameters.
        device_memory_bytes: per rank, its device's memory (None: unlimited).
        engine: ``"des"``, ``"analytic"`` or ``"torch"``; None for a Program not yet run.
        jitter, seed: the engine's duration noise (seed: DES only).
        backend, device, partition: a measured run's torch backend, device and layer ranges.
        cpu_share: per rank of a measured run, CPU over wall time of its compute spans.
        compute_cpu_s: per rank and op position, the thread CPU seconds of its compute span.
        compute_receive_s, compute_send_s: per rank and op position, the seconds of its compute
            span before its work began (taking its input from the link) and after its work ended
            (handing its output to the link, the records); -1 where not measured.
        cuda_max_memory_allocated_bytes: per rank, torch's peak allocation (CUDA runs).
        partial, failure: a measured run that failed, and where.
        other: keys this version does not know, kept so that such a trace round trips.
    Fields left None are absent from ``to_dict``.
    """

    schedule: str
    weights: str
    num_stages: int
    num_microbatches: int
    num_minibatches: int
    num_ranks: int
    stage_to_rank: tuple[int, ...]
    rank_devices: tuple[int, ...]
    microbatch_size: int
    param_bytes: tuple[float, ...]
    stash_bytes: tuple[float, ...]
    optimizer_state_multiplier: float
    device_memory_bytes: tuple[float | None, ...]
    engine: str | None = None
    jitter: float | None = None
    seed: int | None = None
    backend: str | None = None
    device: str | None = None
    partition: tuple[tuple[int, int], ...] | None = None
    cpu_share: tuple[float | None, ...] | None = None
    compute_cpu_s: tuple[tuple[float, ...] | None, ...] | None = None
    compute_receive_s: tuple[tuple[float, ...] | None, ...] | None = None
    compute_send_s: tuple[tuple[float, ...] | None, ...] | None = None
    cuda_max_memory_allocated_bytes: tuple[float, ...] | None = None
    partial: bool | None = None
    failure: RunFailure | None = None
    other: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, schedule: Schedule, *, rank_devices: tuple[int, ...], microbatch_size: int,
           param_bytes: tuple[float, ...], stash_bytes: tuple[float, ...], optimizer_state_multiplier: float,
           device_memory_bytes: tuple[float | None, ...]) -> RunInfo:
        """The run info of ``schedule`` (its name, weights, counts and placement) with these sizes."""
        return cls(
            schedule=schedule.name, weights=schedule.weights.value, num_stages=schedule.num_stages,
            num_microbatches=schedule.num_microbatches, num_minibatches=schedule.num_minibatches,
            num_ranks=schedule.num_ranks, stage_to_rank=tuple(schedule.stage_to_rank), rank_devices=rank_devices,
            microbatch_size=microbatch_size, param_bytes=param_bytes, stash_bytes=stash_bytes,
            optimizer_state_multiplier=optimizer_state_multiplier, device_memory_bytes=device_memory_bytes,
        )

    def ran(self, engine: str, *, jitter: float, seed: int | None = None) -> RunInfo:
        """This run description as run by ``engine`` with that duration noise."""
        return dataclasses.replace(self, engine=engine, jitter=jitter, seed=seed)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form (sequences as lists; None fields and an empty ``other`` left out)."""
        data: dict[str, Any] = {}
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if item.name == "other":
                data.update(value)
            elif isinstance(value, RunFailure):
                data[item.name] = dataclasses.asdict(value)
            elif value is not None:
                data[item.name] = _plain(value)
        return data

    @classmethod
    def from_dict(cls, meta: Mapping[str, Any], *, source: str = "<trace>") -> RunInfo:
        """Read the ``meta`` object of a trace's JSON.

        Raises:
            ConfigError: a key that every trace has is missing, or a value of the wrong type.
        """
        known: dict[str, Any] = {}
        for name, (check, rule) in _CHECKS.items():
            if name not in meta:
                if name in _REQUIRED:
                    raise ConfigError(f"meta.{name}", None, "is required", source=source)
                continue
            value = meta[name]
            if not check(value):
                raise ConfigError(f"meta.{name}", value, f"must be {rule}", source=source)
            known[name] = _frozen(value)
        if "failure" in known:
            failure = meta["failure"]
            known["failure"] = RunFailure(rank=failure["rank"], op=failure["op"], reason=failure["reason"])
        _check_counts(known, source)
        other = {key: value for key, value in meta.items() if key not in _CHECKS}
        return cls(**known, other=other)


#: The most stage-microbatch steps (stages x microbatches x minibatches) a trace file may declare:
#: over ten times the largest run ``simulate`` takes without a raised --max-ops.
MAX_MICROBATCH_STEPS = 100_000_000


def _check_counts(known: Mapping[str, Any], source: str) -> None:
    """The counts of a trace's meta at least 1, and its per-stage and per-rank lists of their
    lengths, ranks and sizes in range: metrics and figures index by them.

    Raises:
        ConfigError: naming the key, its value and the rule.
    """
    for name in ("num_stages", "num_microbatches", "num_minibatches", "num_ranks", "microbatch_size"):
        if known[name] < 1:
            raise ConfigError(f"meta.{name}", known[name], "must be >= 1", source=source)
    num_stages, num_ranks = known["num_stages"], known["num_ranks"]
    # The metrics size tables by stages x microbatches x minibatches (the lists below tie the
    # stages and ranks to the file's own length; these two counts are free).
    if num_stages * known["num_microbatches"] * known["num_minibatches"] > MAX_MICROBATCH_STEPS:
        raise ConfigError("meta.num_microbatches", known["num_microbatches"],
                          f"times num_stages ({num_stages}) and num_minibatches ({known['num_minibatches']}) must be "
                          f"at most {MAX_MICROBATCH_STEPS:,}", source=source)
    for name, length, per in (("stage_to_rank", num_stages, "stage"), ("param_bytes", num_stages, "stage"),
                              ("stash_bytes", num_stages, "stage"), ("rank_devices", num_ranks, "rank"),
                              ("device_memory_bytes", num_ranks, "rank")):
        if len(known[name]) != length:
            raise ConfigError(f"meta.{name}", list(known[name]), f"must have one item per {per} ({length})",
                              source=source)
    for name, low, high in (("stage_to_rank", 0, num_ranks - 1), ("rank_devices", 0, None)):
        for index, value in enumerate(known[name]):
            if value < low or (high is not None and value > high):
                rule = f"must be >= {low}" if high is None else f"must be in {low}..{high}"
                raise ConfigError(f"meta.{name}[{index}]", value, rule, source=source)
    for name in ("param_bytes", "stash_bytes", "device_memory_bytes"):
        for index, value in enumerate(known[name]):
            if value is not None and not 0 <= value < math.inf:
                raise ConfigError(f"meta.{name}[{index}]", value, "must be a finite number >= 0", source=source)
    multiplier = known["optimizer_state_multiplier"]
    if not 0 <= multiplier < math.inf:
        raise ConfigError("meta.optimizer_state_multiplier", multiplier, "must be a finite number >= 0", source=source)


def _plain(value: Any) -> Any:
    """Tuples, nested too, as lists."""
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value


def _frozen(value: Any) -> Any:
    """Lists, nested too, as tuples."""
    if isinstance(value, list):
        return tuple(_frozen(item) for item in value)
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return _is_int(value) or isinstance(value, float)


def _list_of(check: Callable[[Any], bool], *, optional: bool = False) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, list) and all(
        (optional and item is None) or check(item) for item in value)


def _is_failure(value: Any) -> bool:
    return (isinstance(value, dict) and set(value) == {"rank", "op", "reason"} and _is_int(value["rank"])
            and isinstance(value["op"], str) and isinstance(value["reason"], str))


def _is_text(value: Any) -> bool:
    return isinstance(value, str)


_INT, _NUMBER, _TEXT = (_is_int, "an integer"), (_is_number, "a number"), (_is_text, "text")
_INTS, _NUMBERS = (_list_of(_is_int), "a list of integers"), (_list_of(_is_number), "a list of numbers")
_SOME_NUMBERS = (_list_of(_is_number, optional=True), "a list of numbers or nulls")
_PER_OP = (_list_of(_list_of(_is_number), optional=True), "a list of lists of numbers, or nulls")
# Per key of the JSON's meta: its check and the rule a wrong value breaks; the keys before
# "engine" are in every trace.
_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "schedule": _TEXT, "weights": _TEXT, "num_stages": _INT, "num_microbatches": _INT, "num_minibatches": _INT,
    "num_ranks": _INT, "stage_to_rank": _INTS, "rank_devices": _INTS, "microbatch_size": _INT,
    "param_bytes": _NUMBERS, "stash_bytes": _NUMBERS, "optimizer_state_multiplier": _NUMBER,
    "device_memory_bytes": _SOME_NUMBERS,
    "engine": _TEXT, "jitter": _NUMBER, "seed": _INT, "backend": _TEXT, "device": _TEXT,
    "partition": (_list_of(lambda v: isinstance(v, list) and len(v) == 2 and all(map(_is_int, v))),
                  "a list of [start, end] integer pairs"),
    "cpu_share": _SOME_NUMBERS,
    "compute_cpu_s": _PER_OP,
    "compute_receive_s": _PER_OP,
    "compute_send_s": _PER_OP,
    "cuda_max_memory_allocated_bytes": _NUMBERS,
    "partial": (lambda v: isinstance(v, bool), "true or false"),
    "failure": (_is_failure, "an object of rank (integer), op and reason (text)"),
}
_REQUIRED = tuple(_CHECKS)[:tuple(_CHECKS).index("engine")]
