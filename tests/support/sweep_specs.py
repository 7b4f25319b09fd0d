"""The sweep tests' shared setup: a spec written once per module, and its sweep run once, uninterrupted."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from pipesim.sweep import SweepSummary, run_sweep

# 144 points heavy enough (the DES, m up to 512, K=16) that a CLI sweep runs for tens of seconds and
# starts its embedded cluster after its first points (pipesim.sweep.local).
HEAVY_SPEC = """\
profile: {uniform: {layers: 16, forward_ms: 1.0, backward_ms: 2.0, activation_bytes: 1000000, param_bytes: 4000000}}
bandwidth: [10GB/s, 20GB/s, 40GB/s]
stages: [2, 4, 8]
microbatches: [64, 128, 256, 512]
minibatches: [16]
schedule: [gpipe, 1f1b, pipedream, 2bw]
engine: des
"""


def spec_fixture(text: str) -> Callable[..., Path]:
    """A module-scoped fixture ``spec_path``: ``text`` written to a spec.yaml of its own folder."""

    @pytest.fixture(scope="module")
    def spec_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
        path = tmp_path_factory.mktemp("spec") / "spec.yaml"
        path.write_text(text)
        return path

    return spec_path


def reference_sweep(spec_path: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SweepSummary]:
    """The uninterrupted sweep of ``spec_path`` into a fresh folder's results.parquet, every point on an
    embedded cluster of 2 workers."""
    out = tmp_path_factory.mktemp("reference") / "results.parquet"
    return out, run_sweep(spec_path, out, workers=2, in_process=False)


def user_namespaces_work(folder: Path) -> bool:
    """Whether an unprivileged user and mount namespace (``unshare -rm``) can mount a tmpfs on ``folder``."""
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return False
    try:
        probe = subprocess.run(["unshare", "-rm", "mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)],
                               capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0
