"""The 10,080-point sweep of this tree against a baseline tree, in one run (``bench_sweep.py --baseline``).

Each tree runs in its own worker process (``alternating.py``); every step is asked of both
alternately (A B, B A, ...) and the fastest of each side is kept, so drift of this shared
machine's speed hits both sides alike. Two steps:

- ``serial``: a systematic sample of the sweep's groups of points that share their work (every
  k-th group by ``SHARED_WORK``, as ``bench_sweep.sample_groups`` takes them) simulated in the
  worker, one after another, as a sweep's Dask worker runs a batch; timed in CPU seconds of the
  worker (``time.process_time``), which a loaded machine disturbs least.
- ``run_sweep``: all points through ``run_sweep`` with 2 workers, wall seconds end to end; each
  run's table is kept, and all of them, from both trees, must be equal (pandas ``equals``).

Both sides run with the malloc thresholds the embedded cluster gives its workers
(``pipesim.allocator.ENVIRONMENT``), so the serial step measures what a worker does.
Only public calls are used; where the baseline's API differs (``PointRunner`` without a kernel
setting) the worker adapts.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from alternating import alternate, serve

SPEC = Path(__file__).resolve().parent / "sweep_10k.yaml"
REPEATS = {"serial": 3, "run_sweep": 2}
MALLOC = {"MALLOC_TRIM_THRESHOLD_": str(256 << 20), "MALLOC_MMAP_THRESHOLD_": str(256 << 20)}


def sample(points: list[dict[str, Any]], every: int) -> list[dict[str, Any]]:
    """Every ``every``-th group of points equal in ``SHARED_WORK``, in the sweep's order."""
    from pipesim.sweep.points import SHARED_WORK, shared_work_order

    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for point in shared_work_order(points):
        groups.setdefault(tuple(point[axis] for axis in SHARED_WORK), []).append(point)
    return [point for key in list(groups)[every // 2::every] for point in groups[key]]


def tasks(every: int, keep: str = "") -> dict[str, Callable[[], Any]]:
    """The two steps as closures over inputs built once (run in a worker); ``keep``: a folder that
    each run_sweep step copies its table into."""
    from pipesim.sweep import PointRunner, Resolved, load_spec, run_sweep

    spec = load_spec(SPEC)
    resolved = Resolved(spec)
    points = resolved.points()
    chosen = sample(points, every)
    try:
        from pipesim.sweep.points import sweep_kernels
    except ImportError:  # a tree whose kernel policy is process-wide
        def runner() -> Any:
            return PointRunner(resolved)
    else:
        setting = sweep_kernels(points, 2)  # the kernels the sweep itself runs

        def runner() -> Any:
            return PointRunner(resolved, setting)  # type: ignore[call-arg]

    runner().run_batch(chosen[:8] + chosen[-4:])  # numba's start-up and kernel loads, outside the timings

    def full() -> None:
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder) / "rows.parquet"
            run_sweep(spec, out, workers=2)
            if keep:  # the table, for the parent to compare across trees and runs
                shutil.copy(out, Path(keep) / f"table-{os.getpid()}-{time.time_ns()}.parquet")

    label = f"{len(chosen)} of {len(points)} points"
    return {f"{label}|serial": lambda: runner().run_batch(chosen), f"{label}|run_sweep": full}


def worker(every: int, keep: str) -> None:
    """Serve ``tasks`` (see ``alternating.serve``): the serial step in CPU seconds."""
    serve(tasks(every, keep), clocks={"serial": time.process_time})


def rows(baseline: Path, candidate: Path, every: int, keep: str = "") -> list[dict[str, Any]]:
    """Fastest time of each step in each tree, asked alternately; the tables of the run_sweep steps
    are copied into ``keep`` when given (``same_tables``)."""
    os.environ.update(MALLOC)
    return alternate(str(Path(__file__).resolve()), baseline, candidate, lambda step: REPEATS[step], names_from=1,
                     arguments=["--every", str(every), "--keep", keep])


def same_tables(keep: str) -> tuple[int, bool]:
    """How many tables ``keep`` holds, and whether they are all equal (pandas ``equals``)."""
    import pandas as pd

    tables = [pd.read_parquet(path) for path in sorted(Path(keep).glob("table-*.parquet"))]
    return len(tables), all(table.equals(tables[0]) for table in tables)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--keep", default="")
    parser.add_argument("--baseline", type=Path, help="alone: this tree against BASELINE, printed (bench_sweep.py "
                        "--baseline runs it with the rest of the sweep benchmark)")
    args = parser.parse_args()
    if args.worker:
        worker(args.every, args.keep)
    elif args.baseline:
        with tempfile.TemporaryDirectory() as folder:
            rows(args.baseline, Path(__file__).resolve().parents[1], args.every, folder)
            count, same = same_tables(folder)
        print(f"{count} run_sweep tables, both trees: {'all equal' if same else 'NOT all equal'} (pandas equals)")
