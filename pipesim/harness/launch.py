"""Spawning the ranks on this machine and watching them: any failure, hang or death ends the whole run.

The launcher starts one worker process per rank (as torchrun would: RANK, WORLD_SIZE,
MASTER_ADDR=127.0.0.1 and a free MASTER_PORT; gloo and NCCL on the loopback interface), then
polls. A rank that exits non-zero, is killed, or makes no progress for ``op_timeout_s`` ends the
run: the others are stopped (SIGTERM, then SIGKILL), the records every rank left are merged into
a partial trace, and RunFailedError names the rank and the op. Workers die with the launcher (PR_SET_PDEATHSIG), so nothing is orphaned.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from pipesim.engine.run_info import RunFailure
from pipesim.errors import ConfigError
from pipesim.harness import RunFailedError
from pipesim.harness.config import RunConfig
from pipesim.harness.recorder import (
    COMPUTING,
    PHASE,
    PHASE_NAMES,
    POSITION,
    SINCE,
    STARTING,
    WAITING,
    header_of,
    merge,
    read_rank,
    trace_meta,
)
from pipesim.harness.lifetime import die_with_parent
from pipesim.harness.loopback import one_host_environment
from pipesim.harness.zygote import shared_zygote
from pipesim.schedule.ir import Schedule
from pipesim.simulation import check_num_ops, count_ops
from pipesim.spec.files import write_text_atomic

POLL_S = 0.05


@dataclass(frozen=True)
class Failure:
    """Who failed, where, and how."""

    rank: int
    op: str
    reason: str


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def check_port(port: int) -> None:
    """Refuse a rendezvous port that is out of range or already bound on 127.0.0.1.

    Raises:
        ConfigError: it is.
    """
    if not 1 <= port <= 65535:
        raise ConfigError("master_port", port, "must be in 1..65535")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's store does: TIME_WAIT is free
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise ConfigError("master_port", port, f"cannot be bound on 127.0.0.1 ({exc.strerror}): pick another "
                              "port, or leave the option out to let the OS choose a free one") from None


def check_backend(backend: str, device: str, ranks: int = 1) -> None:
    """Refuse, before any rank starts, a backend or device this torch cannot use here.

    gloo on CPU is always there, and is checked without importing torch in this process. On CUDA
    each of the ``ranks`` processes takes a GPU of its own (see ``check_gpus``).

    Raises:
        ConfigError: CUDA is asked for but torch sees no GPU, or fewer GPUs than ranks, or NCCL
            is not built into torch.
    """
    if backend == "gloo" and device == "cpu":
        return
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        field, value = ("backend", backend) if backend != "gloo" else ("device", device)
        fix = "--backend gloo --device cpu" if field == "backend" else "--device cpu"
        raise ConfigError(field, value, f"needs CUDA, and torch {torch.__version__} sees no GPU here: use {fix}")
    if backend == "nccl" and not dist.is_nccl_available():
        raise ConfigError("backend", backend, f"is not built into torch {torch.__version__}: use --backend gloo")
    check_gpus("ranks", ranks)


def check_op_timeout(op_timeout_s: float) -> None:
    """Refuse a per-op timeout that is not a number of seconds > 0 (0 declares every op hung, NaN none).

    Raises:
        ConfigError: naming ``op_timeout``.
    """
    if not op_timeout_s > 0:
        raise ConfigError("op_timeout", op_timeout_s, "must be > 0 seconds")


def check_gpus(field: str, processes: int, hint: str = "") -> None:
    """Refuse ``processes`` CUDA processes where torch sees fewer GPUs: NCCL refuses two ranks on
    one GPU, and processes sharing a GPU would time each other's kernels.

    Raises:
        ConfigError: naming ``field``, when there are fewer GPUs than processes (``hint`` ends it).
    """
    import torch

    gpus = torch.cuda.device_count()
    if processes > gpus:
        raise ConfigError(field, processes, f"each CUDA process takes a GPU of its own, and torch sees {gpus} GPU"
                          f"{'s' if gpus != 1 else ''} here{hint}")


class RankProcess(Protocol):
    """What the launcher needs of a rank's process (subprocess.Popen has it, so does ForkedRank)."""

    pid: int

    def poll(self) -> int | None: ...  # noqa: D102

    def terminate(self) -> None: ...  # noqa: D102

    def kill(self) -> None: ...  # noqa: D102

    def wait(self, timeout: float | None = None) -> int: ...  # noqa: D102


