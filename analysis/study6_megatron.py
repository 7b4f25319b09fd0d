"""Study 6: Megatron-LM's GPT runs (Narayanan et al., SC'21, Table 1) predicted from one calibrated row, and
Korthikanti et al.'s activation memory with and without selective recomputation.

Setting, part 1: each row's GPT (layers, hidden, heads; s = 2048, V = 51,200) as
``pipesim.transformer_profile`` on A100 80 GB (312 TFLOP/s bf16 peak, NVLink 600 GB/s, one
200 Gbit/s NIC per GPU), with the row's tensor- and pipeline-parallel degrees, data-parallel over
the rest of the GPUs, its global batch, microbatch size 1 (assumed: Table 1 does not give it),
1F1B (PipeDream-Flush) and full recomputation, as the paper's runs used. The per-GPU figure is
the paper's: F = 96 B s l h^2 (1 + s/6h + V/16lh) FLOPs per iteration (their eq. 3) over the
iteration time and the GPUs. The device efficiency (the sustained share of peak) is calibrated
on ONE row, the 145.6B model, so that its predicted TFLOP/s equals the paper's, and the other
rows are predictions. The paper's numbers are recalled, not checked against the text in this
session.

Part 2: per layer and per first-stage GPU, the activation bytes of Korthikanti et al. (2022) for
their four configurations (22B, 175B, 530B, 1T; t = 8, microbatch 1, s = 2048, recalled), with no
recomputation, tensor parallelism alone; sequence parallelism + selective recomputation; full
recomputation; and the simulated 1F1B peak of the first stage (p microbatches in flight) with the
first two, against 80 GB.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import pandas as pd

import pipesim
from outputs import parse_args, write_figure, write_table
from pipesim.spec.devices import device_preset
from pipesim.spec.parallel import data_parallel_profile
from pipesim.spec.transformer import TransformerConfig
from pipesim.spec.transformer_profile import ADAM_STATE_MULTIPLIER

# Narayanan et al. (SC'21) Table 1, recalled: (parameters B, heads, hidden, layers, TP, PP, GPUs, batch,
# achieved TFLOP/s per GPU).
MEGATRON_TABLE_1 = (
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137), (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142), (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138), (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148), (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163), (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
)
CALIBRATION_ROW = 145.6
# Korthikanti et al. (2022) Table 3, recalled: (name, heads, hidden, layers, TP, PP).
KORTHIKANTI_CONFIGS = (("22B", 64, 6144, 48, 8, 1), ("175B", 96, 12288, 96, 8, 8), ("530B", 128, 20480, 105, 8, 35),
                       ("1T", 160, 25600, 128, 8, 64))
SEQ, VOCAB = 2048, 51200


def gpt(layers: int, hidden: int, heads: int) -> TransformerConfig:
    """A Megatron GPT: 4h FFN, multi-head attention, tied embeddings, learned positions."""
    return TransformerConfig(name=f"gpt-h{hidden}-L{layers}", num_layers=layers, hidden_size=hidden,
                             ffn_hidden_size=4 * hidden, num_heads=heads, num_kv_heads=heads, vocab_size=VOCAB,
                             seq_len=SEQ, has_tied_embeddings=True, has_bias=True, num_positions=SEQ)


def per_gpu_tflops(row: tuple[float, ...], efficiency: float) -> tuple[float, float]:
    """Predicted achieved TFLOP/s per GPU (the paper's count) and the first stage's peak memory, GB."""
    _, heads, hidden, layers, tp, pp, gpus, batch, _ = row
    tp, pp, gpus, batch, layers = int(tp), int(pp), int(gpus), int(batch), int(layers)
    dp = gpus // (tp * pp)
    device = device_preset("a100-80gb")
    profile = pipesim.transformer_profile(gpt(layers, int(hidden), int(heads)), device=device, tp=tp,
                                          recompute="full", efficiency=efficiency)
    profile = data_parallel_profile(profile, dp, device.inter_node_bandwidth_bytes_per_s)
    topology = pipesim.Topology.uniform(num_devices=pp, bandwidth=device.inter_node_bandwidth_bytes_per_s)
    result = pipesim.simulate(profile, topology, schedule="1f1b", num_stages=pp, num_microbatches=batch // dp,
                              engine="auto", optimizer_state_multiplier=ADAM_STATE_MULTIPLIER)
    h, l = hidden, layers
    flops = 96 * batch * SEQ * l * h**2 * (1 + SEQ / (6 * h) + VOCAB / (16 * l * h))
    peak = max(result.metrics.device_peak_memory_bytes) / 1e9
    return flops / (result.metrics.iteration_time_s * gpus) / 1e12, peak


def calibrate(row: tuple[float, ...]) -> float:
    """The efficiency at which ``row``'s predicted TFLOP/s equals the paper's (fixed point: compute
    scales with 1/efficiency, communication does not)."""
    efficiency = 0.5
    for _ in range(8):
        predicted, _ = per_gpu_tflops(row, efficiency)
        efficiency = min(1.0, efficiency * row[-1] / predicted)
    return efficiency


def megatron(quick: bool) -> tuple[pd.DataFrame, float]:
    """One row per Table 1 configuration: paper's and predicted TFLOP/s per GPU."""
    rows = [row for row in MEGATRON_TABLE_1 if not quick or row[0] in (1.7, 3.6)]
    anchor = next(row for row in MEGATRON_TABLE_1 if row[0] == (1.7 if quick else CALIBRATION_ROW))
    efficiency = calibrate(anchor)
    table = []
    for row in rows:
        predicted, peak = per_gpu_tflops(row, efficiency)
        table.append({"parameters_b": row[0], "layers": row[3], "hidden": row[2], "tp": row[4], "pp": row[5],
                      "gpus": row[6], "batch": row[7], "paper_tflops_per_gpu": row[8],
                      "predicted_tflops_per_gpu": predicted, "predicted_over_paper": predicted / row[8],
                      "first_stage_peak_gb": peak, "is_calibration_row": row is anchor,
                      "paper_numbers": "recalled"})
    return pd.DataFrame(table), efficiency


def korthikanti(quick: bool) -> pd.DataFrame:
    """Activation bytes per layer and simulated first-stage peaks for Korthikanti et al.'s configurations."""
    from pipesim.spec.transformer import layer_activation_bytes

    device = replace(device_preset("a100-80gb"), efficiency=0.5)
    rows = []
    for name, heads, hidden, layers, tp, pp in KORTHIKANTI_CONFIGS[:1] if quick else KORTHIKANTI_CONFIGS:
        config = gpt(layers, hidden, heads)
        row: dict[str, object] = {"model": name, "tp": tp, "pp": pp}
        for label, options in (("none", {}), ("selective_sp", {"recompute": "selective", "sequence_parallel": True}),
                               ("full", {"recompute": "full"})):
            per_layer = layer_activation_bytes(config, microbatch_size=1, seq_len=SEQ, tp=tp, **options)  # type: ignore[arg-type]
            row[f"layer_{label}_gb"] = per_layer / 1e9
            # 1F1B keeps p microbatches in flight on the first stage, each over its l / p layers.
            row[f"first_stage_{label}_gb"] = per_layer * layers / 1e9
        for label, options in (("none", {}), ("selective_sp", {"recompute": "selective", "sequence_parallel": True})):
            profile = pipesim.transformer_profile(config, device=device, tp=tp, **options)  # type: ignore[arg-type]
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
            label="pipesim, calibrated on one row")
    anchor = frame[frame["is_calibration_row"]]
    ax.scatter(anchor["parameters_b"], anchor["predicted_tflops_per_gpu"], s=120, facecolors="none",
               edgecolors="#C44E52", label="calibration row")
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
    frame, efficiency = megatron(args.quick)
    write_table(frame, args.out, "study6_megatron")
    write_table(korthikanti(args.quick), args.out, "study6_korthikanti")
    write_figure(plot(frame), args.out, "study6_megatron")
    others = frame[~frame["is_calibration_row"]]
    print(f"study 6: efficiency {efficiency:.3f} of peak from one row; the other rows' predicted / paper "
          f"{others['predicted_over_paper'].min():.2f} .. {others['predicted_over_paper'].max():.2f}")
    return frame


if __name__ == "__main__":
    main(sys.argv[1:])
