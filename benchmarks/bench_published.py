"""Published training runs against pipesim's prediction, with the shipped device and cluster files.

For every run of a published-runs file (default ``../shared/reference/published_runs.json``) this
builds the model, the layout and the training setup the run states, simulates one global step with
``pipesim.training.simulate_training`` and compares the per-GPU throughput with the published
figure, counted the way the paper counts it (Megatron's equation 3 counts the recomputed
forward; ``tflops_per_gpu`` and ``hfu`` are compared in the paper's own FLOPs, an iteration time
or tokens/s directly). It prints each row's error, the mean, median and worst, and whether every
step along a scaling series moves in the published direction; ``--write`` puts the table into
benchmarks/RESULTS.md.

What a run leaves unsaid is taken from ``NOTES`` (each entry names where it comes from) and
otherwise from the defaults below; nothing is tuned to the published figures, which are a check,
not a fitting set. A run may use context parallelism (``cp``), expert parallelism (``ep``, with the
model block's ``num_experts``, ``experts_per_token``, ``moe_ffn_hidden_size``,
``shared_expert_ffn_hidden_size``, ``num_dense_layers``, or a ``config_file``: a Hugging Face
config.json beside the runs file) and ZeRO stages 0 to 3 (``zero_stage``, or ``fsdp``: true).

    python benchmarks/bench_published.py [--runs FILE] [--write]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from results_file import machine, write_section

from pipesim.errors import PipesimError
from pipesim.spec.cluster import Cluster, cluster_from_flags, load_cluster
from pipesim.spec.device import Device, load_device
from pipesim.spec.model_files import load_model
from pipesim.spec.transformer import TransformerConfig, forward_flops_per_token, head_forward_flops
from pipesim.training import megatron_schedule, simulate_training

DEFAULT_RUNS = Path(__file__).resolve().parents[2] / "shared" / "reference" / "published_runs.json"

# What the published runs leave unsaid (microbatch size, interleaving, DDP overlap, precision, the
# attention kernels and dropout of the software of the time), by run id, each with its source.
SETTINGS = Path(__file__).resolve().parent / "data" / "published_run_settings.json"
NOTES: dict[str, dict[str, Any]] = json.loads(SETTINGS.read_text(encoding="utf-8"))["runs"]
# Defaults where neither the run nor NOTES say: what a Megatron-Core user of today runs.
DEFAULTS: dict[str, Any] = {"microbatch_size": 1, "virtual_stages": 1, "dp_overlap": True, "tp_overlap": False,
                            "precision": None, "attention": "flash", "has_dropout": False, "source": "defaults"}


# GPU names a runs file may use, by the shipped device file they mean.
DEVICE_ALIASES = {"a100": "a100-80gb", "a100-sxm4-80gb": "a100-80gb", "a100-80g": "a100-80gb",
                  "a100-40g": "a100-40gb", "a100-sxm4-40gb": "a100-40gb", "h100-80gb": "h100", "h100-sxm": "h100",
                  "h100-sxm5": "h100", "h200-141gb": "h200", "h200-sxm": "h200", "v100-32gb": "v100",
                  "v100-sxm2": "v100", "v100-16gb": "v100"}


def device_of(hardware: dict[str, Any]) -> Device:
    """The shipped device a run's GPU names (a 16 GB V100 keeps the V100 file with its memory)."""
    name = str(hardware["gpu"]).strip().lower()
    device = load_device(DEVICE_ALIASES.get(name, name))
    if "16gb" in name:
        device = device.model_copy(update={"memory_bytes": 16 * 2**30})
    return device


def cluster_of(hardware: dict[str, Any], device: Device) -> Cluster:
    """The device's usual cluster, its node size the run's where the run says another."""
    cluster = load_cluster(device.default_cluster or "dgx-h100")
    per_node = hardware.get("gpus_per_node")
    if per_node and per_node != cluster.gpus_per_node:
        inner, outer = cluster.tiers[0], cluster.tiers[-1]
        cluster = cluster_from_flags(gpus_per_node=int(per_node), intra_node_bandwidth_bytes_per_s=inner.bandwidth_bytes_per_s,
                                     inter_node_bandwidth_bytes_per_s=outer.bandwidth_bytes_per_s,
                                     inter_node_latency_s=outer.latency_s, base=cluster)
    return cluster