def spawn(module: str, args: list[str], world_size: int, folder: Path, threads: int,
          master_port: int | None = None) -> list[RankProcess]:
    """Start ``module.main(args)`` once per rank with torchrun's environment; logs go to ``folder``.

    Rank 0 serves the rendezvous on 127.0.0.1:``master_port`` (default: a port the OS reports free),
    and every rank's gloo and NCCL sockets listen on the loopback interface (``loopback``). Ranks
    are forked from the shared fork server (torch already imported) on Linux; set
    PIPESIM_SPAWN=subprocess to start each as a fresh ``python -m module`` instead.
    """
    port = free_port() if master_port is None else master_port
    base_env = {**one_host_environment(), "MASTER_PORT": str(port), "WORLD_SIZE": str(world_size),
                "LOCAL_WORLD_SIZE": str(world_size), "OMP_NUM_THREADS": str(threads), "PIPESIM_RUN_DIR": str(folder)}
    envs = [dict(base_env, RANK=str(rank), LOCAL_RANK=str(rank)) for rank in range(world_size)]
    logs = [str(folder / f"rank{rank}.log") for rank in range(world_size)]
    if sys.platform == "linux" and os.environ.get("PIPESIM_SPAWN", "fork") != "subprocess":
        return list(shared_zygote().start(module, args, envs, logs))
    processes: list[RankProcess] = []
    try:
        for env, log_path in zip(envs, logs, strict=True):
            with open(log_path, "wb") as log:
                processes.append(subprocess.Popen(
                    [sys.executable, "-m", module, *args], env=dict(os.environ, **env), stdout=log,
                    stderr=subprocess.STDOUT, preexec_fn=die_with_parent))
    except BaseException:
        stop(processes)
        raise
    return processes


def wait_all(processes: list[RankProcess], folder: Path, what: str, timeout_s: float) -> None:
    """Wait for helper ranks (no progress records) to finish; stop them all if one fails or time runs out.

    Raises:
        RunFailedError: a rank exited non-zero or the time ran out; names the rank and its last log line.
    """
    deadline = time.perf_counter() + timeout_s
    try:
        while time.perf_counter() < deadline:
            codes = [process.poll() for process in processes]
            if all(code == 0 for code in codes) or any(code not in (None, 0) for code in codes):
                break
            time.sleep(POLL_S)
    finally:
        stop(processes)
    codes = [process.poll() for process in processes]
    bad = [rank for rank, code in enumerate(codes) if code != 0]
    if bad:
        log_path = folder / f"rank{bad[0]}.log"
        log = log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines() if log_path.exists() else []
        reason = log[-1] if log else f"exited with status {codes[bad[0]]}" if codes[bad[0]] is not None else "timed out"
        raise RunFailedError(bad[0], "", f"{what} failed: {reason}")


# In a run folder, the files pipesim wrote there (one name a line), so that a later run replaces
# those and no other: a folder without it that holds anything is someone else's.
RUN_DIR_MARK = ".pipesim-run"
RUN_FILE = re.compile(r"config\.json|rank[0-9]+\.(log|npy)|error[0-9]+\.json")


def run_files(world_size: int) -> list[str]:
    """The files a run of ``world_size`` ranks writes in its run folder."""
    return ["config.json", *(f"{kind}{rank}.{suffix}" for rank in range(world_size)
                             for kind, suffix in (("rank", "log"), ("rank", "npy"), ("error", "json")))]


