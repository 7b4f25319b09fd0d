"""What a run is: the model, the training rule and the RunConfig passed to every rank as JSON (no torch here)."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pipesim.errors import ConfigError
from pipesim.schedule.ir import Schedule
from pipesim.schedule.registry import SCHEDULES, build_schedule, default_num_minibatches
from pipesim.spec.profile import MAX_UNIFORM_LAYERS, Profile

BACKENDS = ("gloo", "nccl")
COMPUTE_MODES = ("real", "emulated")
MAX_REALTIME_PRIORITY = 99  # Linux's highest SCHED_RR priority
# How repeated timings of one op are summarized.
STATISTICS = ("mean", "median")
# Processes one harness command starts on this machine (ranks, or profiling processes): past any
# machine's cores (10**12 ran out of memory building their environments).
MAX_PROCESSES = 1024
# The models the harness builds itself (``null``: layers that do nothing, to time the harness).
BUILTIN_MODELS = ("mlp", "transformer", "null")
# A harness profile keeps the model it measured in its ``source``, after this prefix.
SOURCE_PREFIX = "pipesim.harness model="


def check_processes(field: str, count: int, least: int = 1) -> None:
    """Refuse, before any process starts, a process count outside ``least``..``MAX_PROCESSES``.

    Raises:
        ConfigError: naming ``field``.
    """
    if not least <= count <= MAX_PROCESSES:
        raise ConfigError(field, count, f"must be from {least} to {MAX_PROCESSES:,}")


@dataclass(frozen=True)
class ModelSpec:
    """What model to build, identically on every rank.

    Attributes:
        name: ``"mlp"``, ``"transformer"``, ``"null"`` (layers that do nothing, to time the
            harness itself), or ``"MODULE:CALLABLE"`` / ``"FILE.py:CALLABLE"`` naming a function
            that returns an ``nn.Sequential``.
        depth: layers of a built-in model (MLP: linear layers; transformer: blocks).
        width: hidden size of a built-in model.
        seq_len: tokens per sample (transformer).
        heads: attention heads (transformer); must divide ``width``.
        input_shape: per-sample input shape of a user model (required for one).
        seed: seed of the weights and of the synthetic data.
    """

    name: str = "mlp"
    depth: int = 8
    width: int = 512
    seq_len: int = 32
    heads: int = 4
    input_shape: tuple[int, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        """Refuse, before any rank starts, sizes below 1 (or more layers than a uniform profile
        may have), heads that do not divide a transformer's width, a name of neither form, and an
        input shape a model does not take (a built-in model's comes from its sizes) or lacks (a
        user model)."""
        for name in ("depth", "width", "seq_len", "heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(name, value, "must be an integer >= 1")
        if self.depth > MAX_UNIFORM_LAYERS:
            raise ConfigError("depth", self.depth, f"must be an integer from 1 to {MAX_UNIFORM_LAYERS:,}")
        if self.name == "transformer" and self.width % self.heads:
            raise ConfigError("heads", self.heads, f"must divide width ({self.width})")
        if self.name in BUILTIN_MODELS:
            if self.input_shape:
                raise ConfigError("input_shape", ",".join(map(str, self.input_shape)),
                                  f"applies to a user model only; {self.name} takes its shape from its sizes")
            return
        module, sep, attribute = self.name.rpartition(":")
        if not (sep and module and attribute):
            raise ConfigError("model", self.name, "must be mlp, transformer, MODULE:CALLABLE or FILE.py:CALLABLE")
        if not self.input_shape:
            raise ConfigError("input_shape", None, "must be given for a user model, e.g. 3,32,32")

    def to_dict(self) -> dict[str, object]:
        """JSON form (for the workers' config)."""
        return {"name": self.name, "depth": self.depth, "width": self.width, "seq_len": self.seq_len,
                "heads": self.heads, "input_shape": list(self.input_shape), "seed": self.seed}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> ModelSpec:
        """Inverse of ``to_dict``."""
        shape = data.get("input_shape") or []
        assert isinstance(shape, list)
        return cls(name=str(data["name"]), depth=int(str(data["depth"])), width=int(str(data["width"])),
                   seq_len=int(str(data["seq_len"])), heads=int(str(data["heads"])),
                   input_shape=tuple(int(v) for v in shape), seed=int(str(data["seed"])))


@dataclass(frozen=True)
class TrainingOptions:
    """How the harness trains: plain SGD, and PipeMare's two techniques as options.

    Every U applies ``w -= lr_k * mean(gradients accumulated since the previous U)``.

    Attributes:
        learning_rate: base step size.
        pipemare_warmup_updates: PipeMare's learning-rate rescheduling: update k of a stage with
            forward delay tau (in updates, at least 1) uses ``lr / tau ** (1 - min(k / K, 1))``
            for K = this many updates; 0 turns it off.
        pipemare_correction: PipeMare's discrepancy correction: a backward that runs D updates
            after its forward uses ``w - D * delta`` instead of the current ``w``, where delta is
            an exponential moving average of the per-update change of ``w``.
        pipemare_correction_decay: the moving average's decay gamma:
            ``delta <- gamma * delta + (1 - gamma) * (w_new - w_old)``.
    """

    learning_rate: float = 0.01
    pipemare_warmup_updates: int = 0
    pipemare_correction: bool = False
    pipemare_correction_decay: float = 0.9

    def __post_init__(self) -> None:
        if not self.learning_rate > 0:
            raise ConfigError("learning_rate", self.learning_rate, "must be > 0")
        if self.pipemare_warmup_updates < 0:
            raise ConfigError("pipemare_warmup_updates", self.pipemare_warmup_updates, "must be >= 0")
        if not 0 <= self.pipemare_correction_decay < 1:
            raise ConfigError("pipemare_correction_decay", self.pipemare_correction_decay, "must be in [0, 1)")

    def step_size(self, update_index: int, stage_delay: int) -> float:
        """The learning rate of update ``update_index`` on a stage whose forward delay is ``stage_delay``."""
        if self.pipemare_warmup_updates == 0:
            return self.learning_rate
        exponent = 1.0 - min(update_index / self.pipemare_warmup_updates, 1.0)
        return float(self.learning_rate / float(max(1, stage_delay)) ** exponent)


@dataclass(frozen=True)
class Emulation:
    """A device of steady speed: every op lasts a given time on the wall clock instead of computing.

    The rank still receives and sends tensors of the model's sizes, dispatches every op, keeps
    weight versions and stashes, and applies updates; only the layers' arithmetic is replaced by
    a wait on a monotonic clock until the op's deadline (its start plus its duration).

    Attributes:
        durations_s: per rank, per op position in its order, the op's wall-clock seconds.
        stash_bytes: per stage, the bytes a forward keeps for its backward (allocated for real).
        weight_stash_bytes: per stage, of those, the bytes a split backward's W still needs after
            its I (I frees the rest); empty: all of them.
        realtime_priority: 1-99: the ranks run under the real-time policy SCHED_RR at this
            priority (root or CAP_SYS_NICE), so that no other program delays a rank's wake-up at
            an op's deadline or its communication threads (the ranks sleep nearly all the time,
            so they take little from others); 0: the OS's normal policy.
    """

    durations_s: tuple[tuple[float, ...], ...]
    stash_bytes: tuple[float, ...]
    weight_stash_bytes: tuple[float, ...] = ()
    realtime_priority: int = 0

    def kept_by_weight_gradient(self, stage: int) -> float:
        """The bytes stage ``stage``'s W frees (the rest of its stash is freed by its I)."""
        return self.weight_stash_bytes[stage] if self.weight_stash_bytes else self.stash_bytes[stage]

    def __post_init__(self) -> None:
        for rank, durations in enumerate(self.durations_s):
            bad = [d for d in durations if not d >= 0]
            if bad:
                raise ConfigError("durations_s", bad[0], f"must be >= 0 (rank {rank})")
        bad_bytes = [b for b in (*self.stash_bytes, *self.weight_stash_bytes) if not b >= 0]
        if bad_bytes:
            raise ConfigError("stash_bytes", bad_bytes[0], "must be >= 0")
        if not 0 <= self.realtime_priority <= MAX_REALTIME_PRIORITY:
            raise ConfigError("realtime_priority", self.realtime_priority, f"must be in 0..{MAX_REALTIME_PRIORITY}")


@dataclass(frozen=True)
class RunConfig:
    """One pipelined run.

    Attributes:
        model: the model to build on every rank.
        schedule: registry key (gpipe, 1f1b, pipedream, 2bw, pipemare, or a schedule with several
            stages per rank or a split backward: interleaved-1f1b, zb-h1, zbv, dualpipev, ...).
        num_stages, num_microbatches, num_minibatches: p, m and K.
        num_ranks: processes; 0 means one per stage (multi-stage schedules put several stages on
            a rank).
        microbatch_size: samples per microbatch.
        partition: per stage, its half-open layer range (the loss layer is the model's last).
        pipemare_update: PipeMare's update cadence, ``"minibatch"`` or ``"microbatch"``.
        training: learning rate and PipeMare options.
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (CUDA).
        device: ``"cpu"`` or ``"cuda"``.
        threads: torch threads per rank.
        comm_timeout_s: torch.distributed's timeout for a blocked collective or receive.
        trace_out: where rank 0 writes the trace (JSON), or "" for nowhere.
        weights_out: a folder where each rank saves its stages' final weights, or "".
        emulation: op durations for ``--compute emulated`` (None: the layers compute for real).
    """

    model: ModelSpec
    schedule: str
    num_stages: int
    num_microbatches: int
    num_minibatches: int
    microbatch_size: int
    partition: tuple[tuple[int, int], ...]
    pipemare_update: str = "minibatch"
    training: TrainingOptions = field(default_factory=TrainingOptions)
    backend: str = "gloo"
    device: str = "cpu"
    threads: int = 1
    comm_timeout_s: float = 600.0
    trace_out: str = ""
    weights_out: str = ""
    num_ranks: int = 0
    emulation: Emulation | None = None

    @property
    def compute(self) -> str:
        """``"emulated"`` when ops wait out given durations, else ``"real"``."""
        return "real" if self.emulation is None else "emulated"

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ConfigError("schedule", self.schedule, f"unknown schedule; known: {', '.join(SCHEDULES)}")
        if self.backend not in BACKENDS:
            raise ConfigError("backend", self.backend, f"must be one of {', '.join(BACKENDS)}")
        if self.device not in ("cpu", "cuda"):
            raise ConfigError("device", self.device, "must be cpu or cuda")
        if self.backend == "nccl" and self.device != "cuda":
            raise ConfigError("backend", self.backend, "nccl needs --device cuda")
        if self.microbatch_size < 1:
            raise ConfigError("microbatch_size", self.microbatch_size, "must be >= 1")
        if self.threads < 1:
            raise ConfigError("threads", self.threads, "must be >= 1")
        if len(self.partition) != self.num_stages:
            raise ConfigError("partition", [list(r) for r in self.partition],
                              f"must have one range per stage ({self.num_stages})")
        if self.pipemare_update not in ("minibatch", "microbatch"):
            raise ConfigError("pipemare_update", self.pipemare_update, "must be minibatch or microbatch")
        if self.num_ranks < 0:
            raise ConfigError("num_ranks", self.num_ranks, "must be >= 1 (or 0: one per stage)")

    def build_schedule(self) -> Schedule:
        """The Schedule this run interprets (the same object the engines simulate)."""
        return run_schedule(self.schedule, self.num_stages, self.num_microbatches, self.num_minibatches,
                            pipemare_update=self.pipemare_update, num_ranks=self.num_ranks)

    def to_json(self) -> str:
        """JSON text (sorted keys)."""
        data = asdict(self)
        data["model"] = self.model.to_dict()
        data["partition"] = [list(r) for r in self.partition]
        return json.dumps(data, sort_keys=True, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        """Inverse of ``to_json``."""
        data = json.loads(text)
        data["model"] = ModelSpec.from_dict(data["model"])
        data["training"] = TrainingOptions(**data["training"])
        data["partition"] = tuple((int(a), int(b)) for a, b in data["partition"])
        emulation = data.get("emulation")
        if emulation is not None:
            data["emulation"] = Emulation(durations_s=tuple(tuple(float(d) for d in rank)
                                                            for rank in emulation["durations_s"]),
                                          stash_bytes=tuple(float(b) for b in emulation["stash_bytes"]),
                                          weight_stash_bytes=tuple(float(b) for b in
                                                                   emulation.get("weight_stash_bytes", ())),
                                          realtime_priority=int(emulation.get("realtime_priority", 0)))
        return cls(**data)

    def with_outputs(self, trace_out: str | Path = "", weights_out: str | Path = "") -> RunConfig:
        """A copy writing its trace and weights where asked."""
        return replace(self, trace_out=str(trace_out), weights_out=str(weights_out))


def default_minibatches(schedule: str, num_minibatches: int | None) -> int:
    """K when none is given: the simulator's default."""
    return num_minibatches if num_minibatches is not None else default_num_minibatches(schedule)


def check_partition(partition: tuple[tuple[int, int], ...], num_layers: int) -> None:
    """The ranges must tile ``0..num_layers`` in order, each non-empty.

    Raises:
        ConfigError: they do not.
    """
    expected = 0
    for index, (start, end) in enumerate(partition):
        if start != expected or end <= start:
            raise ConfigError("partition", [list(r) for r in partition],
                              f"stage {index} is [{start}, {end}) but must start at {expected} and be non-empty")
        expected = end
    if expected != num_layers:
        raise ConfigError("partition", [list(r) for r in partition],
                          f"must end at the number of layers ({num_layers}, the loss included), ends at {expected}")


def spec_of(profile: Profile, source: str | None = None) -> ModelSpec | None:
    """The ModelSpec a harness profile was measured on (kept in its ``source``), or None.

    Raises:
        ConfigError: a ``source`` with the harness's prefix but no model after it, naming the
            profile's file ``source``.
    """
    if not profile.source.startswith(SOURCE_PREFIX):
        return None
    try:
        data = json.loads(profile.source[len(SOURCE_PREFIX):])
        if not isinstance(data, dict):
            raise TypeError(f"holds a JSON {type(data).__name__}, not an object")
        return ModelSpec.from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"source.{exc.field}", exc.value, exc.rule, source=source) from None
    except (ValueError, KeyError, TypeError) as exc:
        reason = f"lacks {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ConfigError("source", profile.source, f"must name the model pipesim profile measured after "
                          f"{SOURCE_PREFIX!r}: {reason}", source=source) from None


