"""Sweep specs: the YAML form, validated with pydantic, and its expansion into points."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BeforeValidator, Field, ValidatorFunctionWrapHandler, WrapValidator, model_validator

from pipesim.engine.noise import MAX_CV
from pipesim.errors import ConfigError
from pipesim.schedule.registry import SCHEDULES, default_num_minibatches, unknown_schedule_rule
from pipesim.spec.files import load_profile, load_topology, read_text
from pipesim.spec.provenance import file_identity, text_identity
from pipesim.spec.profile import Profile, uniform_profile
from pipesim.spec.topology import Topology
from pipesim.spec.validation import Bool, FrozenModel, build
from pipesim.sweep.where import Expression
from pipesim.sweep.yaml_bounds import check_expanded_size, construct_int
from pipesim.spec.units import parse_bandwidth, parse_duration, parse_size

MAX_POINTS = 2_000_000
MAX_RANGE = 100_000
MAX_SEED = 2**63 - 1  # a table's seed column holds int64

# Spec key -> row column, in the order the cartesian product nests (the last varies fastest).
AXES: dict[str, str] = {
    "profile": "profile",
    "topology": "topology",
    "bandwidth": "bandwidth_bytes_per_s",
    "latency": "latency_s",
    "stages": "num_stages",
    "microbatches": "num_microbatches",
    "minibatches": "num_minibatches",
    "schedule": "schedule",
    "partition": "partition_strategy",
    "recompute": "recompute",
    "memory_limit": "memory_limit_bytes",
    "optimizer_state": "optimizer_state_multiplier",
    "pipemare_update": "pipemare_update",
    "jitter": "jitter",
    "seed": "seed",
    "stages_per_rank": "stages_per_rank",
}


def _axis(value: Any) -> Any:
    """A scalar, a list, or ``{range: [a, b]}`` / ``{range: [a, b, step]}`` / ``{range: [a, b], step: s}``."""
    if isinstance(value, dict) and ("range" in value or "step" in value):
        if set(value) - {"range", "step"} or "range" not in value:
            raise ValueError(f"must be a list, a value or {{range: [first, last], step: s}}, got keys {sorted(value)}")
        bounds = value["range"]
        if not isinstance(bounds, list) or len(bounds) not in (2, 3):
            raise ValueError(f"range must be [first, last] or [first, last, step], got {bounds!r}")
        step = bounds[2] if len(bounds) == 3 else value.get("step", 1)
        first, last = bounds[0], bounds[1]
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (first, last, step)):
            raise ValueError(f"range bounds and step must be integers, got {bounds!r} step {step!r}")
        if step < 1 or last < first:
            raise ValueError(f"range needs first <= last and step >= 1, got [{first}, {last}] step {step}")
        if (last - first) // step + 1 > MAX_RANGE:
            raise ValueError(f"range has more than {MAX_RANGE} values")
        return tuple(range(first, last + 1, step))
    if isinstance(value, list | tuple):
        if not value:
            raise ValueError("must not be empty")
        return tuple(value)
    return (value,)


PositiveInts = Annotated[tuple[Annotated[int, Field(ge=1, strict=True)], ...], BeforeValidator(_axis)]
Seeds = Annotated[tuple[Annotated[int, Field(ge=0, le=MAX_SEED, strict=True)], ...], BeforeValidator(_axis)]
Quantities = Annotated[tuple[str | float, ...], BeforeValidator(_axis)]


class UniformProfileSpec(FrozenModel):
    """``{uniform: {...}}``: a synthetic profile of identical layers (times in milliseconds)."""

    layers: int = Field(ge=1, strict=True)
    forward_ms: float = Field(ge=0)
    backward_ms: float = Field(ge=0)
    activation_bytes: float = Field(default=0.0, ge=0)
    param_bytes: float = Field(default=0.0, ge=0)
    stash_bytes: float | None = Field(default=None, ge=0)
    microbatch_size: int = Field(default=1, ge=1)

    def label(self) -> str:
        """The profile's name in result rows."""
        return (f"uniform(layers={self.layers},forward_ms={_number(self.forward_ms)},"
                f"backward_ms={_number(self.backward_ms)},activation_bytes={_number(self.activation_bytes)},"
                f"param_bytes={_number(self.param_bytes)})")

    def build(self) -> Profile:
        """The Profile."""
        return uniform_profile(
            num_layers=self.layers, forward_s=self.forward_ms / 1e3, backward_s=self.backward_ms / 1e3,
            activation_bytes=self.activation_bytes, param_bytes=self.param_bytes, stash_bytes=self.stash_bytes,
            microbatch_size=self.microbatch_size,
        )


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


