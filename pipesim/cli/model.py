"""``pipesim model``: a published transformer's sizes, FLOPs and per-layer profile on a device."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from pipesim.cli.outputs import out_file_option, writing
from pipesim.errors import ConfigError
from pipesim.spec.devices import DEVICES, DeviceSpec
from pipesim.spec.files import load_profile, save_model
from pipesim.spec.profile import Profile
from pipesim.spec.transformer import PRESETS, RECOMPUTE_MODES, Recompute, preset
from pipesim.spec.transformer_profile import calibrated_efficiency, model_summary, transformer_profile


def with_options(options: list[Callable[[Any], Any]]) -> Callable[[Any], Any]:
    """A decorator applying click ``options`` in order (the first listed shows first in --help)."""
    def apply(function: Any) -> Any:
        for option in reversed(options):
            function = option(function)
        return function
    return apply


# The options that turn a preset into a profile, shared by ``model``, ``simulate`` and ``search``.
MODEL_OPTIONS: list[Callable[[Any], Any]] = [
    click.option("--device", "device", type=click.Choice(list(DEVICES), case_sensitive=False), default="h100",
                 show_default=True, help="Device preset: peak FLOP/s, memory and links from vendor datasheets."),
    click.option("--efficiency", type=float, default=None,
                 help="Sustained share of the device's peak FLOP/s (default the preset's, 0.5)."),
    click.option("--calibrate", "calibrate_path", type=str, default=None,
                 help="A measured profile of the same model (embedding, blocks, head): set the efficiency "
                      "so the predicted compute time equals it."),
    click.option("--microbatch-size", "microbatch_size", type=int, default=None,
                 help="Sequences per microbatch b (default 1)."),
    click.option("--seq-len", "seq_len", type=int, default=None, help="Sequence length s (default the model's)."),
    click.option("--tp", "tp", type=int, default=1, show_default=True,
                 help="Tensor-parallel degree T inside a node: divides each layer, adds its all-reduces."),
    click.option("--sequence-parallel", is_flag=True, help="Megatron's sequence parallelism with --tp."),
]


def build_model_profile(name: str, *, device: str | DeviceSpec, efficiency: float | None, calibrate_path: str | None,
                        microbatch_size: int | None, seq_len: int | None, tp: int, sequence_parallel: bool,
                        recompute: Recompute) -> Profile:
    """The profile ``model_options`` describe, calibrated on a measured profile when one is given.

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
        efficiency = calibrated_efficiency(load_profile(calibrate_path), name, device=device,
                                           microbatch_size=b, seq_len=seq_len)
    return transformer_profile(name, device=device.lower() if isinstance(device, str) else device, microbatch_size=b,
                               seq_len=seq_len, tp=tp, sequence_parallel=sequence_parallel, recompute=recompute,
                               efficiency=efficiency)


@click.command("model")
@click.option("--preset", "name", required=True, type=click.Choice(list(PRESETS), case_sensitive=False),
              help="A published model (sizes from its paper, cited in pipesim/spec/transformer.py).")
@with_options(MODEL_OPTIONS)
@click.option("--recompute", type=click.Choice(RECOMPUTE_MODES), default="none", show_default=True,
              help="Activation recomputation: selective (attention, Korthikanti et al.) or full.")
@click.option("--out", "out_path", type=str, default=None, callback=out_file_option(None),
              help="Write the per-layer profile (pipesim JSON).")
@click.option("--json", "as_json", is_flag=True, help="Print the sizes as one JSON object.")
def model_command(name: str, device: str, efficiency: float | None, calibrate_path: str | None,
                  microbatch_size: int | None, seq_len: int | None, tp: int, sequence_parallel: bool,
                  recompute: Recompute, out_path: str | None, as_json: bool) -> None:
    """Size a published transformer on a device: parameters, FLOPs per token, per-layer time and memory."""
    config = preset(name)
    profile = build_model_profile(config.name, device=device, efficiency=efficiency, calibrate_path=calibrate_path,
                                  microbatch_size=microbatch_size, seq_len=seq_len, tp=tp,
                                  sequence_parallel=sequence_parallel, recompute=recompute)
    summary = model_summary(config, profile, tp=tp, recompute=recompute,
                            seq_len=config.seq_len if seq_len is None else seq_len)
    if out_path is not None:
        with writing(out_path):
            save_model(profile, out_path)
    if as_json:
        click.echo(json.dumps(summary, sort_keys=True))
        return
    click.echo(
        f"{config.name}: {summary['parameters'] / 1e9:.3f} B parameters (published {config.published_parameters / 1e9:g} B), "
        f"{config.num_layers} layers, {summary['forward_flops_per_token'] / 1e9:.2f} GFLOP forward per token at "
        f"s={summary['seq_len']}\n"
        f"on {profile.device}, b={profile.microbatch_size}, tp={tp}, recompute={recompute}: per layer forward "
        f"{summary['layer_forward_s'] * 1e3:.3f} ms, backward {summary['layer_backward_s'] * 1e3:.3f} ms, "
        f"stash {summary['layer_stash_bytes'] / 1e9:.3f} GB (re-created in its backward "
        f"{summary['layer_recomputed_bytes'] / 1e9:.3f} GB), weights {summary['layer_param_bytes'] / 1e9:.3f} GB; "
        f"all layers' weights per tensor-parallel rank {summary['rank_param_bytes'] / 1e9:.2f} GB\n"
        f"source: {config.source}"
    )
    if out_path is not None:
        click.echo(f"wrote {out_path}")
