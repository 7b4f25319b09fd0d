"""Refusals a newcomer met (issue 36): a profile layer missing a field names the layer and the field,
``--out ""`` is refused as other empty values are, and a search whose GPU count cannot be split for
its global batch says why in one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import ROOT
from test_cli_outputs import in_process

from pipesim.errors import ConfigError
from pipesim.spec.files import load_profile

UNIFORM = "layers=4,forward_ms=1,backward_ms=2,activation_bytes=1000,param_bytes=4000"


def test_a_layer_missing_a_field_names_the_layer_and_the_field_only(tmp_path: Path) -> None:
    data = json.loads((ROOT / "traces" / "uniform32.json").read_text(encoding="utf-8"))
    del data["layers"][3]["forward_s"]
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_profile(path)
    assert str(caught.value) == f"{path}: layers[3].forward_s: is required (in 'layer3')"
    done = in_process("simulate", "--profile", str(path), "--stages", "2", "--microbatches", "4", "--schedule", "1f1b")
    assert (done.returncode, done.stderr) == (2, f"pipesim: error: {path}: layers[3].forward_s: is required "
                                                 "(in 'layer3')\n")


@pytest.mark.parametrize(
    "args",
    [
        ("simulate", "--uniform", UNIFORM, "--stages", "2", "--microbatches", "4", "--schedule", "1f1b"),
        ("simulate", "--uniform", UNIFORM, "--stages", "2", "--microbatches", "4", "--schedule", "1f1b,gpipe"),
        ("plan", "--profile", str(ROOT / "traces" / "vgg16.json"), "--devices", "2", "--bandwidth", "10Gbit/s"),
        ("search", "--model", "llama3-8b", "--device", "h100", "--gpus", "8", "--global-batch", "16"),
    ],
)
@pytest.mark.parametrize("out", ["", " "])
def test_an_empty_out_is_refused_and_nothing_is_written(args: tuple[str, ...], out: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    done = in_process(*args, "--out", out)
    assert (done.returncode, done.stderr) == (2, f"pipesim: error: out={out!r}: must not be empty\n")
    assert done.stdout == "" and list(tmp_path.iterdir()) == []