ZeroStages = Annotated[tuple[Literal[0, 1, 2, 3], ...], BeforeValidator(_axis)]


class ModelProfileSpec(FrozenModel):
    """``{model: {preset: NAME, ...}}``: a transformer's profile (``pipesim.transformer_profile``).

    ``preset`` is a preset name or a model file (``pipesim.spec.model_files``; a relative path from
    the spec's folder). ``dp``, ``cp``,
    ``ep`` and ``zero`` (data-, context- and expert-parallel degrees of the job around the
    simulated pipeline, and its ZeRO stage) are axes: each takes a list, and the item stands for
    one profile per combination, each labelled with its values. With ``zero`` 1 or more each
    layer states its Adam state and gradients as ZeRO shards them, in place of the
    ``optimizer_state`` axis.
    """

    preset: str
    device: str = "h100"
    microbatch_size: int = Field(default=1, ge=1)
    seq_len: int | None = Field(default=None, ge=1)
    tp: int = Field(default=1, ge=1)
    recompute: Literal["none", "selective", "full"] = "none"
    dp: PositiveInts = (1,)
    cp: PositiveInts = (1,)
    ep: PositiveInts = (1,)
    zero: ZeroStages = (0,)

    def variants(self) -> list[ModelProfileSpec]:
        """One spec per combination of the ``dp``, ``cp``, ``ep`` and ``zero`` axes."""
        return [self.model_copy(update={"dp": (dp,), "cp": (cp,), "ep": (ep,), "zero": (zero,)})
                for dp, cp, ep, zero in itertools.product(self.dp, self.cp, self.ep, self.zero)]

    def label(self) -> str:
        """The profile's name in result rows (of one variant; the degrees past tp shown where set)."""
        extra = "".join(f",{name}={values[0]}" for name, values in
                        (("dp", self.dp), ("cp", self.cp), ("ep", self.ep), ("zero", self.zero)) if values != (
                            0 if name == "zero" else 1,))
        return (f"model({self.preset},device={self.device},microbatch_size={self.microbatch_size},"
                f"seq_len={self.seq_len or 'default'},tp={self.tp},recompute={self.recompute}{extra})")

    def build(self, base_dir: Path | None = None) -> Profile:
        """The Profile (of one variant); a model file's relative path is taken from ``base_dir``."""
        from pipesim.spec.model_files import load_model
        from pipesim.spec.transformer import PRESETS, preset
        from pipesim.spec.transformer_profile import transformer_profile

        path = Path(self.preset) if base_dir is None or Path(self.preset).is_absolute() else base_dir / self.preset
        if self.preset.strip().lower() in PRESETS or not path.exists():
            config = preset(self.preset)  # an unknown name is refused with the presets listed
        else:
            config = load_model(str(path))
        return transformer_profile(config, device=self.device, microbatch_size=self.microbatch_size,
                                   seq_len=self.seq_len, tp=self.tp, recompute=self.recompute, dp=self.dp[0],
                                   cp=self.cp[0], ep=self.ep[0], zero=self.zero[0], layer_state=self.zero[0] >= 1)