def model_to_rebuild(spec: ModelSpec, named: str | None, source: str) -> ModelSpec:
    """The model a run rebuilds for the profile ``source`` measured on ``spec``: a built-in model
    from the profile alone (its sizes are data), a user's model only as named on the command line
    (``named``), since a profile is a file people share and must never run code.

    Raises:
        ConfigError: the profile names a user model that ``named`` does not, showing the
            profile's source and what to type; or ``named`` is a built-in model other than the
            profile's.
    """
    if named is None:
        if spec.name in BUILTIN_MODELS:
            return spec
        raise ConfigError("source.model", spec.name, "is a user model, whose code pipesim runs only when you name it "
                          f"yourself: add --model {spec.name} (or the path where that file is here) if you trust it",
                          source=source)
    if (named in BUILTIN_MODELS or spec.name in BUILTIN_MODELS) and named != spec.name:
        raise ConfigError("model", named, f"the profile was measured on {spec.name!r}", source=source)
    return replace(spec, name=named)


# Samples per microbatch of a built-in model when none is given: ops of milliseconds on one CPU core.
DEFAULT_MICROBATCH_SIZE = {"mlp": 64, "transformer": 1, "null": 1}


def default_microbatch_size(model: str) -> int:
    """The microbatch size of a built-in model when none is given.

    Raises:
        ConfigError: ``model`` is a user's model, whose right size only its user knows.
    """
    if model not in DEFAULT_MICROBATCH_SIZE:
        raise ConfigError("microbatch_size", None, f"give --microbatch-size for the user model {model!r} "
                                                   f"(built-in models have defaults: "
                                                   f"{', '.join(f'{k} {v}' for k, v in DEFAULT_MICROBATCH_SIZE.items())})")
    return DEFAULT_MICROBATCH_SIZE[model]


def summarize(samples: list[float], statistic: str) -> float:
    """The mean or the median of ``samples``."""
    return statistics.fmean(samples) if statistic == "mean" else statistics.median(samples)


def run_schedule(schedule: str, num_stages: int, num_microbatches: int, num_minibatches: int, *,
                 pipemare_update: str, num_ranks: int) -> Schedule:
    """The Schedule a harness run of these settings interprets (``num_ranks`` 0: one per stage).

    Raises:
        ConfigError: a shape the schedule cannot take (counts, ranks, stages per rank).
    """
    options: dict[str, Any] = {"update": pipemare_update} if schedule == "pipemare" else {}
    if num_ranks:
        options["num_ranks"] = num_ranks
    return build_schedule(schedule, num_stages, num_microbatches, num_minibatches=num_minibatches, **options)


def user_model_file(reference: str) -> Path | None:
    """The file of a ``FILE.py:CALLABLE`` model reference (None for a module or a built-in model).

    Raises:
        ConfigError: the file does not exist.
    """
    module = reference.rpartition(":")[0]
    if not module.endswith(".py"):
        return None
    path = Path(module).resolve()
    if not path.is_file():
        raise ConfigError("model", reference, f"file {path} does not exist")
    return path
