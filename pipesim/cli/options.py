"""Parsing the CLI's compound option values (--uniform, --partition) into API arguments."""

from __future__ import annotations

import math

import click

from pipesim.errors import ConfigError
from pipesim.spec.profile import MAX_UNIFORM_LAYERS, Profile, uniform_profile
from pipesim.spec.topology import Topology
from pipesim.spec.validation import build
from pipesim.spec.units import parse_bandwidth, parse_duration

UNIFORM_KEYS = ("layers", "forward_ms", "backward_ms", "activation_bytes", "param_bytes")
# Optional keys: split backward (given together), measured spread per layer, the model input
# stage 0 keeps and the loss buffer the last stage keeps per microbatch.
UNIFORM_EXTRA_KEYS = ("backward_input_ms", "backward_weight_ms", "forward_std_ms", "backward_std_ms",
                      "input_bytes", "loss_bytes")
RECOMPUTE_MODES = ("none", "full", "selective")


def plain(text: str) -> str:
    """``text`` if it is a number written the plain way, in ASCII without ``_`` (Python's
    ``float`` and ``int`` also take other scripts' digits and ``1_000``).

    Raises:
        ValueError: as ``float`` does for text that is not a number.
    """
    if not text.isascii() or "_" in text:
        raise ValueError(text)
    return text


def non_empty(context: click.Context, parameter: click.Parameter, value: str | None) -> str | None:
    """A click callback refusing an empty value (``--bandwidth ""``), which would otherwise read as
    the option not given."""
    if value is not None and not value.strip():
        raise ConfigError(parameter.opts[0].lstrip("-").replace("-", "_"), value, "must not be empty")
    return value


def parse_uniform(text: str) -> Profile:
    """``layers=L,forward_ms=F,backward_ms=B,activation_bytes=A,param_bytes=W`` to a Profile.

    ``activation_bytes`` and ``param_bytes`` default to 0; ``microbatch_size`` may be given, and
    so may ``backward_input_ms`` + ``backward_weight_ms`` (split backward) and
    ``forward_std_ms``/``backward_std_ms`` (measured spread, for ``--samples``), and
    ``input_bytes``/``loss_bytes`` (the model input and the loss buffer, per microbatch).
    """
    values: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError("uniform", item, "must be key=value")
        if key not in (*UNIFORM_KEYS, *UNIFORM_EXTRA_KEYS, "microbatch_size"):
            raise ConfigError("uniform", key, f"unknown key; keys: {', '.join(UNIFORM_KEYS)}, microbatch_size, "
                              f"{', '.join(UNIFORM_EXTRA_KEYS)}")
        if key in values:
            raise ConfigError("uniform", text, f"{key} is given twice")
        values[key] = value
    for key in ("layers", "forward_ms", "backward_ms"):
        if key not in values:
            raise ConfigError("uniform", text, f"must give {key}=...")

    def number(key: str, default: str = "0") -> float:
        raw = values.get(key, default)
        try:
            return float(plain(raw))
        except ValueError:
            raise ConfigError(f"uniform.{key}", raw, "must be a number") from None

    layers = number("layers")
    if not 1 <= layers <= MAX_UNIFORM_LAYERS or layers != int(layers):  # the range first: int(inf) raises
        raise ConfigError("uniform.layers", values["layers"], f"must be an integer from 1 to {MAX_UNIFORM_LAYERS:,}")
    batch = number("microbatch_size", "1")
    if not 1 <= batch < math.inf or batch != int(batch):
        raise ConfigError("uniform.microbatch_size", values["microbatch_size"], "must be an integer >= 1")
    for key in ("forward_ms", "backward_ms", "activation_bytes", "param_bytes", *UNIFORM_EXTRA_KEYS):
        if number(key) < 0:
            raise ConfigError(f"uniform.{key}", values[key], "must be >= 0")
    if ("backward_input_ms" in values) != ("backward_weight_ms" in values):
        raise ConfigError("uniform", text, "give backward_input_ms and backward_weight_ms together")

    def optional_s(key: str) -> float | None:
        return number(key) / 1e3 if key in values else None

    return uniform_profile(
        num_layers=int(layers),
        forward_s=number("forward_ms") / 1e3,
        backward_s=number("backward_ms") / 1e3,
        activation_bytes=number("activation_bytes"),
        param_bytes=number("param_bytes"),
        microbatch_size=int(batch),
        backward_input_s=optional_s("backward_input_ms"),
        backward_weight_s=optional_s("backward_weight_ms"),
        forward_std_s=optional_s("forward_std_ms"),
        backward_std_s=optional_s("backward_std_ms"),
        input_bytes=number("input_bytes") if "input_bytes" in values else None,
        loss_bytes=number("loss_bytes") if "loss_bytes" in values else None,
    )


