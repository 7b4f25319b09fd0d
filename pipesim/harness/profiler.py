"""Profiling a model layer by layer, through the same stage code the runtime runs, into a Profile.

This side only orchestrates (no torch here): the timing happens in processes forked like the
run's ranks (pipesim.harness.rank.profile_rank), as many at once as the run will have.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipesim.errors import ConfigError
from pipesim.harness.config import SOURCE_PREFIX, STATISTICS, ModelSpec, check_processes
from pipesim.harness.overheads import OpCosts, net_of, runtime_costs
from pipesim.spec.profile import Profile
from pipesim.spec.validation import build


@dataclass(frozen=True)
class Timing:
    """How layers are timed: repeats, the statistic, and how many processes time them at once.

    Attributes:
        warmup, repeats: untimed and timed repeats of every layer's F, B and U.
        statistic: ``"mean"`` (keeps time the OS gave to other processes mid-op, which a real
            run pays too) or ``"median"``.
        processes: processes timing at once (as many as the run's ranks).
        threads: torch threads per process; device: ``"cpu"`` or ``"cuda"``.
        clock: on CPU, ``"wall"`` (perf_counter) or ``"cpu"`` (the thread's CPU time: what an op
            costs without time lost to other processes; a diagnostic, runs are wall-clock).
    """

    warmup: int = 5
    repeats: int = 20
    statistic: str = "mean"
    processes: int = 2
    threads: int = 1
    device: str = "cpu"
    clock: str = "wall"

    def __post_init__(self) -> None:
        if self.warmup < 0:
            raise ConfigError("warmup", self.warmup, "must be >= 0")
        if self.repeats < 1:
            raise ConfigError("repeats", self.repeats, "must be >= 1")
        if self.threads < 1:
            raise ConfigError("threads", self.threads, "must be >= 1")
        if self.statistic not in STATISTICS:
            raise ConfigError("statistic", self.statistic, f"must be one of {', '.join(STATISTICS)}")
        check_processes("processes", self.processes)
        if self.device not in ("cpu", "cuda"):
            raise ConfigError("device", self.device, "must be cpu or cuda")
        if self.clock not in ("wall", "cpu"):
            raise ConfigError("clock", self.clock, "must be wall or cpu")


@dataclass(frozen=True)
class Measurement:
    """A profile and how much of the machine its timings had.

    Attributes:
        profile: the Profile.
        cpu_share: the smallest share of their wall time the timing processes had a CPU for
            while they timed the layers (1 on an idle machine).
    """

    profile: Profile
    cpu_share: float


def _measure(spec: ModelSpec, microbatch_size: int, timing: Timing, calibrate: bool) -> list[dict[str, Any]]:
    """Run profile_rank in ``timing.processes`` processes at once; their results."""
    from pipesim.harness.launch import spawn, wait_all

    request = json.dumps({"spec": spec.to_dict(), "microbatch_size": microbatch_size, "warmup": timing.warmup,
                          "repeats": timing.repeats, "statistic": timing.statistic, "device": timing.device,
                          "threads": timing.threads, "calibrate": calibrate, "clock": timing.clock})
    with tempfile.TemporaryDirectory(prefix="pipesim-profile-") as name:
        folder = Path(name)
        processes = spawn("pipesim.harness.rank.profile_rank", [request], timing.processes, folder, timing.threads)
        wait_all(processes, folder, "profiling", timeout_s=3600)
        return [json.loads((folder / f"times{rank}.json").read_text(encoding="utf-8"))
                for rank in range(timing.processes)]


def _mean_rows(parts: list[dict[str, Any]], key: str) -> list[list[float]]:
    """Per layer, the mean over the processes of each measured column."""
    rows = parts[0][key]
    return [[statistics.fmean(part[key][index][column] for part in parts) for column in range(len(rows[index]))]
            for index in range(len(rows))]


def profile_model(spec: ModelSpec, microbatch_size: int, *, timing: Timing | None = None,
                  calibrate: bool = True) -> Profile:
    """``measure_profile(...).profile``: the Profile alone."""
    return measure_profile(spec, microbatch_size, timing=timing, calibrate=calibrate).profile


def measure_profile(spec: ModelSpec, microbatch_size: int, *, timing: Timing | None = None,
                    calibrate: bool = True) -> Measurement:
    """Measure every layer of ``spec``'s model (the loss layer included) and return a Profile.

    Each layer runs as a one-layer stage, with the runtime's code, torch threads and allocator
    settings, a training step's order (every F, every B in reverse, every U); its times are the
    ``timing.statistic`` over repeats after warm-up, averaged over ``timing.processes``
    processes timing at once, less the stage executor's fixed cost per op (see
    pipesim.harness.overheads). Sizes are exact. With ``calibrate``, a two-rank run of null
    layers measures the runtime's cost per op, kept as the profile's per-op overheads. The
    model's spec is kept in the profile's ``source`` so that ``pipesim run`` can rebuild it.

    Raises:
        ConfigError: bad counts, an unknown device, or a model that cannot be built.
        RunFailedError: a profiling process or the calibration run failed.
    """
    timing = timing or Timing()
    if timing.device == "cuda":
        from pipesim.harness.launch import check_backend, check_gpus

        check_backend("gloo", "cuda")  # names the device: the profile's processes share no backend
        check_gpus("processes", timing.processes, ": use --processes 1")
        if calibrate:  # a two-rank run on NCCL
            check_gpus("calibrate", 2, " (its run has two ranks): use --no-calibrate")
            check_backend("nccl", "cuda", 2)
    parts = _measure(spec, microbatch_size, timing, calibrate)
    first = parts[0]
    fixed = [statistics.fmean(part["executor"][k] for part in parts) for k in range(5)]
    executor = OpCosts(*fixed[:3])
    measured = _mean_rows(parts, "layers")
    layers = []
    for index, name in enumerate(first["names"]):
        times = net_of(measured[index], executor)
        layers.append({
            "name": name,
            "forward_s": times.forward_s,
            "backward_s": times.backward_s,
            "update_s": times.update_s,
            # A split backward's I and W, timed apart, less the executor's fixed cost of each.
            "backward_input_s": max(0.0, measured[index][6] - fixed[3]),
            "backward_weight_s": max(0.0, measured[index][7] - fixed[4]),
            "forward_std_s": measured[index][3],
            "backward_std_s": measured[index][4],
            "activation_bytes": first["activation_bytes"][index],
            "stash_bytes": first["stash_bytes"][index],
            # The harness's I keeps the whole autograd graph for its W: W frees all of the stash.
            "weight_stash_bytes": first["stash_bytes"][index],
            "param_bytes": first["param_bytes"][index],
        })
    share = min(row[5] for part in parts for row in part["layers"])
    overheads: dict[str, float] = {}
    if calibrate:
        null_net = [net_of(row, executor) for row in _mean_rows(parts, "null_layers")]
        costs, _ = runtime_costs(int(first["null_elements"]), microbatch_size, null_net, timing.statistic,
                                 threads=timing.threads, device=timing.device)
        overheads = {"forward_overhead_s": costs.forward_s, "backward_overhead_s": costs.backward_s,
                     "update_overhead_s": costs.update_s}
    threads = timing.threads
    profile = build(Profile, {
        **overheads,
        "name": spec.name,
        "layers": layers,
        "microbatch_size": microbatch_size,
        "dtype": first["dtype"],
        "device": f"{timing.device} ({threads} torch thread{'s' if threads > 1 else ''}, {timing.statistic} of "
                  f"{timing.repeats} in {timing.processes} process{'es' if timing.processes > 1 else ''})",
        "source": SOURCE_PREFIX + json.dumps(spec.to_dict(), sort_keys=True),
    })
    return Measurement(profile=profile, cpu_share=share)
