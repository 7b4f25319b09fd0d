"""benchmarks/RESULTS.md is shared: each benchmark owns one marked section and rewrites only that."""

from __future__ import annotations

from pathlib import Path

from pipesim.spec.files import write_text_atomic

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
TITLE = "# Benchmark results\n\nEach section is written by its own benchmark; `make bench` runs them all.\n"


def write_section(name: str, text: str, path: Path = RESULTS) -> None:
    """Replace the section between ``<!-- name:begin -->`` and ``<!-- name:end -->`` (append it if new)."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    section = f"{begin}\n{text.strip()}\n{end}\n"
    existing = path.read_text(encoding="utf-8") if path.exists() else TITLE
    if begin in existing and end in existing:
        head, rest = existing.split(begin, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        updated = head + section + ("\n" + tail if tail else "")
    else:
        updated = existing.rstrip("\n") + "\n\n" + section
    write_text_atomic(path, updated)
