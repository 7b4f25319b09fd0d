"""Running the CLI through its real entry point: ``python -m pipesim`` from the repository root, or its
``main`` in this process."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VGG = str(ROOT / "traces" / "vgg16.json")


def pipesim(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``pipesim ARGS`` in a subprocess, output captured as text."""
    return subprocess.run([sys.executable, "-m", "pipesim", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def in_process(*args: str) -> subprocess.CompletedProcess[str]:
    """``pipesim ARGS`` through the CLI's entry point in this process (no interpreter start-up):
    its exit status and what it printed. For commands whose checks do not read the command line."""
    from pipesim.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exit_:
            code = int(exit_.code or 0)
    return subprocess.CompletedProcess(["pipesim", *args], code, out.getvalue(), err.getvalue())
