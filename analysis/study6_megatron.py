"""Study 6: Megatron-LM's GPT runs (Narayanan et al., SC'21, Table 1) predicted by the op cost model, and
Korthikanti et al.'s activation memory with and without selective recomputation.

Setting, part 1: each row's GPT (layers, hidden, heads; s = 2048, V = 51,200) on A100 80 GB in
DGX A100 nodes (the shipped device and cluster files), with the row's tensor- and
pipeline-parallel degrees, data-parallel over the rest of the GPUs, its global batch, and what the
paper's run scripts set (microbatch size, interleaving, torch's or Megatron's DDP, fp16,
unfused attention with dropout: benchmarks/data/published_run_settings.json names the source of
each), full recomputation, simulated one global step (``pipesim.training.simulate_training``).
Nothing is calibrated on the rows: the per-GPU figure is the paper's, F = 96 B s l h^2 (1 + s/6h
+ V/16lh) FLOPs per iteration (their eq. 3) over the predicted iteration time and the GPUs. The
paper's numbers are recalled here; ``make bench-published`` checks the same rows against the
reference file.

Part 2: per layer and per first-stage GPU, the activation bytes of Korthikanti et al. (2022) for
their four configurations (22B, 175B, 530B, 1T; t = 8, microbatch 1, s = 2048, recalled), with no
recomputation, tensor parallelism alone; sequence parallelism + selective recomputation; full
recomputation; and the simulated 1F1B peak of the first stage (p microbatches in flight) with the
first two, against 80 GB. Their counts are for attention that keeps its scores (no FlashAttention).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd

import pipesim
from outputs import parse_args, write_figure, write_table
from pipesim.spec.transformer import TransformerConfig
from pipesim.spec.transformer_profile import ADAM_STATE_MULTIPLIER
from pipesim.training import megatron_schedule, simulate_training

# Narayanan et al. (SC'21) Table 1, recalled: (parameters B, heads, hidden, layers, TP, PP, GPUs, batch,
# achieved TFLOP/s per GPU).
MEGATRON_TABLE_1 = (
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137), (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142), (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138), (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148), (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163), (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
)
SETTINGS = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "published_run_settings.json"
# Korthikanti et al. (2022) Table 3, recalled: (name, heads, hidden, layers, TP, PP).
KORTHIKANTI_CONFIGS = (("22B", 64, 6144, 48, 8, 1), ("175B", 96, 12288, 96, 8, 8), ("530B", 128, 20480, 105, 8, 35),
                       ("1T", 160, 25600, 128, 8, 64))
SEQ, VOCAB = 2048, 51200


def gpt(layers: int, hidden: int, heads: int) -> TransformerConfig:
    """A Megatron GPT: 4h FFN, multi-head attention, tied embeddings, learned positions."""
    return TransformerConfig(name=f"gpt-h{hidden}-L{layers}", num_layers=layers, hidden_size=hidden,
                             ffn_hidden_size=4 * hidden, num_heads=heads, num_kv_heads=heads, vocab_size=VOCAB,
                             seq_len=SEQ, has_tied_embeddings=True, has_bias=True, num_positions=SEQ)


def per_gpu_tflops(row: tuple[float, ...], settings: dict[str, object]) -> tuple[float, float]:
    """Predicted achieved TFLOP/s per GPU (the paper's count) and the largest device peak, GB."""
    _, heads, hidden, layers, tp, pp, gpus, batch, _ = row
    tp, pp, gpus, batch, layers = int(tp), int(pp), int(gpus), int(batch), int(layers)
    dp = gpus // (tp * pp)
    config = replace(gpt(layers, int(hidden), int(heads)), has_dropout=bool(settings["has_dropout"]))
    stages_per_rank = int(settings["virtual_stages"]) if pp > 1 else 1  # type: ignore[call-overload]
    predicted = simulate_training(
        config, device="a100-80gb", global_batch=batch, tp=tp, pp=pp, dp=dp, stages_per_rank=stages_per_rank,
        schedule=megatron_schedule(stages_per_rank),
        microbatch_size=int(settings["microbatch_size"]),  # type: ignore[call-overload]
        recompute="full", precision=str(settings["precision"]), attention=settings["attention"],  # type: ignore[arg-type]
        dp_overlap=bool(settings["dp_overlap"]))
    h, l = hidden, layers
    flops = 96 * batch * SEQ * l * h**2 * (1 + SEQ / (6 * h) + VOCAB / (16 * l * h))
    return flops / (predicted.iteration_time_s * gpus) / 1e12, predicted.peak_memory_bytes / 1e9


def megatron(quick: bool) -> pd.DataFrame:
    """One row per Table 1 configuration: paper's and predicted TFLOP/s per GPU."""
    settings = json.loads(SETTINGS.read_text(encoding="utf-8"))["runs"]
    rows = [row for row in MEGATRON_TABLE_1 if not quick or row[0] in (1.7, 3.6)]
    table = []
    for row in rows:
        predicted, peak = per_gpu_tflops(row, settings[f"megatron-sc21-t1-{row[0]}b"])
        table.append({"parameters_b": row[0], "layers": row[3], "hidden": row[2], "tp": row[4], "pp": row[5],
                      "gpus": row[6], "batch": row[7], "paper_tflops_per_gpu": row[8],
                      "predicted_tflops_per_gpu": predicted, "predicted_over_paper": predicted / row[8],
                      "peak_memory_gb": peak, "paper_numbers": "recalled"})
    return pd.DataFrame(table)


def korthikanti(quick: bool) -> pd.DataFrame:
    """Activation bytes per layer and simulated first-stage peaks for Korthikanti et al.'s configurations."""
    from pipesim.spec.transformer import layer_activation_bytes

    rows = []
    for name, heads, hidden, layers, tp, pp in KORTHIKANTI_CONFIGS[:1] if quick else KORTHIKANTI_CONFIGS:
        config = gpt(layers, hidden, heads)
        row: dict[str, object] = {"model": name, "tp": tp, "pp": pp}
        for label, options in (("none", {}), ("selective_sp", {"recompute": "selective", "sequence_parallel": True}),
                               ("full", {"recompute": "full"})):
            per_layer = layer_activation_bytes(config, microbatch_size=1, seq_len=SEQ, tp=tp,
                                               **options)  # type: ignore[arg-type]
            row[f"layer_{label}_gb"] = per_layer / 1e9
            # 1F1B keeps p microbatches in flight on the first stage, each over its l / p layers.
            row[f"first_stage_{label}_gb"] = per_layer * layers / 1e9
        for label, options in (("none", {}), ("selective_sp", {"recompute": "selective", "sequence_parallel": True})):
            profile = pipesim.transformer_profile(config, device="a100-80gb", tp=tp, attention="unfused",
                                                  **options)  # type: ignore[arg-type]
            result = pipesim.simulate(profile, schedule="1f1b", num_stages=pp, num_microbatches=max(2 * pp, 2),
                                      engine="auto", optimizer_state_multiplier=ADAM_STATE_MULTIPLIER)
            row[f"simulated_peak_{label}_gb"] = max(result.metrics.device_peak_memory_bytes) / 1e9
        rows.append(row)
    return pd.DataFrame(rows)


def plot(frame: pd.DataFrame) -> object:
    """Predicted against the paper's TFLOP/s per GPU, by model size."""
    import matplotlib.pyplot as plt

    figure, ax = plt.subplots(figsize=(7.5, 4.8))
    ax.plot(frame["parameters_b"], frame["paper_tflops_per_gpu"], "o-", color="black", label="paper (recalled)")
    ax.plot(frame["parameters_b"], frame["predicted_tflops_per_gpu"], "x--", color="#4C72B0",
            label="pipesim: op cost model, shipped A100 and DGX A100 files")
    ax.set_xscale("log")
    ax.set_xlabel("model parameters (billions)")
    ax.set_ylabel("achieved TFLOP/s per GPU (A100)")
    ax.set_ylim(0, 312)
    ax.set_title("Megatron-LM GPT weak scaling (Narayanan et al., SC'21, Table 1)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return figure


def main(argv: list[str] | None = None) -> pd.DataFrame:
    """Run the study and write its tables and figure."""
    args = parse_args(__doc__ or "", argv)
    frame = megatron(args.quick)
    write_table(frame, args.out, "study6_megatron")
    write_table(korthikanti(args.quick), args.out, "study6_korthikanti")
    write_figure(plot(frame), args.out, "study6_megatron")
    print(f"study 6: predicted / paper {frame['predicted_over_paper'].min():.2f} .. "
          f"{frame['predicted_over_paper'].max():.2f} over {len(frame)} rows, nothing calibrated on them")
    return frame


if __name__ == "__main__":
    main(sys.argv[1:])
