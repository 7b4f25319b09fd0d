"""A training job from its model and layout: TP x CP x PP x DP (EP, ZeRO) on a device and cluster, simulated.

``simulate_training`` is the capacity study in one call (the Python form of ``pipesim simulate
--model``): it builds the rank's profile from the op cost model, cuts it as Megatron-LM does
(the same number of transformer layers per model stage, the embedding on the first and the
output layer on the last), links the stages over the cluster tier the pipeline spans, runs the
schedule on one pipeline, and reports the global step: tokens/s, model FLOP utilisation, model
TFLOP/s per GPU and whether each device fits its memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.errors import ConfigError
from pipesim.simulation import Result, make_plan, simulate_plan
from pipesim.spec.cluster import Cluster
from pipesim.spec.device import Device
from pipesim.spec.model_files import load_model
from pipesim.spec.opcost import Attention
from pipesim.spec.partition import megatron_cut
from pipesim.spec.parallel import microbatches_per_pipeline, zero_optimizer_multiplier
from pipesim.spec.transformer import Recompute, TransformerConfig, forward_flops_per_token
from pipesim.spec.transformer_profile import (
    ADAM_STATE_MULTIPLIER,
    Parallelism,
    default_cluster,
    pipeline_topology,
    resolve_device,
    transformer_profile,
)


@dataclass(frozen=True)
class TrainingResult:
    """One global-batch step of a training job.

    Attributes:
        result: the simulated pipeline (trace, metrics, plan).
        iteration_time_s: one global-batch step.
        tokens_per_s: tokens per second over all data-parallel pipelines.
        mfu: model FLOPs (3 x forward per token, recomputation not counted) over all GPUs' peak.
        model_tflops_per_gpu: the same FLOPs per step / step time / GPUs / 1e12.
        num_gpus: TP x CP x PP x DP.
        fits: every device's simulated peak within the memory budget.
        peak_memory_bytes: the largest device peak.
    """

    result: Result
    iteration_time_s: float
    tokens_per_s: float
    mfu: float
    model_tflops_per_gpu: float
    num_gpus: int
    fits: bool
    peak_memory_bytes: float

    def __repr__(self) -> str:
        verdict = "fits" if self.fits else "over budget"
        return (f"<TrainingResult {self.num_gpus} GPUs, step {self.iteration_time_s:.3g} s: {self.tokens_per_s:,.0f} "
                f"tokens/s, MFU {self.mfu:.1%}, {self.model_tflops_per_gpu:.1f} model TFLOP/s per GPU, peak "
                f"{self.peak_memory_bytes / 1e9:.1f} GB ({verdict})>")


def model_throughput(samples_per_s: float, *, dp: int, seq_len: int, forward_flops_per_token: float,
                     num_gpus: int, peak_flops: float) -> tuple[float, float]:
    """``(tokens/s, MFU)`` of D pipelines each at ``samples_per_s``: MFU counts 3 x forward FLOPs per
    token (Narayanan et al.'s model FLOPs, recomputation not counted) over all GPUs' peak."""
    tokens = samples_per_s * dp * seq_len
    return tokens, 3 * forward_flops_per_token * tokens / (num_gpus * peak_flops)


def megatron_partition(num_layers: int, num_stages: int) -> tuple[tuple[int, int], ...] | None:
    """Equal transformer layers per stage, the embedding (profile layer 0) on the first and the head
    (layer L + 1) on the last; None when the stages do not divide the layers."""
    return megatron_cut(num_layers, num_stages) if num_layers % num_stages == 0 else None


def megatron_schedule(stages_per_rank: int | None) -> str:
    """Megatron's pipeline schedule: 1F1B with one stage per rank, the interleaved 1F1B with several."""
    return "interleaved-1f1b" if stages_per_rank is not None and stages_per_rank > 1 else "1f1b"


def simulate_training(
    model: str | TransformerConfig,
    *,
    device: str | Device,
    global_batch: int,
    cluster: str | Cluster | None = None,
    tp: int = 1,
    pp: int = 1,
    dp: int = 1,
    cp: int = 1,
    ep: int = 1,
    stages_per_rank: int = 1,
    schedule: str = "1f1b",
    microbatch_size: int = 1,
    seq_len: int | None = None,
    sequence_parallel: bool = False,
    tp_overlap: bool = False,
    recompute: Recompute = "none",
    precision: str | None = None,
    attention: Attention = "flash",
    zero: int = 0,
    dp_overlap: bool = False,
    placement: str = "tp-in-node",
    memory_bytes: float | None = None,
    efficiency: float | None = None,
) -> TrainingResult:
    """Simulate one global-batch step of ``model`` on TP x CP x PP x DP GPUs.

    Args:
        model: a preset name, a model file or a TransformerConfig.
        device, cluster: shipped names, files, or loaded models (the cluster defaults to the device's).
        global_batch: sequences per optimizer step; M = global / (microbatch size x DP) per pipeline.
        tp, pp, dp, stages_per_rank: degrees; ``stages_per_rank`` V > 1 interleaves model stages.
        cp, ep: context parallelism (each sequence split over ``cp`` ranks: the batch is not) and
            expert parallelism (the routed experts over ``ep`` of the DP x CP ranks).
        zero: ZeRO stage 0 to 3 (3 is FSDP), over the DP x CP ranks.
        schedule: a registry key (``1f1b``, ``interleaved-1f1b``, ``zbv``, ...).
        Others as ``transformer_profile`` takes them; ``memory_bytes`` is the per-device budget
        (default the device's memory).

    Raises:
        ConfigError: degrees that do not divide the batch or the layers, or what the profile and
            the plan refuse.
    """
    config = load_model(model) if isinstance(model, str) else model
    spec = resolve_device(device)
    wiring = cluster if isinstance(cluster, Cluster) else default_cluster(spec) if cluster is None else None
    if wiring is None:
        from pipesim.spec.cluster import load_cluster

        wiring = load_cluster(str(cluster))
    layout = Parallelism(tp=tp, pp=pp, dp=dp, placement=placement, cp=cp, ep=ep)
    if stages_per_rank < 1:
        raise ConfigError("stages_per_rank", stages_per_rank, "must be >= 1")
    num_microbatches = microbatches_per_pipeline(global_batch, microbatch_size, dp)
    s = seq_len or config.seq_len
    profile = transformer_profile(config, device=spec, cluster=wiring, microbatch_size=microbatch_size, seq_len=s,
                                  tp=tp, sequence_parallel=sequence_parallel, tp_overlap=tp_overlap,
                                  recompute=recompute, precision=precision,
                                  attention=attention, efficiency=efficiency, pp=pp, dp=dp, zero=zero,
                                  dp_overlap=dp_overlap, placement=placement, cp=cp, ep=ep)
    num_stages = pp * stages_per_rank
    plan = make_plan(profile, schedule=schedule, num_stages=num_stages, num_microbatches=num_microbatches,
                     stages_per_rank=stages_per_rank, partition=megatron_partition(config.num_layers, num_stages),
                     optimizer_state_multiplier=zero_optimizer_multiplier(ADAM_STATE_MULTIPLIER, dp * cp, zero))
    budget = spec.memory_bytes if memory_bytes is None else memory_bytes
    topology = pipeline_topology(wiring, layout, memory_bytes=budget, sequence_parallel=sequence_parallel and tp > 1)
    result = simulate_plan(profile, topology, plan, engine="auto")
    metrics = result.metrics
    peak = spec.peak(precision or spec.default_precision)
    gpus = layout.num_gpus
    tokens, mfu = model_throughput(metrics.throughput_samples_per_s, dp=dp, seq_len=s,
                                   forward_flops_per_token=forward_flops_per_token(config, s), num_gpus=gpus,
                                   peak_flops=peak)
    highest = max(metrics.device_peak_memory_bytes)
    return TrainingResult(result=result, iteration_time_s=global_batch * s / tokens, tokens_per_s=tokens, mfu=mfu,
                          model_tflops_per_gpu=mfu * peak / 1e12, num_gpus=gpus, fits=highest <= budget,
                          peak_memory_bytes=highest)