def config_of(model: dict[str, Any], runs_file: Path | None = None) -> TransformerConfig:
    """A TransformerConfig from a run's ``model`` block (or the Hugging Face config file it names,
    relative to the runs file)."""
    if model.get("config_file"):
        folder = runs_file.parent if runs_file is not None else Path.cwd()
        return load_model(str(folder / model["config_file"]))
    gated = model.get("activation", "gelu") in ("swiglu", "geglu")
    rmsnorm = model.get("norm", "layernorm" if model.get("family") == "gpt" else "rmsnorm") == "rmsnorm"
    return TransformerConfig(
        name=model.get("name", "model"), num_layers=model["num_layers"], hidden_size=model["hidden_size"],
        ffn_hidden_size=model.get("ffn_hidden_size") or 4 * model["hidden_size"],
        num_heads=model["num_attention_heads"], num_kv_heads=model.get("num_kv_heads") or model["num_attention_heads"],
        vocab_size=model["vocab_size"], seq_len=model["seq_len"], is_gated_ffn=gated,
        has_tied_embeddings=bool(model.get("tied_embeddings", False)), has_bias=model.get("family") == "gpt",
        norm="rmsnorm" if rmsnorm else "layernorm",
        num_positions=model["seq_len"] if model.get("position") == "learned" else 0,
        published_parameters=float(model.get("parameters_reported") or 0.0),
        num_experts=int(model.get("num_experts") or 0), num_experts_per_token=int(model.get("experts_per_token") or 0),
        expert_ffn_hidden_size=model.get("moe_ffn_hidden_size"),
        shared_expert_ffn_hidden_size=int(model.get("shared_expert_ffn_hidden_size") or 0),
        num_dense_layers=int(model.get("num_dense_layers") or 0))


def eq3_flops(config: TransformerConfig, *, global_batch: int, seq_len: int, recompute: str) -> float:
    """Narayanan et al.'s equation 3 generalised to any recomputation: 24 (3 + r) B s L h^2 (1 + s/6h) + 6 B s h V,
    r = 1 with full recomputation (their 96 B s L h^2 (1 + s/6h + V/16Lh)), else 0. A mixture of
    experts (the equation has no router or experts) counts (3 + r) x its forward FLOPs per token
    (the router, k routed and the shared experts) on the layers and 3 on the logits."""
    b, s, layers, h, v = global_batch, seq_len, config.num_layers, config.hidden_size, config.vocab_size
    passes = 4 if recompute == "full" else 3
    if config.is_moe:
        logits = head_forward_flops(config, tokens=1)
        return b * s * (passes * (forward_flops_per_token(config, s) - logits) + 3 * logits)
    return 24 * passes * b * s * layers * h * h * (1 + s / (6 * h)) + 6 * b * s * h * v


def predict(run: dict[str, Any], runs_file: Path | None = None) -> dict[str, Any]:
    """One run's prediction and its comparison with the published figure."""
    note = {**DEFAULTS, **NOTES.get(run["id"], {})}
    parallel = run["parallelism"]
    for key in ("microbatch_size", "virtual_stages"):
        if parallel.get(key) is not None:
            note[key] = parallel[key]
    model = run["model"]
    config = config_of(model, runs_file)
    if note["has_dropout"] != config.has_dropout:
        from dataclasses import replace

        config = replace(config, has_dropout=note["has_dropout"])
    tp, pp, dp = parallel["tp"], parallel["pp"], parallel["dp"]
    cp, ep = parallel.get("cp") or 1, parallel.get("ep") or 1
    zero = 3 if parallel.get("fsdp") else parallel.get("zero_stage") or 0
    v = note["virtual_stages"] if pp > 1 else 1
    recompute = parallel.get("recompute") or "none"
    device = device_of(run["hardware"])
    cluster = cluster_of(run["hardware"], device)
    precision = run.get("precision") or note["precision"]
    began = time.perf_counter()
    predicted = simulate_training(
        config, device=device, cluster=cluster, global_batch=parallel["global_batch_size"], tp=tp, pp=pp, dp=dp,
        stages_per_rank=v,
        schedule=megatron_schedule(v), microbatch_size=note["microbatch_size"],
        seq_len=model["seq_len"], sequence_parallel=bool(parallel.get("sequence_parallel")),
        tp_overlap=bool(note["tp_overlap"] and parallel.get("sequence_parallel") and tp > 1), recompute=recompute,
        precision=precision, attention=note["attention"], zero=zero, cp=cp, ep=ep,
        dp_overlap=note["dp_overlap"] and zero < 2)
    seconds = time.perf_counter() - began
    reported = run["reported"]
    gpus = tp * cp * pp * dp
    if reported.get("tflops_per_gpu"):
        flops = eq3_flops(config, global_batch=parallel["global_batch_size"], seq_len=model["seq_len"],
                          recompute=recompute)
        metric, published = "TFLOP/s per GPU (eq. 3)", float(reported["tflops_per_gpu"])
        value = flops / predicted.iteration_time_s / gpus / 1e12
    elif reported.get("hfu"):
        flops = eq3_flops(config, global_batch=parallel["global_batch_size"], seq_len=model["seq_len"],
                          recompute=recompute)
        peak = device.peak(precision or device.default_precision)
        metric, published = "hardware FLOP utilisation (eq. 3)", float(reported["hfu"])
        value = flops / predicted.iteration_time_s / gpus / peak
    elif reported.get("iteration_time_s"):
        metric, published = "iteration time s (inverted)", 1.0 / float(reported["iteration_time_s"])
        value = 1.0 / predicted.iteration_time_s
    elif reported.get("tokens_per_s"):
        metric, published, value = "tokens/s", float(reported["tokens_per_s"]), predicted.tokens_per_s
    elif reported.get("mfu"):
        metric, published, value = "MFU", float(reported["mfu"]), predicted.mfu
    else:
        raise PipesimError("the run reports no figure pipesim can compare")
    return {"id": run["id"], "metric": metric, "published": published, "predicted": value,
            "ratio": value / published, "iteration_time_s": predicted.iteration_time_s, "gpus": gpus,
            "tp": tp, "pp": pp, "dp": dp, "cp": cp, "ep": ep, "zero": zero, "v": v,
            "microbatch_size": note["microbatch_size"],
            "fits": predicted.fits, "peak_memory_gb": predicted.peak_memory_bytes / 1e9,
            "series": run.get("series") or run["id"].rsplit("-", 1)[0], "order": float(
                model.get("parameters_reported") or 0.0), "simulate_s": seconds, "notes": note["source"]}


