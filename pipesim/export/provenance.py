"""The ``run`` record every output carries: which inputs, which settings, which pipesim, which command.

Two saved reports are told apart by reading them: the profile is named by its file name and the
SHA-256 of its bytes (a ``--uniform`` profile by its spec text), the topology likewise, and the
settings and command line are those the outputs came from.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from pipesim.spec.provenance import command_line

if TYPE_CHECKING:
    from pipesim.simulation import Result
    from pipesim.spec.topology import Topology

# The keys of the record, in the order the report shows them.
RUN_KEYS = ("command", "pipesim_version", "profile", "topology", "bandwidth_bytes_per_s", "latency_s", "schedule",
            "num_stages", "num_microbatches", "num_minibatches", "stages_per_rank", "engine")
# How a report labels a key of the record; any other key is written out by ``label``.
RUN_LABELS = {"pipesim_version": "pipesim version", "bandwidth_bytes_per_s": "link bandwidth",
              "latency_s": "link latency", "num_stages": "stages p", "num_microbatches": "microbatches m",
              "num_minibatches": "minibatches K", "stages_per_rank": "stages per rank V", "sha256": "SHA-256",
              "seq_len": "sequence length", "num_gpus": "GPUs", "tp": "tensor parallel TP",
              "pp": "pipeline parallel PP", "dp": "data parallel DP", "tokens_per_s": "tokens/s", "mfu": "MFU"}
# Unit suffixes of field names, as a label writes them.
_UNITS = (("_bytes_per_s", " (bytes/s)"), ("_per_s", " (per s)"), ("_bytes", " (bytes)"), ("_s", " (s)"))


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def run_record(result: Result, *, profile: dict[str, str], topology: Topology,
               topology_file: dict[str, str] | None = None, command: str | None = None) -> dict[str, Any]:
    """The ``run`` object of ``simulate``'s outputs (metrics.json, ``--json``, traces, report).

    ``bandwidth_bytes_per_s`` and ``latency_s`` are the topology's default link (null when
    communication is free); ``topology`` names its file, or says it was built from the flags (and
    how many hops have a link of their own: a model's pipeline hops inside a node).
    """
    from pipesim import __version__

    m = result.metrics
    return {
        "command": command_line() if command is None else command,
        "pipesim_version": __version__,
        "profile": profile,
        "topology": topology_file or {"name": _built(topology), "sha256": ""},
        "bandwidth_bytes_per_s": _finite(topology.bandwidth_bytes_per_s),
        "latency_s": topology.latency_s,
        "schedule": m.schedule,
        "num_stages": m.num_stages,
        "num_microbatches": m.num_microbatches,
        "num_minibatches": m.num_minibatches,
        "stages_per_rank": result.plan.stages_per_rank,
        "engine": m.engine,
    }


def _identity(value: dict[str, Any]) -> str:
    digest = value.get("sha256") or ""
    return f"{value.get('name', '')} (sha256 {digest})" if digest else str(value.get("name", ""))


def label(key: str) -> str:
    """A field name as words for a report: ``RUN_LABELS``, else the name with its unit suffix in
    brackets, a ``num_`` prefix dropped and underscores as spaces (``seq_len``: "seq len")."""
    if key in RUN_LABELS:
        return RUN_LABELS[key]
    words = key.removeprefix("num_")
    for suffix, unit in _UNITS:
        if words.endswith(suffix) and len(words) > len(suffix):
            return words.removesuffix(suffix).replace("_", " ") + unit
    return words.replace("_", " ")


def describe(run: dict[str, Any]) -> list[tuple[str, str]]:
    """The record as (label, text) rows for a report: ``RUN_KEYS`` first, in order, then any other
    keys (a sweep's spec, digest, profiles), each labelled in words (``label``), inputs as
    ``name (sha256 ...)``, units written out."""
    rows = []
    for key in [*(k for k in RUN_KEYS if k in run), *sorted(set(run) - set(RUN_KEYS))]:
        value = run[key]
        if isinstance(value, dict):
            text = _identity(value)
        elif isinstance(value, list):
            text = "; ".join(_identity(item) if isinstance(item, dict) else str(item) for item in value) or "none"
        elif key == "bandwidth_bytes_per_s":
            text = "unlimited (free communication)" if value is None else f"{value / 1e9:.4g} GB/s"
        elif key == "latency_s":
            text = f"{value * 1e6:.4g} us"
        else:
            text = "" if value is None else str(value)
        rows.append((label(key), text))
    return rows


#: What a built topology's name says of a model's pipeline hops that have a faster link of their own.
INNER_HOPS = "on an inner tier"


def _built(topology: Topology) -> str:
    """How a topology built from the command line is named in the ``run`` record."""
    if not topology.links:
        return f"uniform, {topology.num_devices} devices (from the command line)"
    hops = f"{len(topology.links)} hop{'s' if len(topology.links) > 1 else ''}"
    return f"{topology.num_devices} devices, {hops} {INNER_HOPS}, the rest on the outer (from the command line)"
