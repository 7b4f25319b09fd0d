"""Data files shipped in the package (``pipesim/data/<kind>/<name>.json``): their names and texts."""

from __future__ import annotations

from importlib import resources


def shipped_names(kind: str) -> tuple[str, ...]:
    """The names of the files shipped under ``pipesim/data/<kind>/``, sorted."""
    folder = resources.files("pipesim.data").joinpath(kind)
    if not folder.is_dir():
        return ()
    return tuple(sorted(entry.name.removesuffix(".json") for entry in folder.iterdir() if entry.name.endswith(".json")))


def shipped_text(kind: str, name: str) -> tuple[str, str] | None:
    """``(text, where)`` of the shipped file ``name`` (case-insensitive), or None when there is none."""
    key = name.strip().lower()
    if key not in shipped_names(kind):
        return None
    return (resources.files("pipesim.data").joinpath(kind, f"{key}.json").read_text(encoding="utf-8"),
            f"pipesim/data/{kind}/{key}.json")
