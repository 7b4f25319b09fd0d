"""gpipe and 1f1b give exactly the per-rank F/B order that PyTorch 2.13 executes.

Real runs, not torch's drawings of its schedules: ``Schedule1F1B._get_pipeline_order()`` is off
by one on its last rank (it starts at F1), so it is not what runs. Processes in a gloo group
(tests/support/torch_order_worker.py) that run ScheduleGPipe and Schedule1F1B on a small
linear stage and log each forward and each output gradient. Both schedules handle microbatches
in order, so the k-th F (or B) logged on a rank is microbatch k. One group of 4 processes runs
p = 2, 3, 4 on subgroups, so torch is imported once per process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from pipesim.schedule.ir import OpKind  # noqa: E402
from pipesim.schedule.registry import build_schedule  # noqa: E402

WORKER = Path(__file__).resolve().parents[1] / "support" / "torch_order_worker.py"
CASES = {2: (2, 4), 3: (3, 6), 4: (4, 8)}  # p -> the m run (torch's 1F1B needs m >= p)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def executed_orders() -> list[dict[str, dict[str, dict[str, list[str]]]]]:
    """Per global rank, {p: {schedule: {m: log}}}, from one group of max(p) processes."""
    world = max(CASES)
    pipelines = [f"{p}:{','.join(map(str, ms))}" for p, ms in sorted(CASES.items())]
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    processes = [
        subprocess.Popen([sys.executable, str(WORKER), str(rank), str(world), str(port), *pipelines],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for rank in range(world)
    ]
    results = []
    for process in processes:
        out, err = process.communicate(timeout=180)
        assert process.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def labelled(log: list[str]) -> list[str]:
    """["F", "F", "B", ...] -> ["F0", "F1", "B0", ...]: the k-th of a kind is microbatch k."""
    seen = {"F": 0, "B": 0}
    out = []
    for kind in log:
        out.append(f"{kind}{seen[kind]}")
        seen[kind] += 1
    return out


def test_gpipe_and_1f1b_match_what_torch_executes() -> None:
    results = executed_orders()
    compared = 0
    for p, microbatches in CASES.items():
        for name in ("gpipe", "1f1b"):
            for m in microbatches:
                ours = build_schedule(name, p, m)
                for rank in range(p):
                    expected = [f"{op.kind.value}{op.microbatch}" for op in ours.ranks[rank] if op.kind is not OpKind.U]
                    assert labelled(results[rank][str(p)][name][str(m)]) == expected, (name, p, m, rank)
                    compared += 1
    assert compared == 2 * sum(p * len(ms) for p, ms in CASES.items())
