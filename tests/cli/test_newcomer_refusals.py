"""Refusals a newcomer met (issue 36): a profile layer missing a field names the layer and the field,
``--out ""`` is refused as other empty values are, and a search whose GPU count cannot be split for
its global batch says why in one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import ROOT, in_process

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


def test_a_gpu_count_with_no_split_for_the_batch_is_one_line_and_exit_2(tmp_path: Path) -> None:
    # 500 = 2^2 x 5^3 and 1024 = 2^10: only DP 1, 2 and 4 divide the batch, and TP <= 8 (one
    # node) leaves TP x PP = 500, 250 or 125 for them: at least 125 stages, and llama3-8b has
    # 32 blocks plus embedding and head. Every candidate fails before it is cut into stages.
    args = ("search", "--model", "llama3-8b", "--device", "h100", "--gpus", "500", "--global-batch", "1024")
    for extra in ((), ("--json",), ("--out", str(tmp_path / "out"))):
        done = in_process(*args, *extra)
        assert (done.returncode, done.stderr) == (
            2, "pipesim: error: gpus=500: no TP x PP x DP split of 500 GPUs suits --global-batch 1024: the DP "
               "degrees that divide the batch (1, 2, 4) leave 125 or more pipeline stages, more than the model "
               "has layers\n"), extra
        assert done.stdout == ""
    assert list(tmp_path.iterdir()) == []
    # A search that cuts stages and finds nothing within the budget still prints its table, exit 0.
    tight = in_process("search", "--model", "llama3-8b", "--device", "h100", "--gpus", "8", "--global-batch", "64",
                       "--memory", "1GB")
    assert tight.returncode == 0 and "no configuration fits" in tight.stdout
