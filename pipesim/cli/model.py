"""``pipesim model``: a transformer's sizes, FLOPs, per-op and per-layer costs on a device and cluster."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from pipesim.cli.options import non_empty
from pipesim.cli.outputs import out_file_option, writing
from pipesim.errors import ConfigError
from pipesim.spec.cluster import Cluster, cluster_from_flags, load_cluster
from pipesim.spec.device import PRECISIONS, Device, load_device
from pipesim.spec.files import load_profile, save_model
from pipesim.spec.model_files import load_model
from pipesim.spec.opcost import ATTENTION_KINDS
from pipesim.spec.profile import Profile
from pipesim.spec.transformer import RECOMPUTE_MODES, Recompute, TransformerConfig
from pipesim.spec.transformer_profile import (
    calibrated_efficiency,
    default_cluster,
    layer_op_costs,
    model_summary,
    transformer_profile,
)
from pipesim.spec.units import parse_bandwidth, parse_duration


def with_options(options: list[Callable[[Any], Any]]) -> Callable[[Any], Any]:
    """A decorator applying click ``options`` in order (the first listed shows first in --help)."""
    def apply(function: Any) -> Any:
        for option in reversed(options):
            function = option(function)
        return function
    return apply


# Where the model runs: a device and the cluster around it (shared by ``model``, ``simulate`` and ``search``).
HARDWARE_OPTIONS: list[Callable[[Any], Any]] = [
    click.option("--device", "device", type=str, default="h100", show_default=True, callback=non_empty,
                 help="A shipped device (pipesim device --list) or a device file: peak rates, memory and "
                      "efficiency curves, each number with its source."),
    click.option("--cluster", "cluster", type=str, default=None, callback=non_empty,
                 help="A shipped cluster or a cluster file: the tiers of links (NVLink, InfiniBand) per GPU; "
                      "default the device's usual system (its file's default_cluster)."),
    click.option("--gpus-per-node", "gpus_per_node", type=int, default=None,
                 help="GPUs on the fast intra-node tier (with the next three: a two-tier cluster in place of "
                      "--cluster; unset ones from the cluster)."),
    click.option("--intra-node-bandwidth", "intra_node_bandwidth", type=str, default=None, callback=non_empty,
                 help="Per GPU, per direction, e.g. 450GB/s."),
    click.option("--inter-node-bandwidth", "inter_node_bandwidth", type=str, default=None, callback=non_empty,
                 help="Per GPU, per direction, e.g. 400Gbit/s."),
    click.option("--inter-node-latency", "inter_node_latency", type=str, default=None, callback=non_empty,
                 help="One message's fixed cost across nodes, e.g. 5us."),
]

# The options that turn a model into a profile, shared by ``model`` and ``simulate``.
MODEL_OPTIONS: list[Callable[[Any], Any]] = [
    *HARDWARE_OPTIONS,
    click.option("--precision", "precision", type=click.Choice(PRECISIONS), default=None,
                 help="Matrix precision (default bf16, fp16 on cards without bf16); fp8: the layers' linear "
                      "products in fp8 with their casts, attention and logits in 16 bits (TransformerEngine's recipe)."),
    click.option("--attention", "attention", type=click.Choice(ATTENTION_KINDS), default="flash", show_default=True,
                 help="flash: a fused FlashAttention-style kernel; unfused: batched products, softmax and dropout "
                      "(Megatron-LM before FlashAttention)."),
    click.option("--efficiency", type=float, default=None,
                 help="What-if: the device's sustained matrix share of peak in place of its file's."),
    click.option("--calibrate", "calibrate_path", type=str, default=None,
                 help="A measured profile of the same model (embedding, blocks, head): set the matrix share "
                      "so the predicted compute time equals it."),
    click.option("--microbatch-size", "microbatch_size", type=int, default=None,
                 help="Sequences per microbatch b (default 1)."),
    click.option("--seq-len", "seq_len", type=int, default=None, help="Sequence length s (default the model's)."),
    click.option("--tp", "tp", type=int, default=1, show_default=True,
                 help="Tensor-parallel degree T: divides each layer, adds its collectives on the TP group's tier."),
    click.option("--sequence-parallel", is_flag=True, help="Megatron's sequence parallelism with --tp."),
    click.option("--tp-overlap", "tp_overlap", is_flag=True,
                 help="With --sequence-parallel: its all-gathers and reduce-scatters run beside the GEMMs next to "
                      "them (Megatron-Core's --tp-comm-overlap), taking the TP tier's share of the compute; only "
                      "what outlasts the GEMM is exposed."),
]


@dataclass(frozen=True)
class Hardware:
    """The device and cluster the options name, and how they were named (for the run record)."""

    device: Device
    cluster: Cluster
    device_name: str
    cluster_name: str


def resolve_hardware(options: dict[str, Any]) -> Hardware:
    """The device and cluster of ``HARDWARE_OPTIONS``; link flags replace the cluster's two tiers.

    Raises:
        ConfigError: an unknown device or cluster, a bad file, or a link flag that is not a rate,
            a duration or a count >= 1.
    """
    device = load_device(options["device"])
    cluster = load_cluster(options["cluster"]) if options.get("cluster") else default_cluster(device)
    flags = ("gpus_per_node", "intra_node_bandwidth", "inter_node_bandwidth", "inter_node_latency")
    if any(options.get(flag) is not None for flag in flags):
        per_node = options.get("gpus_per_node")
        if per_node is not None and per_node < 1:
            raise ConfigError("gpus_per_node", per_node, "must be >= 1")
        inner, outer = cluster.tiers[0], cluster.tiers[-1]
        intra = options.get("intra_node_bandwidth")
        inter = options.get("inter_node_bandwidth")
        latency = options.get("inter_node_latency")
        cluster = cluster_from_flags(
            gpus_per_node=per_node or cluster.gpus_per_node,
            intra_node_bandwidth_bytes_per_s=parse_bandwidth(intra, "intra_node_bandwidth") if intra
            else inner.bandwidth_bytes_per_s,
            inter_node_bandwidth_bytes_per_s=parse_bandwidth(inter, "inter_node_bandwidth") if inter
            else outer.bandwidth_bytes_per_s,
            inter_node_latency_s=parse_duration(latency, "inter_node_latency") if latency else outer.latency_s,
            base=cluster)
    return Hardware(device, cluster, options["device"], options.get("cluster") or cluster.name)


def build_model_profile(config: TransformerConfig, hardware: Hardware, *, efficiency: float | None,
                        calibrate_path: str | None, microbatch_size: int | None, seq_len: int | None, tp: int,
                        sequence_parallel: bool, recompute: Recompute, precision: str | None, attention: Any,
                        pp: int = 1, dp: int = 1, zero: int = 0, dp_overlap: bool = False,
                        placement: str = "tp-in-node", cp: int = 1, ep: int = 1, tp_overlap: bool = False) -> Profile:
    """The profile the model options describe, calibrated on a measured profile when one is given.

    Raises:
        ConfigError: --efficiency with --calibrate (which sets it), --sequence-parallel without
            --tp above 1, or what ``transformer_profile`` refuses.
    """
    b = 1 if microbatch_size is None else microbatch_size
    if calibrate_path is not None and efficiency is not None:
        raise ConfigError("efficiency", efficiency, "give either --efficiency or --calibrate (which sets it), "
                          "not both")
    if sequence_parallel and tp == 1:
        raise ConfigError("sequence_parallel", True, "needs --tp T > 1 (it splits the activations over the "
                          "tensor-parallel ranks)")
    if calibrate_path is not None:
        efficiency = calibrated_efficiency(load_profile(calibrate_path), config, device=hardware.device,
                                           microbatch_size=b, seq_len=seq_len)
    return transformer_profile(config, device=hardware.device, cluster=hardware.cluster, microbatch_size=b,
                               seq_len=seq_len, tp=tp, sequence_parallel=sequence_parallel, tp_overlap=tp_overlap,
                               recompute=recompute,
                               efficiency=efficiency, precision=precision, attention=attention, pp=pp, dp=dp,
                               zero=zero, dp_overlap=dp_overlap, placement=placement, cp=cp, ep=ep)


@click.command("model")
@click.option("--preset", "name", type=str, default=None, callback=non_empty,
              help="A published model (sizes from its paper, cited in pipesim/spec/transformer.py).")
@click.option("--model", "model_path", type=str, default=None, callback=non_empty,
              help="A model file: a Hugging Face config.json or pipesim's model JSON (or a preset name).")
@with_options(MODEL_OPTIONS)
@click.option("--recompute", type=click.Choice(RECOMPUTE_MODES), default="none", show_default=True,
              help="Activation recomputation: selective (attention, Korthikanti et al.) or full.")
@click.option("--ops", "show_ops", is_flag=True, help="List one layer's ops with their forward, I and W times.")
@click.option("--out", "out_path", type=str, default=None, callback=out_file_option((".json",)),
              help="Write the per-layer profile to FILE.json (pipesim JSON).")
@click.option("--json", "as_json", is_flag=True, help="Print the sizes as one JSON object.")
def model_command(name: str | None, model_path: str | None, recompute: Recompute, show_ops: bool,
                  out_path: str | None, as_json: bool, **options: Any) -> None:
    """Size a transformer on a device: parameters, FLOPs per token, per-op and per-layer time and memory."""
    if (name is None) == (model_path is None):
        raise ConfigError("model", model_path or name, "give exactly one of --preset NAME or --model FILE|NAME")
    config = load_model(name or model_path or "")
    hardware = resolve_hardware(options)
    profile = build_model_profile(config, hardware, efficiency=options["efficiency"],
                                  calibrate_path=options["calibrate_path"], microbatch_size=options["microbatch_size"],
                                  seq_len=options["seq_len"], tp=options["tp"],
                                  sequence_parallel=options["sequence_parallel"], recompute=recompute,
                                  precision=options["precision"], attention=options["attention"],
                                  tp_overlap=options["tp_overlap"])
    seq_len = config.seq_len if options["seq_len"] is None else options["seq_len"]
    summary = model_summary(config, profile, tp=options["tp"], recompute=recompute, seq_len=seq_len)
    ops = layer_op_costs(config, device=hardware.device, cluster=hardware.cluster,
                         microbatch_size=profile.microbatch_size, seq_len=seq_len, tp=options["tp"],
                         sequence_parallel=options["sequence_parallel"], precision=options["precision"],
                         attention=options["attention"], tp_overlap=options["tp_overlap"])
    summary["layer_ops"] = [{"name": op.name, "kind": op.kind, "forward_s": op.forward_s,
                             "input_grad_s": op.input_grad_s, "weight_grad_s": op.weight_grad_s} for op in ops]
    summary["cluster"] = hardware.cluster.name
    if out_path is not None:
        with writing(out_path):
            save_model(profile, out_path)
    if as_json:
        click.echo(json.dumps(summary, sort_keys=True))
        return
    active = summary.get("active_parameters_per_token")
    experts = (f" ({config.num_experts} experts, top-{config.num_experts_per_token}: {active / 1e9:.3f} B active per "
               f"token)" if active is not None else "")
    # A config file states no published size (0): nothing to set beside the count.
    published = f" (published {config.published_parameters / 1e9:g} B)" if config.published_parameters else ""
    click.echo(
        f"{config.name}: {summary['parameters'] / 1e9:.3f} B parameters{experts}{published}, "
        f"{config.num_layers} layers, {summary['forward_flops_per_token'] / 1e9:.2f} GFLOP forward per token at "
        f"s={summary['seq_len']}\n"
        f"on {profile.device}, b={profile.microbatch_size}, tp={options['tp']}, recompute={recompute}: per layer "
        f"forward {summary['layer_forward_s'] * 1e3:.3f} ms, backward {summary['layer_backward_s'] * 1e3:.3f} ms "
        f"(input {summary['layer_backward_input_s'] * 1e3:.3f} + weights {summary['layer_backward_weight_s'] * 1e3:.3f}), "
        f"optimizer {summary['layer_update_s'] * 1e3:.3f} ms, "
        f"stash {summary['layer_stash_bytes'] / 1e9:.3f} GB (re-created in its backward "
        f"{summary['layer_recomputed_bytes'] / 1e9:.3f} GB), weights {summary['layer_param_bytes'] / 1e9:.3f} GB; "
        f"all layers' weights per tensor-parallel rank {summary['rank_param_bytes'] / 1e9:.2f} GB\n"
        f"source: {config.source}"
    )
    if show_ops:
        width = max(18, *(len(op.name) + 2 for op in ops))
        click.echo(f"{'op':<{width}}{'kind':<12}{'forward ms':>12}{'input ms':>12}{'weight ms':>12}")
        for op in ops:
            click.echo(f"{op.name:<{width}}{op.kind:<12}{op.forward_s * 1e3:>12.4f}{op.input_grad_s * 1e3:>12.4f}"
                       f"{op.weight_grad_s * 1e3:>12.4f}")
    if out_path is not None:
        click.echo(f"wrote {out_path}")
