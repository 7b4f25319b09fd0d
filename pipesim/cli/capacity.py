"""Capacity options of ``simulate``: a model in place of a profile, TP/CP/EP/DP, ZeRO, batch sizes, a memory budget."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import click

from pipesim.cli.model import MODEL_OPTIONS, Hardware, build_model_profile, resolve_hardware, with_options
from pipesim.cli.options import non_empty, parse_uniform
from pipesim.errors import ConfigError
from pipesim.export.report import verdict_text
from pipesim.metrics import memory_verdict
from pipesim.spec.collectives import Group, group_path
from pipesim.spec.files import load_profile
from pipesim.spec.model_files import load_model
from pipesim.spec.parallel import (
    data_parallel_profile,
    microbatches_per_pipeline,
    tensor_parallel_profile,
    zero_optimizer_multiplier,
)
from pipesim.spec.profile import Profile
from pipesim.spec.topology import Topology
from pipesim.spec.transformer import PRESETS, RECOMPUTE_MODES, forward_flops_per_token
from pipesim.spec.sharding import holds_state_per_layer
from pipesim.spec.transformer_profile import (
    ADAM_BYTES_PER_PARAMETER,
    ADAM_STATE_MULTIPLIER,
    FP16_EXTRA_BYTES_PER_PARAMETER,
    PLACEMENTS,
    Parallelism,
    pipeline_topology,
)
from pipesim.spec.units import format_size, parse_size, size_unit

# ``--model`` with the model options, ``--cp``, ``--ep``, ``--placement``, ``--dp``, ``--dp-overlap``,
# ``--zero``, ``--fsdp``, ``--global-batch`` and ``--memory``.
capacity_options = with_options([
    click.option("--model", "model", type=str, default=None, callback=non_empty,
                 help="A transformer in place of --profile/--uniform: a preset (pipesim model), a Hugging Face "
                      "config.json or pipesim's model JSON; --recompute / --recompute-stages MODE set its "
                      "recomputation."),
    *MODEL_OPTIONS,
    click.option("--cp", "cp", type=int, default=1, show_default=True,
                 help="Context-parallel degree C (--model only): each sequence split over C GPUs, attention as a "
                      "ring of K/V passes on the tier the CP group spans; GPUs = tp x cp x pp x dp."),
    click.option("--ep", "ep", type=int, default=1, show_default=True,
                 help="Expert-parallel degree E (--model with a mixture of experts): the routed experts split over "
                      "E of the dp x cp ranks, tokens dispatched and combined by all-to-all."),
    click.option("--dp", "dp", type=int, default=1, show_default=True,
                 help="Data-parallel pipelines D: each layer's gradients are reduced over the DP group on the "
                      "cluster tier it spans."),
    click.option("--placement", "placement", type=click.Choice(PLACEMENTS), default="tp-in-node", show_default=True,
                 help="tp-in-node (Megatron's order: TP ranks neighbours, then DP, then PP); pp-in-node: a "
                      "pipeline's stages neighbours, then TP, then DP."),
    click.option("--dp-overlap", "dp_overlap", is_flag=True, default=False,
                 help="Overlap each layer's gradient reduction with the minibatch's last backward (it starts "
                      "when the layer's gradient is ready, one layer at a time): the update waits only for what "
                      "outlasts the backward, and the communication takes its tier's share of the compute. With "
                      "--zero 1 the weights' all-gather, which follows the optimizer step, runs beside the next "
                      "step's first forward instead (Megatron-Core's --overlap-param-gather)."),
    click.option("--zero", "zero", type=click.IntRange(0, 3), default=0, show_default=True,
                 help="ZeRO stage over the dp x cp ranks: 1 (Megatron's distributed optimizer) shards the "
                      "optimizer state and step; 2 also the gradients (reduce-scattered per layer and microbatch; "
                      "--model only); 3 also the weights (all-gathered per layer, forward and backward; --model "
                      "only)."),
    click.option("--fsdp", "fsdp", is_flag=True, default=False,
                 help="PyTorch FSDP (full sharding): --zero 3 by its PyTorch name."),
    click.option("--global-batch", "global_batch", type=int, default=None,
                 help="Samples per step over all D pipelines: M = global / (microbatch size x D)."),
    click.option("--memory", "memory", type=str, default=None, callback=non_empty,
                 help="Memory budget per device (e.g. 80GB, 80GiB; default the device's memory as its driver "
                      "reports it): the output says per device whether it fits."),
])


# The model options that only shape a profile --model builds: refused with --profile or --uniform.
MODEL_ONLY = ("seq_len", "efficiency", "calibrate_path", "sequence_parallel", "tp_overlap", "precision")


@dataclass(frozen=True)
class Capacity:
    """What the capacity options decided for one simulate call.

    Attributes:
        profile: the profile to simulate (a model's, or the given one with TP and DP applied).
        num_microbatches: M from ``--global-batch`` (or the one given).
        optimizer_state_multiplier: optimizer bytes per weight byte on one replica.
        recompute, recompute_stages: what is left for the plan (a model takes its mode itself).
        bandwidth, latency: the pipeline link's defaults (with ``--model``, the outermost hop's).
        links, sequence_parallel: with ``--model`` and neither --bandwidth nor --latency, the layout
            whose hops ``pipeline_links`` puts each on its tier (else None).
        memory_budget_bytes: per device, or None for no budget.
        hardware: the device and cluster used for links and peak FLOP/s.
        tp, dp, seq_len: degrees, and tokens per sample (0 without a model).
        cp, ep, zero: context- and expert-parallel degrees and the ZeRO stage.
        forward_flops_per_token: the model's, 0 without a model.
        precision: the matrix precision MFU is counted against.
        record: with a model, what the run's outputs record of its inputs (``capacity_record``).
    """

    profile: Profile
    num_microbatches: int | None
    optimizer_state_multiplier: float
    recompute: bool
    recompute_stages: str | None
    bandwidth: str | None
    latency: str | None
    memory_budget_bytes: float | None
    hardware: Hardware
    tp: int
    dp: int
    seq_len: int
    forward_flops_per_token: float
    precision: str
    record: dict[str, Any] | None = None
    num_model_layers: int = 0
    memory_budget_text: str | None = None
    memory_budget_unit: str = "GB"

    def default_partition(self, num_stages: int) -> tuple[tuple[int, int], ...] | None:
        """With a model, Megatron's cut (equal transformer layers per stage, the embedding first and the
        head last) where the stages divide the layers; else None (simulate balances the stages)."""
        if not self.num_model_layers:
            return None
        from pipesim.training import megatron_partition  # noqa: PLC0415 - only where a model is named

        return megatron_partition(self.num_model_layers, num_stages)
    cp: int = 1
    ep: int = 1
    zero: int = 0
    links: Parallelism | None = None
    sequence_parallel: bool = False

    def pipeline_links(self, num_devices: int) -> Topology | None:
        """With a model and neither --bandwidth nor --latency, ``num_devices`` pipeline ranks with each
        hop on the tier it crosses (``pipeline_topology``); else None (the flags' one link for all)."""
        if self.links is None:
            return None
        layout = dataclasses.replace(self.links, pp=num_devices)
        return pipeline_topology(self.hardware.cluster, layout, memory_bytes=math.inf,
                                 sequence_parallel=self.sequence_parallel and self.tp > 1)

    @property
    def is_set(self) -> bool:
        """Whether any capacity option asked for the extra output (model, degrees or budget)."""
        return self.seq_len > 0 or self.tp > 1 or self.dp > 1 or self.memory_budget_bytes is not None


def capacity_setup(context: click.Context, options: dict[str, Any], *, profile_path: str | None, uniform: str | None,
                   num_microbatches: int | None, recompute: bool, recompute_stages: str | None,
                   optimizer_state_multiplier: float, bandwidth: str | None, latency: str | None,
                   num_ranks: int | None) -> Capacity:
    """Resolve the capacity options against simulate's own.

    Raises:
        ConfigError: not exactly one of --profile, --uniform, --model; --zero or --dp-overlap
            without --dp above 1; a recompute list with a model; M given twice and disagreeing; an
            indivisible global batch; bad degrees or sizes.
    """
    model: str | None = options["model"]
    given = [flag for flag, value in (("--profile", profile_path), ("--uniform", uniform), ("--model", model)) if value]
    if len(given) != 1:
        raise ConfigError("profile", ", ".join(given) or None, "give exactly one of --profile FILE, --uniform ... "
                          "or --model NAME|FILE")
    tp, dp, cp, ep = options["tp"], options["dp"], options["cp"], options["ep"]
    zero = _zero_stage(context, options)
    if dp * cp == 1:
        for name, value, rule in (("zero", zero, f"ZeRO-{zero} shards the optimizer state over the data-parallel "
                                   "pipelines"),
                                  ("dp_overlap", options["dp_overlap"], "it overlaps the data-parallel reduction "
                                   "with the last backward")):
            if value:
                raise ConfigError(name, value, f"needs --dp D > 1 ({rule})")
    hardware = resolve_hardware(options)
    layout = Parallelism(tp=tp, pp=max(1, num_ranks or 1), dp=dp, placement=options["placement"], cp=cp, ep=ep)
    tp_stride, _, dp_stride = layout.strides
    seq_len, flops, config, mode = 0, 0.0, None, "none"
    links: Parallelism | None = None
    precision = options["precision"] or hardware.device.default_precision
    if model is not None:
        config = load_model(model)
        mode = "full" if recompute else (recompute_stages or "none")
        if mode not in RECOMPUTE_MODES:
            raise ConfigError("recompute_stages", mode, "with --model give one mode for every layer: "
                              f"{', '.join(RECOMPUTE_MODES)}")
        stated = context.get_parameter_source("optimizer_state_multiplier") is click.core.ParameterSource.COMMANDLINE
        if stated and holds_state_per_layer(config, layout, zero):
            raise ConfigError("optimizer_state", optimizer_state_multiplier, f"is set by the model under --zero "
                              f"{zero}{' with --ep' if zero == 1 else ''}: each layer holds Adam's 12 bytes per "
                              "parameter over its shard")
        profile = build_model_profile(config, hardware, efficiency=options["efficiency"],
                                      calibrate_path=options["calibrate_path"],
                                      microbatch_size=options["microbatch_size"], seq_len=options["seq_len"], tp=tp,
                                      sequence_parallel=options["sequence_parallel"], recompute=mode,
                                      precision=options["precision"], attention=options["attention"],
                                      pp=layout.pp, dp=dp, zero=zero, dp_overlap=options["dp_overlap"],
                                      placement=options["placement"], cp=cp, ep=ep, tp_overlap=options["tp_overlap"])
        recompute, recompute_stages = False, None
        seq_len = options["seq_len"] or config.seq_len
        flops = forward_flops_per_token(config, seq_len)
        if not stated:
            optimizer_state_multiplier = ADAM_STATE_MULTIPLIER
        sp = options["sequence_parallel"]
        if bandwidth is None and latency is None:
            links = layout
        # A flag given alone makes one link for every hop; the other value is the outermost hop's.
        outer = pipeline_topology(hardware.cluster, layout, memory_bytes=math.inf, sequence_parallel=sp and tp > 1)
        bandwidth = bandwidth or f"{outer.bandwidth_bytes_per_s}B/s"
        latency = latency or f"{outer.latency_s}s"
    else:
        profile = load_profile(profile_path) if profile_path else parse_uniform(uniform or "")
        if options["microbatch_size"] is not None and options["microbatch_size"] != profile.microbatch_size:
            raise ConfigError("microbatch_size", options["microbatch_size"], "must equal the profile's "
                              f"({profile.microbatch_size}); only --model builds a profile at another size")
        for name in MODEL_ONLY:
            if options[name] not in (None, False):
                raise ConfigError(name.removesuffix("_path"), options[name], "applies to --model only (it builds "
                                  "the profile); --profile and --uniform give their own times")
        for name, value, plain in (("cp", cp, 1), ("ep", ep, 1), ("zero", zero, min(zero, 1))):
            if value != plain:
                raise ConfigError(name, value, "applies to --model only (it splits the model's layers); --profile "
                                  "and --uniform take --tp, --dp and --zero 0 or 1")
        if tp > 1:
            bus = group_path(hardware.cluster, Group(tp, tp_stride)).bus_bytes_per_s
            profile = tensor_parallel_profile(profile, tp, bus)
        if dp > 1:
            bus = group_path(hardware.cluster, Group(dp, dp_stride)).bus_bytes_per_s
            profile = data_parallel_profile(profile, dp, bus, overlap=options["dp_overlap"])
    if options["global_batch"] is not None:
        derived = microbatches_per_pipeline(options["global_batch"], profile.microbatch_size, dp)
        if num_microbatches is not None and num_microbatches != derived:
            raise ConfigError("microbatches", num_microbatches, f"disagrees with --global-batch: "
                              f"{options['global_batch']} / ({profile.microbatch_size} x {dp}) = {derived}")
        num_microbatches = derived
    budget = parse_size(options["memory"], "memory") if options["memory"] else (
        hardware.device.memory_bytes if model is not None else None)
    if options["memory"]:
        budget_text, budget_unit = options["memory"].strip(), size_unit(options["memory"])
    else:
        budget_unit = "MiB"
        budget_text = f"{format_size(budget, 'MiB')} ({hardware.device.name}'s memory)" if budget else None
    record = None if model is None else capacity_record(options, model=model, config=config, hardware=hardware,
                                                        layout=layout, seq_len=seq_len, precision=precision,
                                                        recompute=mode, budget=budget,
                                                        num_microbatches=num_microbatches, zero=zero)
    return Capacity(profile=profile, num_microbatches=num_microbatches,
                    optimizer_state_multiplier=zero_optimizer_multiplier(optimizer_state_multiplier, dp * cp, zero),
                    recompute=recompute, recompute_stages=recompute_stages, bandwidth=bandwidth, latency=latency,
                    memory_budget_bytes=budget, hardware=hardware, tp=tp, dp=dp, seq_len=seq_len,
                    forward_flops_per_token=flops, precision=precision, record=record, cp=cp, ep=ep, zero=zero,
                    num_model_layers=config.num_layers if config is not None else 0,
                    memory_budget_text=budget_text, memory_budget_unit=budget_unit, links=links,
                    sequence_parallel=bool(options["sequence_parallel"]))


def _zero_stage(context: click.Context, options: dict[str, Any]) -> int:
    """The ZeRO stage --zero and --fsdp name (--fsdp is --zero 3).

    Raises:
        ConfigError: --fsdp with --zero other than 3.
    """
    if not options["fsdp"]:
        return int(options["zero"])
    if context.get_parameter_source("zero") is click.core.ParameterSource.COMMANDLINE and options["zero"] != 3:
        raise ConfigError("fsdp", True, f"is ZeRO-3 (weights, gradients and optimizer state sharded); it contradicts "
                          f"--zero {options['zero']}")
    return 3


def capacity_record(options: dict[str, Any], *, model: str, config: Any, hardware: Hardware, layout: Parallelism,
                    seq_len: int, precision: str, recompute: str, budget: float | None,
                    num_microbatches: int | None, zero: int) -> dict[str, Any]:
    """What a ``--model`` run's outputs record of its inputs: the model, device and cluster (name or
    file, with the SHA-256 of the file behind each), the layout, batch and the cost model's settings."""
    from pipesim.spec.model_files import model_to_json
    from pipesim.spec.provenance import named_identity, text_identity

    if model.strip().lower() in PRESETS:
        model_identity = text_identity(f"{config.name} (preset)", model_to_json(config))
    else:
        model_identity = named_identity("models", model)
    links = ("gpus_per_node", "intra_node_bandwidth", "inter_node_bandwidth", "inter_node_latency")
    return {
        "model": model_identity,
        "device": named_identity("devices", hardware.device_name),
        "cluster": text_identity("from the link flags", hardware.cluster.model_dump_json())
        if any(options.get(flag) is not None for flag in links) else named_identity("clusters", hardware.cluster_name),
        "cluster_flags": {flag: options[flag] for flag in links if options.get(flag) is not None} or None,
        "seq_len": seq_len, "microbatch_size": options["microbatch_size"] or 1,
        "global_batch": options["global_batch"], "num_microbatches": num_microbatches,
        "tp": layout.tp, "cp": layout.cp, "ep": layout.ep, "pp": layout.pp, "dp": layout.dp,
        "placement": layout.placement, "sequence_parallel": bool(options["sequence_parallel"]),
        "tp_overlap": bool(options["tp_overlap"]), "recompute": recompute,
        "zero": zero, "fsdp": bool(options["fsdp"]), "dp_overlap": bool(options["dp_overlap"]),
        "optimizer_state_bytes_per_parameter": 2 * ADAM_STATE_MULTIPLIER / (layout.dp * layout.cp if zero else 1),
        "optimizer_step_bytes_per_parameter": ADAM_BYTES_PER_PARAMETER
        + (FP16_EXTRA_BYTES_PER_PARAMETER if precision == "fp16" else 0.0),
        "precision": precision, "attention": options["attention"], "efficiency": options["efficiency"],
        "calibrate": options["calibrate_path"], "memory_budget_bytes": budget,
    }


def capacity_fields(data: dict[str, Any], capacity: Capacity) -> dict[str, Any]:
    """The keys the capacity options add to a ``simulate --json`` object (none without them).

    ``fits`` and ``device_memory_headroom_bytes`` (budget minus each device's peak, negative
    where over) with a budget; degrees, global throughput and, with a model, tokens/s, model FLOP
    utilisation (3 x forward FLOPs per token, Narayanan et al.'s count, over the peak of all
    P x T x C x D GPUs) and model TFLOP/s per GPU (the same FLOPs per step / step time / GPUs).
    """
    if not capacity.is_set:
        return {}
    fields: dict[str, Any] = {"tp": capacity.tp, "cp": capacity.cp, "ep": capacity.ep, "dp": capacity.dp,
                              "zero": capacity.zero,
                              "global_throughput_samples_per_s": data["throughput_samples_per_s"] * capacity.dp}
    if capacity.memory_budget_bytes is not None:
        fields.update(memory_verdict(data["device_peak_memory_bytes"], capacity.memory_budget_bytes))
        fields.update(memory_budget=capacity.memory_budget_text, memory_budget_unit=capacity.memory_budget_unit)
    if capacity.seq_len:
        gpus = data["num_ranks"] * capacity.tp * capacity.cp * capacity.dp
        from pipesim.training import model_throughput  # noqa: PLC0415 - only where a model is named

        peak = capacity.hardware.device.peak(capacity.precision)
        tokens, mfu = model_throughput(data["throughput_samples_per_s"], dp=capacity.dp, seq_len=capacity.seq_len,
                                       forward_flops_per_token=capacity.forward_flops_per_token, num_gpus=gpus,
                                       peak_flops=peak)
        fields.update(num_gpus=gpus, tokens_per_s=tokens, mfu=mfu, model_tflops_per_gpu=mfu * peak / 1e12,
                      device=capacity.hardware.device.name, cluster=capacity.hardware.cluster.name,
                      precision=capacity.precision)
    return fields


def capacity_headline(data: dict[str, Any]) -> str:
    """One line: the memory verdict and, with a model, tokens/s, MFU and TFLOP/s per GPU ("" without capacity keys)."""
    parts = []
    if "fits" in data:
        parts.append(verdict_text(data))
    if "tokens_per_s" in data:
        extra = "".join(f", {name}={data[name]}" for name in ("cp", "ep", "zero") if data.get(name, 0) > 1
                        or (name == "zero" and data.get(name)))
        parts.append(f"{data['num_gpus']} GPUs (tp={data['tp']}, dp={data['dp']}{extra}): "
                     f"{data['tokens_per_s']:.0f} tokens/s, MFU {data['mfu']:.1%}, "
                     f"{data['model_tflops_per_gpu']:.1f} model TFLOP/s per GPU")
    elif data.get("dp", 1) > 1:
        parts.append(f"dp={data['dp']}: {data['global_throughput_samples_per_s']:.2f} samples/s in all")
    return "; ".join(parts)