def parse_partition(text: str) -> tuple[tuple[int, int], ...]:
    """``0:4,4:8,8:12`` to half-open layer ranges per stage."""
    ranges = []
    for item in text.split(","):
        start, sep, end = item.strip().partition(":")
        try:
            if not sep:
                raise ValueError
            ranges.append((int(plain(start)), int(plain(end))))
        except ValueError:
            raise ConfigError("partition", item, "each stage must be START:END layer indices, e.g. 0:4,4:8") from None
    expected_start = 0
    for index, (first, last) in enumerate(ranges):
        if first != expected_start or last <= first:
            raise ConfigError("partition", text, f"must be contiguous non-empty ranges from layer 0; stage {index} "
                              f"is {first}:{last} but should start at {expected_start}")
        expected_start = last
    return tuple(ranges)


def check_partition(ranges: tuple[tuple[int, int], ...], text: str, num_stages: int, num_layers: int) -> None:
    """A parsed ``--partition`` must give one range per stage and end at the profile's last layer.

    Raises:
        ConfigError: naming the option, its text and the rule.
    """
    if len(ranges) != num_stages:
        raise ConfigError("partition", text,
                          f"must give one range per stage ({len(ranges)} ranges, {num_stages} stages)")
    if ranges[-1][1] != num_layers:
        raise ConfigError("partition", text, f"must end at the profile's last layer ({num_layers}), "
                          f"ends at {ranges[-1][1]}")


def build_topology(
    num_devices: int,
    bandwidth: str | None,
    latency: str | None,
    *,
    speeds: str | None = None,
    shared: bool = False,
    links: Topology | None = None,
) -> Topology:
    """A uniform topology from --bandwidth/--latency (free communication when neither is given),
    or ``links`` (a model's pipeline, each hop on its tier) where given, with per-device relative
    ``speeds`` (``1,1,0.5,1``) and NICs ``shared`` between flows (the default link's: a model's
    hops between nodes, not its NVLink hops).

    Raises:
        ConfigError: ``shared`` without a bandwidth (free links have nothing to share), a bad
            bandwidth, latency or speed.
    """
    if shared and not bandwidth and links is None:
        raise ConfigError("shared_nics", shared, "needs --bandwidth: links without one are free, so flows have no "
                          "bandwidth to share")
    topology = links if links is not None else Topology.uniform(
        num_devices=num_devices,
        bandwidth=parse_bandwidth(bandwidth, "bandwidth") if bandwidth else float("inf"),
        latency=parse_duration(latency, "latency") if latency else 0.0,
    )
    if speeds is None and not shared:
        return topology
    data = topology.model_dump(by_alias=True)
    data["shared"] = shared
    if speeds is not None:
        values = parse_numbers("speeds", speeds)
        if len(values) != num_devices:
            raise ConfigError("speeds", speeds, f"must give one speed per device ({num_devices}), got {len(values)}")
        for device, speed in zip(data["devices"], values, strict=True):
            device["speed"] = speed
    return build(Topology, data)


def parse_numbers(field: str, text: str) -> list[float]:
    """``1,1,0.5`` to floats.

    Raises:
        ConfigError: an item is not a number.
    """
    values = []
    for item in text.split(","):
        try:
            values.append(float(plain(item)))
        except ValueError:
            raise ConfigError(field, item, "must be a comma-separated list of numbers") from None
    return values


def resolve_stages(num_stages: int | None, num_ranks: int | None, stages_per_rank: int | None) -> tuple[int, int]:
    """``(num_stages, stages_per_rank)`` from --stages and/or --ranks/--stages-per-rank.

    ``--stages P`` alone is P ranks of one stage; ``--ranks R --stages-per-rank V`` is R*V
    stages on R ranks (V defaults to 1).

    Raises:
        ConfigError: neither given, a count below 1, or --stages disagreeing with R*V.
    """
    if stages_per_rank is not None and num_ranks is None:
        raise ConfigError("stages_per_rank", stages_per_rank, "needs --ranks R")
    if num_ranks is None:
        if num_stages is None:
            raise ConfigError("stages", None, "give --stages P or --ranks R [--stages-per-rank V]")
        if num_stages < 1:
            raise ConfigError("stages", num_stages, "must be >= 1")
        return num_stages, 1
    per_rank = 1 if stages_per_rank is None else stages_per_rank
    for field, value in (("ranks", num_ranks), ("stages_per_rank", per_rank)):
        if value < 1:
            raise ConfigError(field, value, "must be >= 1")
    if num_stages is not None and num_stages != num_ranks * per_rank:
        raise ConfigError("stages", num_stages, f"must equal ranks x stages-per-rank ({num_ranks} x {per_rank})")
    return num_ranks * per_rank, per_rank


def parse_recompute_stages(text: str, num_stages: int) -> tuple[str, ...]:
    """``full`` (every stage) or ``full,none,selective,...`` (one per stage).

    Raises:
        ConfigError: an unknown mode or a count other than 1 or ``num_stages``.
    """
    modes = tuple(item.strip() for item in text.split(","))
    for mode in modes:
        if mode not in RECOMPUTE_MODES:
            raise ConfigError("recompute_stages", mode, f"must be one of {', '.join(RECOMPUTE_MODES)}")
    if len(modes) == 1:
        return modes * num_stages
    if len(modes) != num_stages:
        raise ConfigError("recompute_stages", text, f"must give one mode or one per stage ({num_stages})")
    return modes
