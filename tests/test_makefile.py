"""A lighter first run (issue 20 item 9): make demo installs only the simulator; make test adds
torch, numba and the test tools. Checked by make's dry run on a virtual environment not yet made."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def planned(target: str, venv: Path) -> str:
    done = subprocess.run(["make", "-n", target, f"VENV={venv}"], capture_output=True, text=True, cwd=ROOT,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_demo_installs_only_the_simulator_and_test_adds_the_rest(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    demo = planned("demo", venv)
    assert "pip install --quiet -e .\n" in demo and "pipesim simulate --profile traces/vgg16.json" in demo
    assert "torch" not in demo and "[test" not in demo and "numba" not in demo
    test = planned("test", venv)
    assert "pip install --quiet torch==2.13.0" in test and "-e '.[test,harness,fast]'" in test
    assert "pytest" in test
    custom = subprocess.run(["make", "-n", "harness", f"VENV={venv}",
                             "TORCH=torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"],
                            capture_output=True, text=True, cwd=ROOT, timeout=60).stdout
    assert "pip install --quiet torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in custom
