"""benchmarks/bench_published.py predicts runs with context and expert parallelism and ZeRO-2/3 (none refused)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(run_id: str, model: dict[str, object], parallelism: dict[str, object], reported: dict[str, object]) -> dict[
        str, object]:
    return {"id": run_id, "model": model, "hardware": {"gpu": "h100", "gpus_per_node": 8},
            "parallelism": {"virtual_stages": 1, "sequence_parallel": True, "microbatch_size": 1,
                            "recompute": "selective", **parallelism}, "precision": "bf16", "reported": reported}


def test_cp_ep_and_zero_runs_are_predicted(tmp_path: Path) -> None:
    shutil.copy(ROOT / "tests" / "data" / "hf_configs" / "Mixtral-8x7B-v0.1" / "config.json", tmp_path / "mixtral.json")
    llama = {"name": "llama", "num_layers": 8, "hidden_size": 4096, "num_attention_heads": 32, "num_kv_heads": 8,
             "ffn_hidden_size": 14336, "vocab_size": 128256, "seq_len": 32768, "activation": "swiglu"}
    moe = {**llama, "seq_len": 4096, "num_experts": 8, "experts_per_token": 2}
    runs = [
        run("long-context", llama, {"tp": 8, "cp": 4, "pp": 2, "dp": 2, "global_batch_size": 16}, {"mfu": 0.4}),
        run("experts", moe, {"tp": 2, "ep": 4, "pp": 2, "dp": 4, "zero_stage": 1, "global_batch_size": 64},
            {"tflops_per_gpu": 400}),
        run("fsdp", {"config_file": "mixtral.json", "seq_len": 4096},
            {"tp": 1, "ep": 8, "pp": 1, "dp": 16, "fsdp": True, "global_batch_size": 64}, {"tokens_per_s": 1e5}),
        run("zero2", llama | {"seq_len": 4096}, {"tp": 1, "pp": 1, "dp": 8, "zero_stage": 2, "global_batch_size": 32},
            {"mfu": 0.4}),
    ]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"runs": runs}))
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_published.py"), "--runs", str(path)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "not predicted" not in done.stdout + done.stderr
    table = done.stdout
    assert "| long-context | 128 | 8x2x2 (1, 1, cp 4) |" in table
    assert "| experts | 16 | 2x2x4 (1, 1, ep 4, zero 1) |" in table
    assert "| fsdp | 16 | 1x1x16 (1, 1, ep 8, zero 3) |" in table
    assert "| zero2 | 8 | 1x1x8 (1, 1, zero 2) |" in table
