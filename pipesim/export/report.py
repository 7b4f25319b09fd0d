"""Report folders: metrics JSON, trace JSON and a Perfetto trace, each written atomically."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pipesim.export.chrome import chrome_json
from pipesim.spec.files import dumps, write_text_atomic

if TYPE_CHECKING:
    from pipesim.simulation import Result


def write_report(result: Result, out_dir: str | Path) -> list[Path]:
    """Write a Result's data files into ``out_dir``; return the paths written.

    Files: ``metrics.json`` (the ``simulate --json`` object), ``trace.json`` (exact round
    trip through ``Trace.from_json``) and ``trace.perfetto.json`` (Chrome trace format).
    Plots are drawn by the caller with ``pipesim.plots``.
    """
    out = Path(out_dir)
    written = []
    for name, text in (
        ("metrics.json", dumps(result.to_dict())),
        ("trace.json", result.trace.to_json()),
        ("trace.perfetto.json", chrome_json(result.trace)),
    ):
        write_text_atomic(out / name, text)
        written.append(out / name)
    return written
