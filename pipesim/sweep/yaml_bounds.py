"""Bounds on a sweep spec's YAML: what a few bytes of aliases or digits could make cost without end.

YAML's aliases share one value in many places, so a spec of a few hundred bytes can stand for
billions of items that validation, and an error's repr, would walk (a 454-byte spec took 217 s and
2.4 GB into a MemoryError). Its integers may have more digits than Python's int() converts (a
traceback). Both are refused in one line before any other step.
"""

from __future__ import annotations

from typing import Any

import yaml

from pipesim.errors import ConfigError
from pipesim.spec.files import MAX_INT_DIGITS

# Items (values, keys and containers) a spec may hold once its YAML aliases are expanded: far past a
# real spec (a list of 10,000 seeds), far below the billions a few hundred bytes of aliases nesting
# aliases expand to, which every later step (validation, an error's value) would walk.
MAX_SPEC_ITEMS = 1_000_000


def check_expanded_size(data: Any) -> None:
    """Count the items of ``data`` as if its shared parts (YAML aliases) were copies, each shared
    container once, and refuse past ``MAX_SPEC_ITEMS`` or a container that holds itself.

    Raises:
        ConfigError: the spec expands too far, or refers to itself.
    """
    sizes: dict[int, int] = {}  # per container (by id): its expanded size, -1 while being counted

    def size(node: Any) -> int:
        if not isinstance(node, list | dict | set):
            return 1
        known = sizes.get(id(node))
        if known == -1:
            raise ConfigError("spec", _short(node), "holds itself through a YAML alias")
        if known is not None:
            return known
        sizes[id(node)] = -1
        total = 1
        for child in [*node.keys(), *node.values()] if isinstance(node, dict) else node:
            total += size(child)
            if total > MAX_SPEC_ITEMS:
                raise ConfigError("spec", _short(node), f"expands to more than {MAX_SPEC_ITEMS:,} items through "
                                  "its YAML aliases")
        sizes[id(node)] = total
        return total

    size(data)


def _short(node: Any) -> str:
    """A container named by its kind and length (its repr could be the very size refused)."""
    return f"<a {type(node).__name__} of {len(node):,} items>"


def construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    """YAML's int, refusing more digits than Python converts (a traceback otherwise)."""
    digits = str(node.value).replace("_", "").lstrip("+-")
    if len(digits) > MAX_INT_DIGITS and digits.isdigit():
        raise ConfigError("integer", digits[:20] + "...", f"has {len(digits):,} digits at line "
                          f"{node.start_mark.line + 1}; pipesim reads at most {MAX_INT_DIGITS:,}")
    return int(yaml.SafeLoader.construct_yaml_int(loader, node))
