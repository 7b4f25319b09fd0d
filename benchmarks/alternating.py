"""A/B timing of two source trees in one run: a worker process per tree, every step asked of both
alternately (A B, B A, ...), so that drift of a shared machine's speed hits both sides alike."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def serve(tasks: dict[str, Callable[[], Any]], clock: Callable[[], float] = time.perf_counter,
          clocks: dict[str, Callable[[], float]] | None = None, calls: dict[str, int] | None = None) -> None:
    """The worker's side: print the task names as JSON, then run each name read from stdin once
    and print its seconds by ``clock`` (wall time; ``time.process_time`` leaves out the time a
    loaded machine kept the worker waiting for a core), or by ``clocks[step]`` for a task
    ``"point|step"`` whose step has a clock of its own.
    ``calls[name]`` (default 1): how many calls of the task one sample times; the seconds printed
    are per call."""
    print(json.dumps(list(tasks)), flush=True)
    for line in sys.stdin:
        name = line.strip()
        task = tasks[name]
        chosen = (clocks or {}).get(name.split("|")[-1], clock)
        count = (calls or {}).get(name, 1)
        started = chosen()
        for _ in range(count):
            task()
        print((chosen() - started) / count, flush=True)


def alternate(script: str, baseline: Path, candidate: Path, repeats: Callable[[str], int],
              names_from: int = 0, arguments: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Fastest time of every task in each tree: ``script --worker`` (then ``arguments``) run with
    each tree on PYTHONPATH; ``repeats(step)`` runs per side of a task ``"point|step"``; the task
    list is the one worker ``names_from`` (0: baseline, 1: candidate) reports. One row per task."""
    def start(tree: Path) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, script, "--worker", *arguments], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(tree)})

    def ask(process: subprocess.Popen[str], line: str) -> str:
        assert process.stdin is not None and process.stdout is not None
        if line:
            process.stdin.write(line + "\n")
            process.stdin.flush()
        return process.stdout.readline()

    workers = [start(baseline), start(candidate)]
    names: list[str] = [json.loads(ask(w, "")) for w in workers][names_from]
    rows = []
    for name in names:
        point, step = name.split("|")
        times: list[list[float]] = [[], []]
        for repeat in range(repeats(step)):
            for side in ((0, 1) if repeat % 2 == 0 else (1, 0)):
                times[side].append(float(ask(workers[side], name)))
        rows.append({"point": point, "step": step, "baseline_s": min(times[0]), "candidate_s": min(times[1])})
        print(json.dumps(rows[-1]), flush=True)
    for process in workers:
        assert process.stdin is not None
        process.stdin.close()
        process.wait()
    return rows
