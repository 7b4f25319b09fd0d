"""Saving figures: atomically, with no timestamp in the file so reruns are byte-identical."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any


def use_headless_backend() -> None:
    """Select matplotlib's Agg backend, for commands that only write files."""
    import matplotlib

    matplotlib.use("Agg")


def save_figure(ax: Any, path: str | Path, *, dpi: int = 120) -> Path:
    """Save the figure of ``ax`` to ``path`` (format from the suffix: png, svg, pdf) and close it."""
    import matplotlib.pyplot as plt

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    figure = ax.figure
    figure.tight_layout()
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem}.", suffix=target.suffix)
    os.close(handle)
    metadata: dict[str, Any] = {"png": {"Software": None}, "svg": {"Date": None}, "pdf": {"CreationDate": None}}.get(
        target.suffix.lstrip(".").lower(), {}
    )
    try:
        figure.savefig(temporary, dpi=dpi, metadata=metadata)
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    finally:
        Path(temporary).unlink(missing_ok=True)
        plt.close(figure)
    return target
