"""Saving figures: atomically, with no timestamp in the file so reruns are byte-identical."""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Any

FORMATS = ("png", "svg", "pdf")


def _metadata(fmt: str) -> dict[str, Any]:
    return {"png": {"Software": None}, "svg": {"Date": None}, "pdf": {"CreationDate": None}}.get(fmt, {})


def use_headless_backend() -> None:
    """Select matplotlib's Agg backend, for commands that only write files."""
    import matplotlib

    matplotlib.use("Agg")


def save_figure(ax: Any, path: str | Path, *, dpi: int = 120) -> Path:
    """Save the figure of ``ax`` to ``path`` (format from the suffix: png, svg, pdf) and close it."""
    import matplotlib
    import matplotlib.pyplot as plt

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    figure = ax.figure
    figure.tight_layout()
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem}.", suffix=target.suffix)
    os.close(handle)
    try:
        with matplotlib.rc_context({"svg.hashsalt": "pipesim"}):
            figure.savefig(temporary, dpi=dpi, metadata=_metadata(target.suffix.lstrip(".").lower()))
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    finally:
        Path(temporary).unlink(missing_ok=True)
        plt.close(figure)
    return target


def figure_bytes(ax: Any, fmt: str = "png", *, dpi: int = 110) -> bytes:
    """The figure of ``ax`` rendered as ``fmt`` (png, svg or pdf) in memory, deterministically; closes it.

    Raises:
        ValueError: an unknown format.
    """
    import matplotlib
    import matplotlib.pyplot as plt

    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    figure = ax.figure
    figure.tight_layout()
    buffer = io.BytesIO()
    try:
        with matplotlib.rc_context({"svg.hashsalt": "pipesim"}):
            figure.savefig(buffer, format=fmt, dpi=dpi, metadata=_metadata(fmt))
    finally:
        plt.close(figure)
    return buffer.getvalue()
