"""JSON that strict parsers accept: no NaN or Infinity, which Python's json writes by default."""

from __future__ import annotations

import json
import math
from typing import Any


def finite(data: Any, *, drop: bool = False) -> Any:
    """``data`` with every non-finite float replaced by None, or, with ``drop``, its key left out.

    Dropping suits input models whose fields default to infinity (a device's memory, a link's
    bandwidth): reading the file back gives the default, the same value.
    """
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if isinstance(data, dict):
        return {key: finite(value, drop=drop) for key, value in data.items()
                if not (drop and isinstance(value, float) and not math.isfinite(value))}
    if isinstance(data, list | tuple):
        return [finite(value, drop=drop) for value in data]
    return data


def strict_dumps(data: Any, *, indent: int | None = 2, drop: bool = False) -> str:
    """Deterministic strict JSON text (sorted keys) of ``finite(data)``, with a final newline when indented."""
    text = json.dumps(finite(data, drop=drop), sort_keys=True, indent=indent, allow_nan=False)
    return text + "\n" if indent else text
