"""``pipesim search``: the best simulated layout, schedule and memory settings for a model on N GPUs (docs/search.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from pipesim.cli.options import non_empty
from pipesim.cli.outputs import ProgressBar, out_folder, writing
from pipesim.errors import ConfigError
from pipesim.search import Outcome, search, search_counts
from pipesim.spec.cluster import load_cluster
from pipesim.spec.device import PRECISIONS, load_device
from pipesim.spec.model_files import load_model
from pipesim.spec.transformer_profile import PLACEMENTS
from pipesim.spec.units import parse_size

BEST_KEYS = ("tp", "pp", "dp", "microbatch_size", "schedule", "stages_per_rank", "recompute", "tokens_per_s", "mfu",
             "peak_memory_bytes", "fits", "sequence_parallel", "cp", "ep", "zero")
COUNT_KEYS = ("num_candidates", "num_simulated", "num_pruned_by_memory", "num_pruned_by_bound")


@click.command("search")
@click.option("--model", "model", required=True, type=str, callback=non_empty,
              help="A transformer: a preset (see pipesim model), a Hugging Face config.json or pipesim's model JSON.")
@click.option("--device", "device", required=True, type=str, callback=non_empty,
              help="A shipped device or a device file; its memory is the budget unless --memory says otherwise.")
@click.option("--cluster", "cluster", type=str, default=None, callback=non_empty,
              help="A shipped cluster or a cluster file (default the device's usual system).")
@click.option("--gpus", "num_gpus", required=True, type=int, help="GPUs N = TP x CP x PP x DP.")
@click.option("--global-batch", "global_batch", required=True, type=int, help="Sequences per optimizer step.")
@click.option("--seq-len", "seq_len", type=int, default=None, help="Sequence length (default the model's).")
@click.option("--memory", "memory", type=str, default=None, callback=non_empty,
              help="Memory budget per GPU, e.g. 80GB.")
@click.option("--efficiency", type=float, default=None,
              help="What-if: the device's sustained matrix share of peak in place of its file's.")
@click.option("--zero", "zero", type=click.IntRange(0, 3), default=None,
              help="Only this ZeRO stage (default: 0 and 1 with data parallelism, 2 and 3 too without a pipeline).")
@click.option("--allow-uneven", "allow_uneven", is_flag=True, default=False,
              help="Also stage counts Megatron cannot cut into whole equal stages (cut by balanced compute).")
@click.option("--placement", "placement", type=click.Choice(PLACEMENTS), default="tp-in-node", show_default=True,
              help="tp-in-node (Megatron's): TP inside a node (TP <= its GPUs), pipeline and DP over the NIC; "
                   "pp-in-node: a pipeline inside a node (PP <= its GPUs, hops over NVLink), TP and DP over the NIC.")
@click.option("--dp-overlap", "dp_overlap", is_flag=True, default=False,
              help="Overlap the DP gradient reduction with the last backward, and ZeRO-1's weight "
                   "all-gather with the next forward (as simulate --dp-overlap).")
@click.option("--precision", "precision", type=click.Choice(PRECISIONS), default=None,
              help="Matrix precision (as simulate --precision; default bf16, fp16 on cards without bf16).")
@click.option("--tp-overlap", "tp_overlap", is_flag=True, default=False,
              help="In candidates with sequence parallelism, run its all-gathers and reduce-scatters beside the GEMMs "
                   "next to them (as simulate --tp-overlap).")
@click.option("--workers", type=int, default=None,
              help="Simulate on an embedded Dask cluster of this many processes on 127.0.0.1, in rounds best "
                   "bound first (default: in this process).")
@click.option("--scheduler", type=str, default=None, help="Run on an existing Dask scheduler, tcp://HOST:PORT.")
@click.option("--progress/--no-progress", default=None,
              help="Show progress on stderr: a bar on a terminal, a line at every tenth elsewhere (default: when "
                   "stderr is a terminal).")
@click.option("--top", "top", type=click.IntRange(min=1), default=10, show_default=True,
              help="Configurations ranked exactly, explained and shown (the pruning keeps the top K exact).")
@click.option("--json", "as_json", is_flag=True,
              help='Print {"best": {...}, "candidates": [every candidate with its status and reason], "run": {the inputs}, '
                   '"num_candidates", "num_simulated", "num_pruned_by_memory", "num_pruned_by_bound"}.')
@click.option("--out", "out_dir", type=str, default=None, callback=non_empty,
              help="Write candidates.csv, run.json (its inputs) and pareto.png (tokens/s against peak memory of the simulated ones).")
def search_command(model: str, device: str, cluster: str | None, num_gpus: int, global_batch: int,
                   seq_len: int | None, memory: str | None, efficiency: float | None, zero: int | None,
                   allow_uneven: bool, placement: str,
                   dp_overlap: bool, precision: str | None, tp_overlap: bool, workers: int | None,
                   scheduler: str | None,
                   progress: bool | None, top: int, as_json: bool, out_dir: str | None) -> None:
    """Search TP x CP x PP x DP (EP), microbatch size, schedule and V, sequence parallelism, recomputation
    and ZeRO: prune by proven memory and step-time bounds, simulate the rest on the analytic engine,
    and rank by tokens/s."""
    if workers is not None and scheduler is not None:
        raise ConfigError("workers", workers, "give either --workers (embedded cluster) or --scheduler, not both")
    out = out_folder(out_dir) if out_dir is not None else None
    budget = parse_size(memory, "memory") if memory else None
    spec = load_device(device)
    if efficiency is not None:
        if not 0 < efficiency <= 1:
            raise ConfigError("efficiency", efficiency, "must be in (0, 1]")
        spec = spec.model_copy(update={"matmul": spec.matmul.model_copy(update={"max_efficiency": efficiency})})
    config = load_model(model)
    wiring = load_cluster(cluster) if cluster else None
    bar = ProgressBar(sys.stderr.isatty() if progress is None else progress, label="search", unit="candidates")
    try:
        outcomes = search(config, device=spec, num_gpus=num_gpus, global_batch=global_batch, seq_len=seq_len,
                          memory_bytes=budget, zero=zero, placement=placement, dp_overlap=dp_overlap, cluster=wiring,
                          allow_uneven=allow_uneven, top=top, workers=workers, scheduler=scheduler, progress=bar,
                          tp_overlap=tp_overlap, precision=precision)
    finally:
        bar.stop()
    if outcomes and not any(outcome.partition for outcome in outcomes):
        raise ConfigError("gpus", num_gpus, _no_split(outcomes, num_gpus, global_batch, config.num_layers))
    rows = [outcome.to_dict() for outcome in outcomes]
    best = {**{key: rows[0][key] for key in BEST_KEYS}, "step_breakdown_s": outcomes[0].step_breakdown_s} \
        if outcomes and outcomes[0].fits else None
    counts = search_counts(outcomes)
    run = _run_record(model, config, device, cluster, spec, num_gpus=num_gpus, global_batch=global_batch,
                      seq_len=seq_len or config.seq_len, budget=spec.memory_bytes if budget is None else budget,
                      zero=zero, placement=placement, dp_overlap=dp_overlap, tp_overlap=tp_overlap,
                      precision=precision or spec.default_precision,
                      efficiency=efficiency, allow_uneven=allow_uneven, top=top)
    if out is not None:
        with writing(out):
            _write(rows, out, run, spec.memory_bytes if budget is None else budget)
    if as_json:
        click.echo(json.dumps({"best": best, "candidates": rows, "run": run, **counts}, sort_keys=True))
        return
    _print(outcomes, top, counts)
    if best is None:
        click.echo("no configuration fits: raise --memory, --gpus or --zero, or lower --global-batch or --seq-len")


def _run_record(model: str, config: Any, device: str, cluster: str | None, spec: Any, **settings: Any) -> dict[str, Any]:
    """The search's inputs, as simulate --model records them: model, device and cluster by name or
    file with the SHA-256 behind each, and the settings."""
    from pipesim.spec.model_files import model_to_json
    from pipesim.spec.provenance import command_line, named_identity, text_identity
    from pipesim.spec.transformer import PRESETS

    wiring = cluster or spec.default_cluster
    return {"command": command_line(),
            "model": text_identity(f"{config.name} (preset)", model_to_json(config))
            if model.strip().lower() in PRESETS else named_identity("models", model),
            "device": named_identity("devices", device), "cluster": named_identity("clusters", wiring), **settings}


def _no_split(outcomes: list[Outcome], num_gpus: int, global_batch: int, num_layers: int) -> str:
    """Why no candidate could be formed (each failed the arithmetic: a DP that does not divide the
    global batch, or stage counts that do not cut the layers), as the rule of a ConfigError."""
    degrees = sorted({outcome.candidate.dp for outcome in outcomes})
    dividing = [dp for dp in degrees if global_batch % dp == 0]
    rule = f"no TP x CP x PP x DP split of {num_gpus} GPUs suits --global-batch {global_batch}: "
    if not dividing:
        return rule + f"none of its DP degrees ({_listed(degrees)}) divides the batch"
    fewest = min(outcome.candidate.pp for outcome in outcomes if global_batch % outcome.candidate.dp == 0)
    if fewest > num_layers + 2:
        return rule + (f"the DP degrees that divide the batch ({_listed(dividing)}) leave {fewest} or more pipeline "
                       "stages, more than the model has layers")
    return rule + (f"the DP degrees that divide the batch ({_listed(dividing)}) leave pipelines of {fewest} or more "
                   f"stages, which do not cut the {num_layers} layers evenly (--allow-uneven cuts them by compute)")


def _listed(numbers: list[int], most: int = 8) -> str:
    """``1, 2, 4`` or, past ``most``, ``1, 2, ..., 500``."""
    shown = [str(n) for n in numbers]
    return ", ".join(shown if len(shown) <= most else [*shown[: most - 1], "...", shown[-1]])


def _print(outcomes: list[Outcome], top: int, counts: dict[str, int]) -> None:
    console = Console(highlight=False, width=None if Console().is_terminal else 200)
    table = Table(show_edge=False)
    headers = ("tp", "cp", "pp", "dp", "ep", "b", "m", "schedule", "V", "SP", "recompute", "zero", "tokens/s", "MFU",
               "peak GB", "step s", "compute", "bubble", "comm", "verdict")
    for header in headers:
        table.add_column(header, justify="right")
    simulated = [outcome for outcome in outcomes if outcome.status == "simulated"]
    for outcome in simulated[:top]:
        c, parts = outcome.candidate, outcome.step_breakdown_s or {}
        comm = sum(parts.get(name, 0.0) for name in ("tp_comm", "dp_comm", "pp_comm"))
        table.add_row(str(c.tp), str(c.cp), str(c.pp), str(c.dp), str(c.ep), str(c.microbatch_size),
                      str(c.num_microbatches), c.schedule, str(c.stages_per_rank), "on" if c.sequence_parallel else "off",
                      c.recompute, str(c.zero), f"{outcome.tokens_per_s:,.0f}", f"{outcome.mfu:.1%}",
                      f"{outcome.peak_memory_bytes / 1e9:.1f}", f"{outcome.iteration_time_s:.3f}",
                      *(f"{parts[name]:.3f}" if parts else "" for name in ("compute", "bubble")),
                      f"{comm:.3f}" if parts else "", outcome.reason)
    console.print(table)
    fitting = sum(outcome.fits for outcome in outcomes)
    console.print(f"{counts['num_candidates']:,} candidates: {counts['num_pruned_by_memory']:,} pruned by memory, "
                  f"{counts['num_pruned_by_bound']:,} by their step-time bound, {counts['num_simulated']:,} simulated, "
                  f"{fitting:,} fit ({counts['num_dropped']:,} layouts and schedules could not be formed)")


def _write(rows: list[dict[str, Any]], out: Path, run: dict[str, Any], budget: float) -> None:
    import pandas as pd

    from pipesim.plots import pareto, save_figure, use_headless_backend
    from pipesim.spec.files import write_text_atomic

    frame = pd.DataFrame(rows)
    write_text_atomic(out / "candidates.csv", frame.to_csv(index=False))
    write_text_atomic(out / "run.json", json.dumps(run, indent=2, sort_keys=True) + "\n")  # what candidates.csv came from
    simulated = frame[frame["status"] == "simulated"]
    if not simulated.empty:
        use_headless_backend()
        save_figure(pareto(simulated, x="peak_memory_bytes", y="tokens_per_s", hue="schedule", budget=budget,
                           fits="fits"), out / "pareto.png")


# candidates.csv (``--out``) as ``pipesim report`` reads it back: its columns, those that hold numbers.
CANDIDATE_NUMBERS = ("tp", "pp", "dp", "microbatch_size", "num_microbatches", "stages_per_rank", "tokens_per_s",
                     "mfu", "iteration_time_s", "peak_memory_bytes", "cp", "ep", "zero", "step_bound_s")
CANDIDATE_COLUMNS = (*CANDIDATE_NUMBERS, "schedule", "recompute", "status", "reason", "fits", "partition")


def read_candidates(path: Path) -> Any:
    """A search's candidates.csv: every column of ``CANDIDATE_COLUMNS``, numbers as numbers and
    ``fits`` true or false (extra columns are kept).

    Raises:
        ConfigError: an unreadable file, a missing column or a value of the wrong kind, naming
            the file, the column, the value and its row.
    """
    import pandas as pd

    try:
        frame = pd.read_csv(path, keep_default_na=False, dtype=str)
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as error:
        raise ConfigError("table", str(path), f"is not a readable CSV table ({str(error).splitlines()[0]})") from None
    missing = [column for column in CANDIDATE_COLUMNS if column not in frame.columns]
    if missing:
        raise ConfigError("table", str(path), f"lacks the column {missing[0]!r} of a search's candidates.csv")
    for column in CANDIDATE_NUMBERS:
        numbers = pd.to_numeric(frame[column], errors="coerce")
        if numbers.isna().any():
            row = int(numbers.isna().to_numpy().argmax())
            raise ConfigError(column, frame[column].iloc[row], f"must be a number (row {row + 1})", source=str(path))
        frame[column] = numbers
    truth = frame["fits"].map({"True": True, "False": False})
    if truth.isna().any():
        row = int(truth.isna().to_numpy().argmax())
        raise ConfigError("fits", frame["fits"].iloc[row], f"must be True or False (row {row + 1})", source=str(path))
    frame["fits"] = truth.astype(bool)
    return frame

