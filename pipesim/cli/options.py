"""Parsing the CLI's compound option values (--uniform, --partition) into API arguments."""

from __future__ import annotations

from pipesim.errors import ConfigError
from pipesim.spec.profile import Profile, uniform_profile
from pipesim.spec.topology import Topology
from pipesim.units import parse_bandwidth, parse_duration

UNIFORM_KEYS = ("layers", "forward_ms", "backward_ms", "activation_bytes", "param_bytes")


def parse_uniform(text: str) -> Profile:
    """``layers=L,forward_ms=F,backward_ms=B,activation_bytes=A,param_bytes=W`` to a Profile.

    ``activation_bytes`` and ``param_bytes`` default to 0; ``microbatch_size`` may be given.
    """
    values: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError("uniform", item, "must be key=value")
        if key not in (*UNIFORM_KEYS, "microbatch_size"):
            raise ConfigError("uniform", key, f"unknown key; keys: {', '.join(UNIFORM_KEYS)}, microbatch_size")
        values[key] = value
    for key in ("layers", "forward_ms", "backward_ms"):
        if key not in values:
            raise ConfigError("uniform", text, f"must give {key}=...")

    def number(key: str, default: str = "0") -> float:
        raw = values.get(key, default)
        try:
            return float(raw)
        except ValueError:
            raise ConfigError(f"uniform.{key}", raw, "must be a number") from None

    layers = number("layers")
    if layers != int(layers) or layers < 1:
        raise ConfigError("uniform.layers", values["layers"], "must be an integer >= 1")
    batch = number("microbatch_size", "1")
    if batch != int(batch) or batch < 1:
        raise ConfigError("uniform.microbatch_size", values["microbatch_size"], "must be an integer >= 1")
    for key in ("forward_ms", "backward_ms", "activation_bytes", "param_bytes"):
        if number(key) < 0:
            raise ConfigError(f"uniform.{key}", values[key], "must be >= 0")
    return uniform_profile(
        num_layers=int(layers),
        forward_s=number("forward_ms") / 1e3,
        backward_s=number("backward_ms") / 1e3,
        activation_bytes=number("activation_bytes"),
        param_bytes=number("param_bytes"),
        microbatch_size=int(batch),
    )


def parse_partition(text: str) -> tuple[tuple[int, int], ...]:
    """``0:4,4:8,8:12`` to half-open layer ranges per stage."""
    ranges = []
    for item in text.split(","):
        start, sep, end = item.strip().partition(":")
        try:
            if not sep:
                raise ValueError
            ranges.append((int(start), int(end)))
        except ValueError:
            raise ConfigError("partition", item, "each stage must be START:END layer indices, e.g. 0:4,4:8") from None
    return tuple(ranges)


def build_topology(num_devices: int, bandwidth: str | None, latency: str | None) -> Topology:
    """A uniform topology from --bandwidth/--latency (free communication when neither is given)."""
    return Topology.uniform(
        num_devices=num_devices,
        bandwidth=parse_bandwidth(bandwidth, "bandwidth") if bandwidth else float("inf"),
        latency=parse_duration(latency, "latency") if latency else 0.0,
    )