def directions(rows: list[dict[str, Any]]) -> list[tuple[str, str, bool]]:
    """Each step along each series (runs sharing a series key, in model-size order): published and
    predicted move the same way?"""
    steps = []
    series: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        series.setdefault(row["series"], []).append(row)
    for members in series.values():
        members.sort(key=lambda row: row["order"])
        for before, after in zip(members, members[1:]):
            published = after["published"] - before["published"]
            predicted = after["predicted"] - before["predicted"]
            same = (published > 0) == (predicted > 0) if published != 0 else abs(predicted) / before["predicted"] < 0.01
            steps.append((before["id"], after["id"], same))
    return steps


def report(rows: list[dict[str, Any]], failed: list[tuple[str, str]], source: Path) -> str:
    errors = [row["ratio"] - 1 for row in rows]
    absolute = [abs(error) for error in errors]
    steps = directions(rows)
    lines = [f"## Published runs (`make bench-published`, issue 31)", "",
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {machine()}; runs from "
             f"`{source.name}`; shipped device and cluster files, nothing tuned to these rows.", "",
             "| run | GPUs | tp x pp x dp (V, b) | published | predicted | error |", "|---|---|---|---|---|---|"]
    for row in rows:
        extra = "".join(f", {name} {row[name]}" for name in ("cp", "ep", "zero") if row[name] > (0 if name == "zero"
                                                                                                 else 1))
        lines.append(f"| {row['id']} | {row['gpus']} | {row['tp']}x{row['pp']}x{row['dp']} ({row['v']}, "
                     f"{row['microbatch_size']}{extra}) | {row['published']:.4g} | {row['predicted']:.4g} | "
                     f"{row['ratio'] - 1:+.1%} |")
    if rows:
        lines += ["", f"{len(rows)} runs: mean |error| {statistics.fmean(absolute):.1%}, median |error| "
                  f"{statistics.median(absolute):.1%}, worst {max(errors, key=abs):+.1%}; mean error "
                  f"{statistics.fmean(errors):+.1%}."]
    if steps:
        wrong = [f"{a} -> {b}" for a, b, same in steps if not same]
        lines.append(f"Scaling steps in the published direction: {len(steps) - len(wrong)} of {len(steps)}"
                     + (f" (against: {', '.join(wrong)})" if wrong else "") + ".")
    for run_id, reason in failed:
        lines.append(f"- {run_id}: not predicted ({reason})")
    notes = sorted({row["notes"] for row in rows})
    lines += ["", "What the runs leave unsaid was set from:"] + [f"- {note}" for note in notes]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=DEFAULT_RUNS, help="a published-runs JSON file")
    parser.add_argument("--write", action="store_true", help="write the table into benchmarks/RESULTS.md")
    args = parser.parse_args(argv)
    if not args.runs.exists():
        print(f"bench_published: {args.runs} does not exist (give --runs FILE)", file=sys.stderr)
        return 2
    runs = json.loads(args.runs.read_text(encoding="utf-8"))["runs"]
    rows, failed = [], []
    for run in runs:
        try:
            row = predict(run, args.runs)
        except PipesimError as error:
            failed.append((run.get("id", "?"), str(error)))
            print(f"{run.get('id')}: not predicted: {error}", file=sys.stderr)
            continue
        rows.append(row)
        print(f"{row['id']}: published {row['published']:.4g}, predicted {row['predicted']:.4g} "
              f"({row['ratio'] - 1:+.1%}), step {row['iteration_time_s']:.3f} s, peak {row['peak_memory_gb']:.1f} GB, "
              f"simulated in {row['simulate_s']:.2f} s", flush=True)
    text = report(rows, failed, args.runs)
    print(text)
    if args.write:
        write_section("published-runs", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
