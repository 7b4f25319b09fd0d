"""The capacity-study commands through their real entry point: pipesim model, simulate --model, search."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pipesim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipesim", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def test_model_json_has_the_contract_keys_and_writes_a_loadable_profile(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    done = pipesim("model", "--preset", "llama3-70b", "--device", "h100", "--tp", "8", "--recompute", "selective",
                   "--out", str(out), "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["parameters"] == 70_553_706_496 and data["layers"] == 80
    assert isinstance(data["forward_flops_per_token"], float)
    import pipesim as api

    profile = api.load_profile(out)
    assert profile.num_layers == 82 and profile.layers[0].name == "embedding"


@pytest.mark.parametrize(("args", "field"), [(("--preset", "gpt5"), "--preset"), (("--preset", "llama3-8b", "--tp", "3"), "tp")])
def test_model_bad_input_is_one_line_and_exit_2(args: tuple[str, ...], field: str) -> None:
    done = pipesim("model", *args)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and field in done.stderr
