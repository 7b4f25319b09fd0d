"""Parsing of quantities with units at the edges: bandwidths, durations and byte sizes."""

from __future__ import annotations

import math
import re
import sys

from pipesim.errors import ConfigError

_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"

# Bytes per second for each accepted bandwidth unit (decimal prefixes, as link vendors quote them).
BANDWIDTH_UNITS: dict[str, float] = {
    "B/s": 1.0,
    "KB/s": 1e3,
    "MB/s": 1e6,
    "GB/s": 1e9,
    "TB/s": 1e12,
    "bit/s": 1 / 8,
    "Kbit/s": 1e3 / 8,
    "Mbit/s": 1e6 / 8,
    "Gbit/s": 1e9 / 8,
    "Tbit/s": 1e12 / 8,
}

# Seconds for each accepted duration unit.
DURATION_UNITS: dict[str, float] = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}

# Bytes for each accepted size unit; GiB-style binary prefixes are accepted too.
SIZE_UNITS: dict[str, float] = {
    "B": 1.0,
    "KB": 1e3,
    "MB": 1e6,
    "GB": 1e9,
    "TB": 1e12,
    "KiB": 2.0**10,
    "MiB": 2.0**20,
    "GiB": 2.0**30,
    "TiB": 2.0**40,
}


def _parse(text: str, units: dict[str, float], field: str) -> float:
    accepted = ", ".join(units)
    match = re.fullmatch(_NUMBER + r"\s*([A-Za-z/]+)", text.strip())
    if match is None:
        raise ConfigError(field, text, f"must be a number with a unit, one of {accepted}")
    number, unit = match.groups()
    if unit not in units:
        raise ConfigError(field, text, f"unknown unit {unit!r}; accepted: {accepted}")
    # A unit below one is divided by its inverse: 5us is 5 / 1e6 = 5e-06 exactly as written, where
    # 5 x 1e-6 gives 4.9999999999999996e-06 (1e-6 has no exact binary form, 1e6 has).
    inverse = round(1 / units[unit])
    value = float(number) / inverse if units[unit] < 1 and inverse * units[unit] == 1 else float(number) * units[unit]
    if not math.isfinite(value):  # 1e400GB/s would read as free links, 1e400GB as no memory limit
        raise ConfigError(field, text, f"is too large: must be below {sys.float_info.max / units[unit]:.2g}{unit}")
    if value <= 0 and units is not DURATION_UNITS:
        raise ConfigError(field, text, "must be > 0")
    return value


def parse_bandwidth(text: str, field: str = "bandwidth") -> float:
    """Parse a bandwidth such as ``"25Gbit/s"`` or ``"300GB/s"``.

    Returns:
        bytes per second.

    Raises:
        ConfigError: no unit, an unknown unit, a value that is not positive, or one too large for
            a float (which would read as unlimited).
    """
    return _parse(text, BANDWIDTH_UNITS, field)


def parse_duration(text: str, field: str = "latency") -> float:
    """Parse a duration such as ``"5us"`` or ``"1.5ms"``; returns seconds (>= 0)."""
    return _parse(text, DURATION_UNITS, field)


def parse_size(text: str, field: str = "memory") -> float:
    """Parse a byte size such as ``"16GB"`` or ``"80GiB"``; returns bytes."""
    return _parse(text, SIZE_UNITS, field)


def size_unit(text: str) -> str:
    """The unit a size was written in (``"80GiB"`` -> ``"GiB"``), ``"GB"`` when none is recognised."""
    stripped = text.strip()
    for unit in sorted(SIZE_UNITS, key=len, reverse=True):
        if stripped.endswith(unit):
            return unit
    return "GB"


def format_size(num_bytes: float, unit: str) -> str:
    """``num_bytes`` in ``unit`` (one of SIZE_UNITS), e.g. ``"80 GiB"``, ``"81,559 MiB"``."""
    value = num_bytes / SIZE_UNITS[unit]
    return f"{value:,.0f} {unit}" if value >= 1000 or value == int(value) else f"{value:,.2f} {unit}"
