"""Named presets (published models, devices): one lookup that names the field and the known names."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from pipesim.errors import ConfigError

T = TypeVar("T")


def lookup(presets: Mapping[str, T], field: str, name: str) -> T:
    """The preset called ``name`` (case-insensitive, keys lower-case).

    Raises:
        ConfigError: an unknown name, for ``field``; the message lists the known ones.
    """
    key = name.strip().lower()
    if key not in presets:
        raise ConfigError(field, name, f"must be one of {', '.join(presets)}")
    return presets[key]
