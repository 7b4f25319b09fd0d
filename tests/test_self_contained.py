"""The tests run from a clone alone: what they read from PipeDream's release is in the repository,
byte for byte, with its licence notice, and no test or shipped script reaches outside the checkout."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# A path built to a folder beside the checkout: ROOT.parent / "shared", parents[2] / "shared", "../shared".
OUTSIDE = re.compile(r"""\.parent\s*/\s*["']shared["']|parents\[\d\]\s*/\s*["']shared["']|\.\./shared""")


def test_no_test_or_shipped_script_reads_beside_the_checkout() -> None:
    files = [*(ROOT / "tests").rglob("*.py"), *(ROOT / "pipesim").rglob("*.py"), *(ROOT / "traces").glob("*.py")]
    files = [path for path in files if path != Path(__file__).resolve()]  # its own pattern above
    assert len(files) > 100
    reaching = [f"{path.relative_to(ROOT)}:{number}" for path in files
                for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
                if OUTSIDE.search(line)]
    assert reaching == []


def test_the_pipedream_profiles_are_the_ones_its_optimizer_ran_on() -> None:
    reference = json.loads((ROOT / "tests" / "data" / "pipedream_optimizer.json").read_text(encoding="utf-8"))
    recorded = reference["profiles"]
    assert sorted(recorded) == ["alexnet", "resnet50", "vgg16"]
    for entry in recorded.values():
        assert entry["path"].startswith("traces/pipedream/") and entry["identical_to_repo_file"] is True
        digest = hashlib.sha256((ROOT / entry["path"]).read_bytes()).hexdigest()
        assert digest == entry["sha256"], entry["path"]


def test_pipedream_data_keeps_its_licence_notice() -> None:
    for notice in (ROOT / "traces" / "pipedream" / "LICENSE.txt", ROOT / "tests" / "data" / "LICENSE-pipedream.txt",
                   ROOT / "traces" / "LICENSE-pipedream.txt"):
        text = notice.read_text(encoding="utf-8")
        assert "MIT License" in text and "Copyright (c) Microsoft Corporation" in text, notice
        assert "The above copyright notice and this permission notice shall be included" in text, notice