class ProfileEntry(FrozenModel):
    """One ``profile:`` item given as a mapping: ``{uniform: {...}}`` or ``{model: {...}}``."""

    uniform: UniformProfileSpec | None = None
    model: ModelProfileSpec | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> ProfileEntry:
        if (self.uniform is None) == (self.model is None):
            raise ValueError("give exactly one of uniform: {...} or model: {...}")
        return self

    @property
    def entry(self) -> UniformProfileSpec | ModelProfileSpec:
        """The synthetic profile this item describes."""
        if self.uniform is not None:
            return self.uniform
        assert self.model is not None  # the validator holds exactly one
        return self.model

    @property
    def entries(self) -> list[UniformProfileSpec | ModelProfileSpec]:
        """The profiles this item stands for: one, or a model's variants (``ModelProfileSpec.variants``)."""
        if self.model is not None:
            return list(self.model.variants())
        assert self.uniform is not None  # the validator holds exactly one
        return [self.uniform]


def _profile_item(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A file name, or a mapping validated as a ProfileEntry alone, so that its errors name its
    fields (``profile[0].uniform.forward_ms``) rather than the file name the union also tried."""
    if isinstance(value, dict):
        return ProfileEntry.model_validate(value)
    if not isinstance(value, str | ProfileEntry):
        raise ValueError("must be a file name, {uniform: {...}} or {model: {...}}")
    return handler(value)


ProfileItem = Annotated[str | ProfileEntry, WrapValidator(_profile_item)]


class SweepSpec(FrozenModel):
    """A sweep: lists or ranges per input; their cartesian product, filtered by ``where``, is the set of points.

    Every list field also takes a single value. Integer fields take ``{range: [first, last]}``
    (inclusive) with an optional step. Bandwidths and latencies take units (``10GB/s``, ``5us``)
    or plain bytes/s and seconds; memory limits take sizes (``16GB``).

    Attributes:
        profile: profile files (pipesim JSON or PipeDream graph.txt), ``{uniform: {...}}`` or
            ``{model: {preset, device, microbatch_size, seq_len, tp, recompute, dp, cp, ep, zero}}``
            (the last four axes: ``ModelProfileSpec``); a top-level
            ``model:`` (names or such mappings) stands in for ``profile:``.
        topology: topology files; exclusive with bandwidth and latency.
        bandwidth, latency: of a uniform topology with one device per stage (default: free links).
        stages, microbatches: p and m (required).
        stages_per_rank: model stages V on each device (default 1); p must be a multiple of V,
            and schedules with several stages per device (interleaved-1f1b, zbv, ...) need V > 1.
        minibatches: K; default: 1 for flush schedules, 4 for asynchronous ones.
        schedule: registry keys.
        partition: ``balanced`` (compute-balanced, the default) or ``even`` (equal layer counts).
        recompute: activation recomputation on or off.
        memory_limit: device memory; rows say whether the peak fits (default: no limit).
        optimizer_state: optimizer state bytes per weight byte.
        pipemare_update: PipeMare's update cadence.
        jitter, seed: per-op noise (coefficient of variation) and its seeds.
        where: a filter over a point's fields (see pipesim.sweep.where).
        engine: ``auto`` (the analytic engine where it applies), ``analytic`` or ``des``.
    """

    profile: Annotated[tuple[ProfileItem, ...], BeforeValidator(_axis)]
    topology: Annotated[tuple[str, ...], BeforeValidator(_axis)] = ()
    bandwidth: Quantities = ()
    latency: Quantities = ()
    stages: PositiveInts
    microbatches: PositiveInts
    stages_per_rank: PositiveInts = (1,)
    minibatches: Annotated[tuple[Annotated[int, Field(ge=1, strict=True)] | None, ...], BeforeValidator(_axis)] = (None,)
    schedule: Annotated[tuple[str, ...], BeforeValidator(_axis)]
    partition: Annotated[tuple[Literal["balanced", "even"], ...], BeforeValidator(_axis)] = ("balanced",)
    recompute: Annotated[tuple[Bool, ...], BeforeValidator(_axis)] = (False,)
    memory_limit: Annotated[tuple[str | float | None, ...], BeforeValidator(_axis)] = (None,)
    optimizer_state: Annotated[tuple[Annotated[float, Field(ge=0)], ...], BeforeValidator(_axis)] = (1.0,)
    pipemare_update: Annotated[tuple[Literal["minibatch", "microbatch"], ...], BeforeValidator(_axis)] = ("minibatch",)
    jitter: Annotated[tuple[Annotated[float, Field(ge=0, le=MAX_CV)], ...], BeforeValidator(_axis)] = (0.0,)
    seed: Seeds = Field(default=(0,), alias="seeds")
    where: str | None = None
    engine: Literal["auto", "analytic", "des"] = "auto"

    model_config = FrozenModel.model_config | {"populate_by_name": True}


def _quantity(value: str | float, parse: Any, field: str) -> float:
    """A number as is (bytes/s, seconds, bytes), or a string with a unit through ``parse``."""
    if isinstance(value, str):
        return float(parse(value, field))
    if math.isnan(value) or value < 0:
        raise ConfigError(field, value, "must be a number >= 0 or a string with a unit")
    return float(value)


def parse_spec(data: Any, *, source: str | None = None) -> SweepSpec:
    """Validate a spec mapping.

    Raises:
        ConfigError: naming the first bad field, its value and the rule.
    """
    if not isinstance(data, dict):
        raise ConfigError("spec", type(data).__name__, "must be a mapping of fields", source=source)
    if "model" in data:  # ``model: NAME``, ``model: {preset: ...}`` or a list of them, in place of profile
        if "profile" in data:
            raise ConfigError("model", data["model"], "give either model or profile, not both", source=source)
        models = data["model"] if isinstance(data["model"], list) else [data["model"]]
        data = {key: value for key, value in data.items() if key != "model"}
        data["profile"] = [{"model": {"preset": item} if isinstance(item, str) else item} for item in models]
    spec = build(SweepSpec, data, source=source)
    try:
        _check(spec)
    except ConfigError as exc:
        raise ConfigError(exc.field, exc.value, exc.rule, source=source) from None
    return spec


def _check(spec: SweepSpec) -> None:
    """The rules pydantic's field types do not state."""
    for index, name in enumerate(spec.schedule):
        if name not in SCHEDULES:
            raise ConfigError(f"schedule[{index}]", name, unknown_schedule_rule(name))
    if spec.topology and (spec.bandwidth or spec.latency):
        raise ConfigError("topology", list(spec.topology), "give either topology or bandwidth/latency, not both")
    for index, bandwidth in enumerate(spec.bandwidth):
        _quantity(bandwidth, parse_bandwidth, f"bandwidth[{index}]")
    for index, latency in enumerate(spec.latency):
        _quantity(latency, parse_duration, f"latency[{index}]")
    for index, limit in enumerate(spec.memory_limit):
        if limit is not None:
            _quantity(limit, parse_size, f"memory_limit[{index}]")
    _check_repeats(spec)
    if spec.where is not None:
        Expression(spec.where, where_fields())


def _check_repeats(spec: SweepSpec) -> None:
    """A value listed twice in one axis (``stages: [2, 2]``, or ``10GB/s`` beside ``10000MB/s``)
    would simulate each of its points twice, as a second row."""
    parsers = {"bandwidth": parse_bandwidth, "latency": parse_duration, "memory_limit": parse_size}
    for key in AXES:
        name = "seeds" if key == "seed" else key
        seen: set[Any] = set()
        for index, value in enumerate(getattr(spec, key)):
            parse = parsers.get(key)
            same = _quantity(value, parse, f"{name}[{index}]") if parse and value is not None else value
            if same in seen:
                shown = value.model_dump(exclude_defaults=True) if isinstance(value, ProfileEntry) else value
                raise ConfigError(f"{name}[{index}]", shown, "is listed twice")
            seen.add(same)


def load_spec(path: str | Path) -> SweepSpec:
    """Read and validate a YAML (or JSON) sweep spec.

    Raises:
        ConfigError: an unreadable file, bad YAML, or a bad field.
    """
    text = read_text(path, "spec")
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader refusing repeated keys
        check_expanded_size(data)
    except RecursionError:
        raise ConfigError("spec", str(path), "is nested too deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        raise ConfigError("spec", str(path), f"is not valid YAML: {problem}{where}") from None
    except ConfigError as exc:
        raise ConfigError(exc.field, exc.value, exc.rule, source=str(path)) from None
    return parse_spec(data, source=str(path))


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader refusing a key given twice in one mapping (YAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        lines: dict[Any, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *base``: its keys may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = lines.get(key)
            except TypeError:  # an unhashable key: the base class refuses it
                continue
            if first is not None:
                lines_text = f"lines {first} and {line}" if first != line else f"line {line}"
                raise ConfigError(str(key), self.construct_object(value_node, deep=True),
                                  f"is given twice in one mapping ({lines_text})")
            lines[key] = line
        return super().construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", construct_int)  # at most 4,300 digits, as int()


def where_fields() -> tuple[str, ...]:
    """Names a ``where`` expression may use: spec keys and row columns, plus ``layers``."""
    return (*AXES, *AXES.values(), "layers")


class Resolved:
    """A spec with its files loaded: profiles, topologies and parsed quantities, ready to expand.

    Attributes:
        spec: the spec; profiles: (label, Profile) per profile item; topologies: (label, Topology).
        inputs: ``{"profiles": [...], "topologies": [...]}``, each input's name and SHA-256
            (``pipesim.spec.provenance``), for the table's ``run`` record.
        bandwidths, latencies, memory_limits: values in bytes/s, seconds and bytes (None: no limit).
    """

    def __init__(self, spec: SweepSpec, *, base_dir: Path | None = None) -> None:
        self.spec = spec
        base = base_dir or Path.cwd()
        self.profiles: list[tuple[str, Profile]] = []
        self.inputs: dict[str, list[dict[str, str]]] = {"profiles": [], "topologies": []}
        for index, item in enumerate(spec.profile):
            if isinstance(item, str):
                path = Path(item) if Path(item).is_absolute() else base / item
                self.profiles.append((item, load_profile(path)))
                self.inputs["profiles"].append(file_identity(path))
                continue
            for entry in item.entries:
                try:
                    built = entry.build(base) if isinstance(entry, ModelProfileSpec) else entry.build()
                except ConfigError as exc:  # a model the spec names but the presets lack, say: its field in the spec
                    kind = "model" if item.model is not None else "uniform"
                    field = "preset" if kind == "model" and exc.field == "model" else exc.field  # the spec's key
                    raise ConfigError(f"profile[{index}].{kind}.{field}", exc.value, exc.rule) from None
                self.profiles.append((entry.label(), built))
                self.inputs["profiles"].append(text_identity(entry.label(), entry.label()))
        self.topologies: list[tuple[str, Topology | None]] = [
            (item, load_topology(Path(item) if Path(item).is_absolute() else base / item)) for item in spec.topology
        ] or [("", None)]
        self.inputs["topologies"] = [file_identity(Path(item) if Path(item).is_absolute() else base / item)
                                     for item in spec.topology]
        self.bandwidths = [_quantity(b, parse_bandwidth, "bandwidth") for b in spec.bandwidth] or [math.inf]
        self.latencies = [_quantity(x, parse_duration, "latency") for x in spec.latency] or [0.0]
        self.memory_limits: list[float | None] = [
            None if x is None else _quantity(x, parse_size, "memory_limit") for x in spec.memory_limit
        ]

    def digest(self) -> str:
        """A hash of everything that decides the rows: the spec, the profiles' and topologies' contents."""
        from pipesim import __version__

        payload = {
            "spec": self.spec.model_dump(mode="json", by_alias=False),
            "profiles": [profile.model_dump(mode="json") for _, profile in self.profiles],
            "topologies": [t.model_dump(mode="json") if t else None for _, t in self.topologies],
            "version": __version__,
        }
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def points(self) -> list[dict[str, Any]]:
        """The points in order: the cartesian product (first axis outermost) filtered by ``where``.

        Each point maps the row columns of AXES to values (``profile`` and ``topology`` as
        indices into ``profiles`` and ``topologies``) and ``point`` to its index.

        Raises:
            ConfigError: more than MAX_POINTS combinations, or ``where`` fails on a point.
        """
        spec = self.spec
        axes: list[tuple[Any, ...]] = [
            tuple(range(len(self.profiles))), tuple(range(len(self.topologies))), tuple(self.bandwidths),
            tuple(self.latencies), spec.stages, spec.microbatches, spec.minibatches, spec.schedule,
            spec.partition, spec.recompute, tuple(self.memory_limits), spec.optimizer_state,
            spec.pipemare_update, spec.jitter, spec.seed, spec.stages_per_rank,
        ]
        total = math.prod(len(axis) for axis in axes)
        if total > MAX_POINTS:
            raise ConfigError("spec", total, f"the cartesian product has more than {MAX_POINTS} points")
        columns = list(AXES.values())
        points: list[dict[str, Any]] = []
        for values in self._kept(axes):
            point = dict(zip(columns, values, strict=True))
            if point["num_minibatches"] is None:
                point["num_minibatches"] = default_num_minibatches(point["schedule"])
            point["point"] = len(points)
            points.append(point)
        return points

    def _kept(self, axes: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """The combinations of ``axes`` that ``where`` keeps, in product order, walking the product
        depth first and cutting it at each axis ``where`` reads once no kept combination starts so."""
        if not self.spec.where:
            return list(itertools.product(*axes))
        allowed, order = self._allowed(axes)
        starts = [{combination[:size] for combination in allowed} for size in range(len(order) + 1)]
        rank = {axis: index for index, axis in enumerate(order)}
        kept: list[tuple[Any, ...]] = []
        chosen: list[Any] = []

        def walk(depth: int, read: tuple[Any, ...]) -> None:
            if depth == len(axes):
                kept.append(tuple(chosen))
                return
            index = rank.get(depth)
            for value in axes[depth]:
                now = read if index is None else (*read, value)
                if index is not None and now not in starts[index + 1]:
                    continue
                chosen.append(value)
                walk(depth + 1, now)
                chosen.pop()

        walk(0, ())
        return kept

    def _allowed(self, axes: list[tuple[Any, ...]]) -> tuple[set[tuple[Any, ...]], list[int]]:
        """The ``where`` filter evaluated once per combination of the axes it reads: the
        combinations it keeps, and the indices of those axes, in order."""
        keep = Expression(self.spec.where or "True", where_fields())
        columns = list(AXES.values())
        # An axis is read if the expression names its spec key or its column; layers come with
        # the profile, and minibatches default by schedule.
        read = {i for i, (key, column) in enumerate(AXES.items()) if {key, column} & keep.names}
        if "layers" in keep.names:
            read.add(columns.index("profile"))
        if columns.index("num_minibatches") in read:
            read.add(columns.index("schedule"))
        order = sorted(read)
        allowed = set()
        for values in itertools.product(*(axes[i] for i in order)):
            point: dict[str, Any] = dict.fromkeys(columns)
            point.update({columns[i]: value for i, value in zip(order, values, strict=True)})
            if point["num_minibatches"] is None and point["schedule"] is not None:
                point["num_minibatches"] = default_num_minibatches(point["schedule"])
            if keep(self._fields(point)):
                allowed.add(values)
        return allowed, order

    def _fields(self, point: dict[str, Any]) -> dict[str, Any]:
        """A point's values under every name ``where`` may use (labels for profile and topology)."""
        fields = dict(point)
        if point["profile"] is not None:
            fields["profile"] = self.profiles[point["profile"]][0]
            fields["layers"] = self.profiles[point["profile"]][1].num_layers
        if point["topology"] is not None:
            fields["topology"] = self.topologies[point["topology"]][0]
        for key, column in AXES.items():
            fields[key] = fields[column]
        return fields