def take_run_dir(folder: Path, world_size: int) -> None:
    """Make ``folder`` this run's: new, empty, or a run folder of pipesim's (``RUN_DIR_MARK``), whose
    earlier files go, and only those; record the files this run writes there before any.

    Raises:
        ConfigError: the folder holds a file pipesim did not write that is in the way: anything,
            in a folder without the mark; a file of this run's names, in one with it.
    """
    mark = folder / RUN_DIR_MARK
    if folder.is_dir() and any(folder.iterdir()):
        if not mark.is_file():
            first = sorted(path.name for path in folder.iterdir())[0]
            raise ConfigError("run_dir", str(folder), f"holds files pipesim did not write (such as {first}): give a "
                              "new or empty folder")
        for name in mark.read_text(encoding="utf-8", errors="replace").split():
            if RUN_FILE.fullmatch(name) and (folder / name).is_file():  # a name of ours, never a path
                (folder / name).unlink()
        mine = [name for name in run_files(world_size) if (folder / name).exists()]
        if mine:
            raise ConfigError("run_dir", str(folder), f"holds {mine[0]}, which no earlier run of pipesim wrote there: "
                              "give a new or empty folder")
    folder.mkdir(parents=True, exist_ok=True)
    mark_run_files(folder, run_files(world_size))


def mark_run_files(folder: Path, names: list[str], *, written_only: bool = False) -> None:
    """Record ``names`` as pipesim's files in ``folder``: before a run, every file it may write (so a
    run that dies still leaves them known), after it only those it wrote (an error file it did not
    write may be someone else's later)."""
    kept = [name for name in names if (folder / name).exists()] if written_only else names
    write_text_atomic(folder / RUN_DIR_MARK, "".join(f"{name}\n" for name in kept))


def launch(config: RunConfig, *, run_dir: Path | None = None, op_timeout_s: float = 120.0,
           startup_timeout_s: float = 180.0, keep_run_dir: bool = False, master_port: int | None = None) -> float:
    """Run ``config`` on ``config.num_stages`` local processes; return the wall time in seconds.

    ``master_port`` is the rendezvous port on 127.0.0.1 (default: one the OS reports free).
    ``run_dir`` keeps the ranks' logs and records (``take_run_dir``); by default they go in a
    temporary folder, removed after the run.

    Raises:
        ConfigError: the backend or device is not available here, an op timeout that is not > 0,
            more ops than a simulation takes (``check_num_ops``), or a ``run_dir`` holding files
            pipesim did not write, checked before any rank starts.
        RunFailedError: a rank raised, died, or hung (a rendezvous port already taken included);
            the partial trace is written to ``config.trace_out`` when that is set.
    """
    check_op_timeout(op_timeout_s)
    check_num_ops(count_ops(config.schedule, config.num_stages, config.num_microbatches, config.num_minibatches,
                            pipemare_update=config.pipemare_update))
    schedule = config.build_schedule()
    check_backend(config.backend, config.device, schedule.num_ranks)
    made_dir = run_dir is None
    folder = Path(tempfile.mkdtemp(prefix="pipesim-run-")) if run_dir is None else run_dir
    world_size = schedule.num_ranks
    take_run_dir(folder, world_size)
    config_path = folder / "config.json"
    write_text_atomic(config_path, config.to_json())
    processes: list[RankProcess] = []
    started = time.perf_counter()
    failure: Failure | None = None
    try:
        port = free_port() if master_port is None else master_port
        processes += spawn("pipesim.harness.rank.worker", [str(config_path)], world_size, folder, config.threads, port)
        failure = _watch(processes, folder, schedule, op_timeout_s, startup_timeout_s)
        if failure is not None and "EADDRINUSE" in failure.reason:  # torch's store could not listen
            failure = Failure(failure.rank, failure.op, f"the rendezvous port {port} on 127.0.0.1 is already in use "
                              "(EADDRINUSE when the rank listened on it)")
    finally:
        stop(processes)
        mark_run_files(folder, run_files(world_size), written_only=True)
    wall = time.perf_counter() - started
    if failure is not None:
        trace_path = _write_partial(config, schedule, folder, failure)
        if made_dir and not keep_run_dir:
            shutil.rmtree(folder, ignore_errors=True)
        raise RunFailedError(failure.rank, failure.op, failure.reason, trace_path)
    if made_dir and not keep_run_dir:
        shutil.rmtree(folder, ignore_errors=True)
    return wall


