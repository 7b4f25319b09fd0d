"""benchmarks/RESULTS.md is shared: each benchmark owns one marked section and rewrites only that."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from pipesim.spec.files import write_text_atomic

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
TITLE = "# Benchmark results\n\nEach section is written by its own benchmark; `make bench` runs them all.\n"


def machine() -> str:
    """``nproc N, CPU model, Python X.Y.Z`` for a section's header."""
    # Not os.cpu_count() or `nproc`: the CPUs this process may run on (Dask sets OMP_NUM_THREADS=1,
    # which `nproc` follows).
    nproc = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), model)
    except OSError:
        pass
    return f"nproc {nproc}, {model}, Python {platform.python_version()}"


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
