"""How much slower one core's work runs when N processes run it at once on this host, without Dask.

The sweep's 14-worker runs spend more busy time per point than its 2-worker runs (issue 35). This
tells whether the host itself does that: N processes (spawned, numba's cache filled first) each
run the same fixed work at the same moment, for N in ``--counts``; the slowdown at N is the
median process's time over the time of one process alone. Two kinds of work, each timed apart:

- python: a pure-Python integer loop (the interpreter, no memory traffic to speak of);
- points: the sweep's own per-point work (``PointRunner.run_batch`` on every ``--every``-th point of
  ``benchmarks/sweep_10k.yaml``), as a Dask worker runs it.

If ``points`` at 14 is as slow as the sweep's busy time says and ``python`` is too, the host's
cores (shared hyperthreads, clocks) are the limit, not the sweep.

    python benchmarks/host_contention.py [--counts 1,2,8,14,16] [--every 25] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _points(every: int) -> tuple[Any, list[dict[str, Any]]]:
    from pipesim.sweep import Resolved, load_spec

    resolved = Resolved(load_spec(ROOT / "benchmarks" / "sweep_10k.yaml"))
    return resolved, resolved.points()[::every]


def _python_work() -> float:
    total = 0
    for value in range(20_000_000):
        total = (total + value * value) % 1_000_003
    return float(total)


def _worker(kind: str, every: int, barrier: Any, results: Any) -> None:
    if kind == "points":
        from pipesim.sweep import PointRunner

        resolved, points = _points(every)
        runner = PointRunner(resolved, "always")
        runner.run_batch(points[:5])  # kernels loaded from the cache before the clock starts
        work = lambda: runner.run_batch(points)  # noqa: E731
    else:
        work = _python_work
    barrier.wait()
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    results.put((time.perf_counter() - wall, time.process_time() - cpu))


def run(kind: str, count: int, every: int) -> dict[str, float]:
    """``count`` processes doing ``kind``'s work at once: median wall and CPU seconds per process."""
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(count), context.Queue()
    processes = [context.Process(target=_worker, args=(kind, every, barrier, results)) for _ in range(count)]
    for process in processes:
        process.start()
    times = [results.get(timeout=300) for _ in processes]
    for process in processes:
        process.join()
    return {"wall_s": statistics.median(t[0] for t in times), "cpu_s": statistics.median(t[1] for t in times),
            "slowest_s": max(t[0] for t in times)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,2,8,14,16")
    parser.add_argument("--every", type=int, default=25, help="every N-th point of the sweep's spec per process")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    counts = [int(word) for word in args.counts.split(",")]
    from pipesim.sweep import PointRunner

    resolved, points = _points(args.every)
    started = time.perf_counter()
    PointRunner(resolved, "always").run_batch(points)  # numba's cache filled before any process starts
    print(f"host: nproc {os.cpu_count()}, {platform.processor() or platform.machine()}; load "
          f"{os.getloadavg()[0]:.2f}; {len(points)} points a process; cache filled in "
          f"{time.perf_counter() - started:.1f} s", flush=True)
    rows = []
    for kind in ("python", "points"):
        alone = None
        for count in counts:
            row = {"kind": kind, "processes": count, **run(kind, count, args.every)}
            alone = alone or row["wall_s"]
            row["slowdown"] = row["wall_s"] / alone
            rows.append(row)
            print(f"{kind:6s} {count:3d} processes: median {row['wall_s']:.2f} s (slowest {row['slowest_s']:.2f}, "
                  f"CPU {row['cpu_s']:.2f}), {row['slowdown']:.3f}x one alone", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"nproc": os.cpu_count(), "rows": rows}, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
