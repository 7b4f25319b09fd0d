"""A sweep's model block: dp, cp, ep and zero as axes, one labelled profile per combination."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipesim.errors import ConfigError
from pipesim.spec.transformer_profile import transformer_profile
from pipesim.sweep.spec import Resolved, parse_spec

MIXTRAL = Path(__file__).resolve().parents[1] / "data" / "hf_configs" / "Mixtral-8x7B-v0.1" / "config.json"


def test_each_combination_of_the_model_axes_is_a_profile_of_its_own() -> None:
    spec = parse_spec({"model": [{"preset": "llama3-8b", "seq_len": 4096, "tp": 2, "dp": 8, "cp": [1, 2],
                                  "zero": [0, 3]}], "stages": 4, "microbatches": 8, "schedule": "1f1b"})
    resolved = Resolved(spec)
    labels = [label for label, _ in resolved.profiles]
    assert labels == [
        "model(llama3-8b,device=h100,microbatch_size=1,seq_len=4096,tp=2,recompute=none,dp=8)",
        "model(llama3-8b,device=h100,microbatch_size=1,seq_len=4096,tp=2,recompute=none,dp=8,zero=3)",
        "model(llama3-8b,device=h100,microbatch_size=1,seq_len=4096,tp=2,recompute=none,dp=8,cp=2)",
        "model(llama3-8b,device=h100,microbatch_size=1,seq_len=4096,tp=2,recompute=none,dp=8,cp=2,zero=3)",
    ]
    built = dict(resolved.profiles)
    expected = transformer_profile("llama3-8b", seq_len=4096, tp=2, dp=8, cp=2, zero=3)
    assert built[labels[3]] == expected
    assert len(resolved.points()) == 4


def test_a_model_block_without_the_new_axes_keeps_its_label_and_profile() -> None:
    spec = parse_spec({"model": [{"preset": "llama3-8b", "tp": 2}], "stages": 2, "microbatches": 4,
                       "schedule": "1f1b"})
    [(label, profile)] = Resolved(spec).profiles
    assert label == "model(llama3-8b,device=h100,microbatch_size=1,seq_len=default,tp=2,recompute=none)"
    assert profile == transformer_profile("llama3-8b", tp=2)


def test_zero_1_in_a_sweep_states_each_layers_sharded_optimizer_state() -> None:
    spec = parse_spec({"model": [{"preset": "llama3-8b", "seq_len": 4096, "dp": 8, "zero": 1}], "stages": 2,
                       "microbatches": 4, "schedule": "1f1b"})
    [(_, profile)] = Resolved(spec).profiles
    layer = profile.layers[1]
    assert layer.optimizer_bytes == pytest.approx(12 * layer.param_bytes / 2 / 8, rel=1e-12)


def test_an_moe_model_file_sits_beside_the_spec_and_takes_ep(tmp_path: Path) -> None:
    shutil.copy(MIXTRAL, tmp_path / "mixtral.json")
    spec = parse_spec({"model": [{"preset": "mixtral.json", "seq_len": 1024, "dp": 4, "ep": [1, 4]}], "stages": 4,
                       "microbatches": 4, "schedule": "1f1b"})
    profiles = Resolved(spec, base_dir=tmp_path).profiles
    assert [label.endswith("ep=4)") for label, _ in profiles] == [False, True]
    assert profiles[1][1].layers[1].param_bytes < profiles[0][1].layers[1].param_bytes
    with pytest.raises(ConfigError, match=r"profile\[0\]\.model\.ep=3: must divide dp x cp"):
        Resolved(parse_spec({"model": [{"preset": "mixtral.json", "dp": 4, "ep": 3}], "stages": 4,
                             "microbatches": 4, "schedule": "1f1b"}), base_dir=tmp_path)
