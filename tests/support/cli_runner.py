"""Running the CLI through its real entry point (``python -m pipesim``) from the repository root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VGG = str(ROOT / "traces" / "vgg16.json")


def pipesim(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``pipesim ARGS`` in a subprocess, output captured as text."""
    return subprocess.run([sys.executable, "-m", "pipesim", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)
