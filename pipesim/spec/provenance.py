"""How outputs name their inputs: a file by its name and the SHA-256 of its bytes, and the command line."""

from __future__ import annotations

import hashlib
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as typed, ``pipesim ARGS``, quoted so that a shell reruns it."""
    return shlex.join(["pipesim", *(sys.argv[1:] if argv is None else argv)])


def file_identity(path: str | Path) -> dict[str, str]:
    """``{"name": file name, "sha256": hex digest of its bytes}``."""
    target = Path(path)
    return {"name": target.name, "sha256": hashlib.sha256(target.read_bytes()).hexdigest()}


def text_identity(name: str, text: str) -> dict[str, str]:
    """The identity of an input given as text rather than a file (``--uniform``, a spec's uniform profile)."""
    return {"name": name, "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}


def named_identity(kind: str, name_or_path: str) -> dict[str, str]:
    """A device, cluster or model named on the command line: a shipped one (``kind`` names its
    package folder) by its name and the SHA-256 of the shipped file, else the file's identity."""
    from pipesim.spec.shipped import shipped_text

    shipped = shipped_text(kind, name_or_path)
    if shipped is not None:
        return text_identity(f"{name_or_path.strip().lower()} (shipped)", shipped[0])
    return file_identity(name_or_path)