def _watch(processes: list[RankProcess], folder: Path, schedule: Schedule, op_timeout_s: float,
           startup_timeout_s: float) -> Failure | None:
    started = time.perf_counter()
    while True:
        codes = [process.poll() for process in processes]
        if all(code == 0 for code in codes):
            return None
        exited = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]
        if exited:
            time.sleep(0.2)  # let the peers of a dead rank write their own errors before blaming
            return _blame_exit([(rank, processes[rank].poll() or code) for rank, code in exited], folder, schedule)
        now = time.perf_counter()
        headers = [header_of(folder / f"rank{rank}.npy") for rank in range(len(processes))]
        if any(h is None or int(h[PHASE]) == STARTING for h in headers):
            if now - started > startup_timeout_s:
                late = [rank for rank, h in enumerate(headers) if h is None or int(h[PHASE]) == STARTING]
                return Failure(late[0], "", f"did not start within {startup_timeout_s:g} s (ranks {late})")
        else:
            stuck = [rank for rank, h in enumerate(headers) if h is not None
                     and int(h[PHASE]) in (WAITING, COMPUTING) and now - float(h[SINCE]) > op_timeout_s]
            if stuck:
                return _blame_hang(headers, schedule, now)
        time.sleep(POLL_S)


def _op_at(schedule: Schedule, rank: int, header: object) -> str:
    if header is None:
        return ""
    position = int(header[POSITION])  # type: ignore[index]
    ops = schedule.ranks[rank]
    return str(ops[position]) if 0 <= position < len(ops) else ""


def _blame_exit(exited: list[tuple[int, int]], folder: Path, schedule: Schedule) -> Failure:
    """The culprit among exited ranks: one killed by a signal, else the earliest error."""
    killed = [(rank, code) for rank, code in exited if code < 0]
    if killed:
        rank, code = killed[0]
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        return Failure(rank, _op_at(schedule, rank, header_of(folder / f"rank{rank}.npy")), f"killed by {name}")
    reports = []
    for rank, code in exited:
        path = folder / f"error{rank}.json"
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
            reports.append((path.stat().st_mtime_ns, rank, str(report.get("op", "")), str(report["message"])))
        except (OSError, ValueError, KeyError):
            op = _op_at(schedule, rank, header_of(folder / f"rank{rank}.npy"))
            reports.append((sys.maxsize, rank, op, f"exited with status {code}"))
    _, rank, op, message = min(reports)
    return Failure(rank, op, message)


def _blame_hang(headers: Sequence[object], schedule: Schedule, now: float) -> Failure:
    """The rank stuck computing the longest, else the rank waiting the longest (a stuck transfer)."""
    states = []
    for rank, header in enumerate(headers):
        assert header is not None
        phase = int(header[PHASE])  # type: ignore[index]
        if phase in (WAITING, COMPUTING):
            states.append((phase != COMPUTING, float(header[SINCE]), rank, phase))  # type: ignore[index]
    _, since, rank, phase = min(states)
    others = ", ".join(f"rank {r} {PHASE_NAMES[p]} at {_op_at(schedule, r, headers[r])}"
                       for _, _, r, p in sorted(states, key=lambda s: s[2]) if r != rank)
    detail = f"; {others}" if others else ""
    return Failure(rank, _op_at(schedule, rank, headers[rank]),
                   f"no progress for {now - since:.1f} s ({PHASE_NAMES[phase]}){detail}")


def stop(processes: list[RankProcess]) -> None:
    """SIGTERM every live worker, then SIGKILL what is left after 2 s; reap them all."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.perf_counter() + 2.0
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _write_partial(config: RunConfig, schedule: Schedule, folder: Path, failure: Failure) -> str | None:
    if not config.trace_out:
        return None
    ranks = [read_rank(folder / f"rank{rank}.npy") for rank in range(schedule.num_ranks)]
    info = replace(trace_meta(config, schedule, [0.0] * schedule.num_stages, [0.0] * schedule.num_stages),
                   partial=True, failure=RunFailure(rank=failure.rank, op=failure.op, reason=failure.reason))
    write_text_atomic(config.trace_out, merge(schedule, ranks, info).to_json())
    return config.trace_out
