"""``pipesim device``: show a device file (shipped or a user's), or measure a GPU into one (``calibrate``)."""

from __future__ import annotations

import json
from typing import Any

import click

from pipesim.cli.options import non_empty
from pipesim.cli.outputs import out_file_option, writing
from pipesim.errors import ConfigError
from pipesim.spec.cluster import load_cluster, shipped_clusters
from pipesim.spec.device import Device, load_device, shipped_devices


class DeviceGroup(click.Group):
    """``pipesim device NAME|FILE`` shows a device; ``pipesim device calibrate`` measures one."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:  # noqa: D102 - click's API
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["show", *args]
        return super().parse_args(ctx, args)


@click.group("device", cls=DeviceGroup, invoke_without_command=True)
@click.option("--list", "show_list", is_flag=True, help="List the shipped devices and clusters.")
@click.pass_context
def device_group(context: click.Context, show_list: bool) -> None:
    """Show a GPU's data (peak rates, memory, efficiency curves, sources) or measure one: NAME|FILE, calibrate."""
    if context.invoked_subcommand is None:
        if not show_list:
            click.echo(context.get_help())
            return
        click.echo(f"devices: {', '.join(shipped_devices())}\nclusters: {', '.join(shipped_clusters())}")


def summary(device: Device) -> dict[str, Any]:
    """The ``--json`` object: the device file's fields, ``peak_flops`` by precision among them."""
    return device.model_dump(mode="json", by_alias=True, exclude_none=True)


