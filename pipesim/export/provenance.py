"""The ``run`` record every output carries: which inputs, which settings, which pipesim, which command.

Two saved reports are told apart by reading them: the profile is named by its file name and the
SHA-256 of its bytes (a ``--uniform`` profile by its spec text), the topology likewise, and the
settings and command line are those the outputs came from.
"""

from __future__ import annotations

import hashlib
import math
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipesim.simulation import Result
    from pipesim.spec.topology import Topology

# The keys of the record, in the order the report shows them.
RUN_KEYS = ("command", "pipesim_version", "profile", "topology", "bandwidth_bytes_per_s", "latency_s", "schedule",
            "num_stages", "num_microbatches", "num_minibatches", "stages_per_rank", "engine")


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as typed, ``pipesim ARGS``, quoted so that a shell reruns it."""
    return shlex.join(["pipesim", *(sys.argv[1:] if argv is None else argv)])


def file_identity(path: str | Path) -> dict[str, str]:
    """``{"name": file name, "sha256": hex digest of its bytes}``."""
    target = Path(path)
    return {"name": target.name, "sha256": hashlib.sha256(target.read_bytes()).hexdigest()}


def text_identity(name: str, text: str) -> dict[str, str]:
    """The identity of an input given as text on the command line (``--uniform``)."""
    return {"name": name, "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def run_record(result: Result, *, profile: dict[str, str], topology: Topology,
               topology_file: dict[str, str] | None = None, command: str | None = None) -> dict[str, Any]:
    """The ``run`` object of ``simulate``'s outputs (metrics.json, ``--json``, traces, report).

    ``bandwidth_bytes_per_s`` and ``latency_s`` are the topology's default link (null when
    communication is free); ``topology`` names its file, or says it was built from the flags.
    """
    from pipesim import __version__

    m = result.metrics
    return {
        "command": command_line() if command is None else command,
        "pipesim_version": __version__,
        "profile": profile,
        "topology": topology_file or {"name": f"uniform, {topology.num_devices} devices (from the command line)",
                                      "sha256": ""},
        "bandwidth_bytes_per_s": _finite(topology.bandwidth_bytes_per_s),
        "latency_s": topology.latency_s,
        "schedule": m.schedule,
        "num_stages": m.num_stages,
        "num_microbatches": m.num_microbatches,
        "num_minibatches": m.num_minibatches,
        "stages_per_rank": result.plan.stages_per_rank,
        "engine": m.engine,
    }


def describe(run: dict[str, Any]) -> list[tuple[str, str]]:
    """The record as (label, text) rows for a report, in ``RUN_KEYS`` order, units written out."""
    rows = []
    for key in RUN_KEYS:
        if key not in run:
            continue
        value = run[key]
        if isinstance(value, dict):
            digest = value.get("sha256") or ""
            text = f"{value.get('name', '')} (sha256 {digest})" if digest else str(value.get("name", ""))
        elif key == "bandwidth_bytes_per_s":
            text = "unlimited (free communication)" if value is None else f"{value / 1e9:.4g} GB/s"
        elif key == "latency_s":
            text = f"{value * 1e6:.4g} us"
        else:
            text = str(value)
        rows.append((key, text))
    return rows