@device_group.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the device as one JSON object (the file's fields).")
def show_command(name: str, as_json: bool) -> None:
    """Print the device NAME (shipped) or FILE: peaks, memory, curves and where each number comes from."""
    device = load_device(name)
    if as_json:
        click.echo(json.dumps(summary(device), sort_keys=True))
        return
    peaks = ", ".join(f"{precision} {rate / 1e12:g}" for precision, rate in device.peak_flops.items())
    matmul, memory, attention = device.matmul, device.memory, device.attention
    example = device.matmul_efficiency(8192, 8192, 8192, precision=device.default_precision)
    kinds = ", ".join(f"{kind} {share:g}" for kind, share in memory.kind_efficiency.items())
    click.echo(
        f"{device.name}: {device.description}\n"
        f"  memory            {device.memory_bytes / 2**20:,.0f} MiB ({device.memory_bytes / 1e9:.1f} GB) as the "
        f"driver reports it\n"
        f"  peak TFLOP/s      {peaks} (dense matrix); vector {device.vector_flops / 1e12:g}\n"
        f"  memory bandwidth  {device.memory_bandwidth_bytes_per_s / 1e12:g} TB/s; copies reach {memory.max_efficiency:g}"
        + (f"; relative to a copy: {kinds}" if kinds else "") + "\n"
        f"  matrix products   {matmul.max_efficiency:g} of peak (the fitted curve), {device.sustained_share:g} of that "
        f"once hot; tiles {', '.join(f'{t.m}x{t.n}' for t in matmul.tiles)} on {device.num_sms} SMs; "
        f"{matmul.k_overhead:g} of k per tile; an 8192^3 product reaches {example:.3f} of peak\n"
        f"  attention (fused) forward {attention.forward_max_efficiency:g}, backward "
        f"{attention.backward_max_efficiency:g} of peak at d=128 (halves at s={attention.forward_seq_half:g} and "
        f"{attention.backward_seq_half:g}, d ramp {attention.head_dim_half:g})\n"
        f"  kernel launch     {device.launch_s * 1e6:.2f} us; usual cluster {device.default_cluster or '-'}"
    )
    if device.sources:
        click.echo("  sources:")
        for field, source in device.sources.items():
            click.echo(f"    {field}: {source}")


@device_group.command("calibrate")
@click.option("--out", "out_path", required=True, type=str, callback=out_file_option(None),
              help="The device file to write.")
@click.option("--base", "base", type=str, default=None, callback=non_empty,
              help="The datasheet file the measurement completes (a shipped name or a file; default the shipped "
                   "device whose description matches the GPU's name).")
@click.option("--name", "name", type=str, default=None, callback=non_empty, help="The written device's name.")
@click.option("--measurements", "measurements_path", type=str, default=None, callback=non_empty,
              help="Fit a measurement file written earlier (python -m pipesim.harness.rank.device_calibration) instead "
                   "of measuring: no GPU needed.")
@click.option("--save-measurements", "save_path", type=str, default=None, callback=out_file_option(None),
              help="Also write the raw measurements here.")
@click.option("--cluster-out", "cluster_path", type=str, default=None, callback=out_file_option(None),
              help="Also write a cluster file: the device's usual cluster with its in-node tier's bus efficiency "
                   "and latency fitted to NCCL's all-reduce, reduce-scatter and all-gather across this machine's "
                   "GPUs (measured where there are two or more; --measurements FILE must hold them).")
def calibrate_command(out_path: str, base: str | None, name: str | None, measurements_path: str | None,
                      save_path: str | None, cluster_path: str | None) -> None:
    """Measure this machine's GPU (GEMMs over shapes, attention, copies, a sustained product; NCCL collectives
    across its GPUs where it has several) and write a device file."""
    from pipesim.spec.calibration import fit_device
    from pipesim.spec.files import model_to_json, read_json, write_text_atomic

    if measurements_path is not None:
        measurements = read_json(measurements_path, "measurements")
        if not isinstance(measurements, dict):
            raise ConfigError("measurements", measurements_path, "must hold a JSON object")
        if cluster_path is not None and "collectives" not in measurements:
            raise ConfigError("cluster_out", cluster_path, f"needs collectives and {measurements_path} holds none "
                              "(they are measured on a machine with two or more GPUs)")
    else:
        measurements = _measure(cluster_path)
        if save_path is not None:
            with writing(save_path):
                write_text_atomic(save_path, json.dumps(measurements, indent=1) + "\n")
    gpu = str(measurements.get("machine", {}).get("gpu") or "")
    device = fit_device(measurements, load_device(base or _matching(gpu)), name=name)[0]
    with writing(out_path):
        write_text_atomic(out_path, model_to_json(device))
    fit = (device.measured or {}).get("fit_rms_log_error", {})
    click.echo(f"wrote {out_path}: {device.name}, matrix {device.matmul.max_efficiency:g} of peak "
               f"(fit error {fit.get('matmul', 0):.1%}), attention {device.attention.forward_max_efficiency:g}/"
               f"{device.attention.backward_max_efficiency:g} (fit error {fit.get('attention', 0):.1%}), copies "
               f"{device.memory.max_efficiency:g} of {device.memory_bandwidth_bytes_per_s / 1e12:g} TB/s")
    if cluster_path is not None:
        from pipesim.spec.calibration import fit_collectives
        from pipesim.spec.transformer_profile import default_cluster

        cluster, error = fit_collectives(measurements["collectives"], default_cluster(device))
        with writing(cluster_path):
            write_text_atomic(cluster_path, model_to_json(cluster))
        tier = cluster.tiers[0]
        click.echo(f"wrote {cluster_path}: {cluster.name}, {tier.name} {tier.bus_efficiency:g} of "
                   f"{tier.bandwidth_bytes_per_s / 1e9:g} GB/s in collectives, {tier.latency_s * 1e6:.3g} us a hop "
                   f"(fit error {error:.1%})")


def _measure(cluster_path: str | None) -> dict[str, Any]:
    """This machine's GPU measured, with NCCL collectives across its GPUs where it has several."""
    from pipesim.harness import require_torch

    require_torch()
    from pipesim.harness.rank.device_calibration import cuda_available, cuda_device_count, measure_device

    if not cuda_available():
        raise ConfigError("device", "cuda", "calibrate measures a CUDA GPU and torch sees none here; "
                          "--measurements FILE fits measurements taken elsewhere")
    gpus = cuda_device_count()
    if cluster_path is not None and gpus < 2:
        raise ConfigError("cluster_out", cluster_path, f"needs two or more GPUs to time NCCL collectives (torch "
                          f"sees {gpus}); --measurements FILE fits collectives timed elsewhere")
    measurements = measure_device(progress=lambda text: click.echo(f"calibrate: {text}", err=True))
    if gpus >= 2:
        from pipesim.harness.linkbench import measure_collectives

        click.echo(f"calibrate: NCCL collectives across {gpus} GPUs", err=True)
        measurements["collectives"] = measure_collectives(gpus, backend="nccl")
    return measurements


# A GPU's name as torch reports it, by the words that pick its shipped datasheet file.
GPU_NAMES = ((("h200",), "h200"), (("h100",), "h100"), (("a100", "80gb"), "a100-80gb"), (("a100",), "a100-40gb"),
             (("v100",), "v100"))


def _matching(gpu: str) -> str:
    """The shipped device for the measured GPU's name (``--base`` otherwise)."""
    lowered = gpu.lower().replace(" ", "").replace("-", "")
    for words, name in GPU_NAMES:
        if all(word in lowered for word in words):
            return name
    raise ConfigError("base", gpu or None, f"no shipped device matches this GPU; give --base with one of "
                      f"{', '.join(shipped_devices())} or a datasheet file")


@click.command("cluster")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the cluster as one JSON object (the file's fields).")
def cluster_command(name: str, as_json: bool) -> None:
    """Show a cluster NAME (shipped) or FILE: its tiers of links per GPU and their sources."""
    cluster = load_cluster(name)
    if as_json:
        click.echo(json.dumps(cluster.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=True))
        return
    click.echo(f"{cluster.name}: {cluster.description}")
    for tier in cluster.tiers:
        span = f"{tier.gpus} GPUs" if tier.gpus else "every GPU"
        click.echo(f"  {tier.name:<12} {span:>10}: {tier.bandwidth_bytes_per_s / 1e9:g} GB/s per GPU per direction, "
                   f"{tier.bus_efficiency:g} of it in collectives, {tier.latency_s * 1e6:g} us per hop, "
                   f"{tier.compute_share:g} of compute while overlapped")
    for field, source in cluster.sources.items():
        click.echo(f"    {field}: {source}")
