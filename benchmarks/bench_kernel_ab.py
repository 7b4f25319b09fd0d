"""The engines of this tree against a baseline tree, in one run: DES (and its ratio to a bare SimPy
loop), the analytic engine compiled and by default, and ``prepare``; writes its RESULTS.md section.

    python benchmarks/bench_kernel_ab.py --baseline TREE [--write]

TREE is a source tree of the commit to compare with (``git archive COMMIT | tar -x -C TREE``).
Each tree runs in its own worker process; every step is asked of both workers alternately
(A B, B A, ...), and the fastest of each side is kept, so drift of this shared machine's speed
hits both sides alike. Only public calls are timed; where the baseline's API differs (its
analytic engine took ``method="kernel"`` for the compiled pass) the worker adapts.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from alternating import alternate, serve
from bare_simpy import bare_simpy_loop

HERE = Path(__file__).resolve().parent
POINTS = (("1f1b", 32, 1, 256), ("2bw", 32, 1, 256), ("1f1b", 64, 1, 512), ("interleaved-1f1b", 8, 2, 64),
          ("zbv", 8, 2, 64))
REPEATS = 8
SAMPLE_S = 0.05  # a sample runs a step this long at least (many calls of a millisecond step)


def tasks() -> dict[str, Callable[[], Any]]:
    """Every (point, step) as a closure over inputs built once (run in a worker)."""
    from pipesim import Topology, uniform_profile
    from pipesim.engine.analytic import run_analytic
    from pipesim.engine.des import run_des
    from pipesim.simulation import make_plan, prepare

    compiled_analytic = ({"compiled": True} if "compiled" in inspect.signature(run_analytic).parameters
                         else {"method": "kernel"})
    # The baseline's DES compiled its lookahead whenever numba was installed.
    compiled_des = {"compiled": True} if "compiled" in inspect.signature(run_des).parameters else {}
    found: dict[str, Callable[[], Any]] = {}
    for schedule, ranks, per_rank, m in POINTS:
        p = ranks * per_rank
        profile = uniform_profile(num_layers=p, forward_s=1e-3, backward_s=2e-3, activation_bytes=1e6,
                                  param_bytes=4e6)
        topology = Topology.uniform(num_devices=ranks, bandwidth="25Gbit/s", latency="5us")
        plan = make_plan(profile, schedule=schedule, num_stages=p, num_microbatches=m, stages_per_rank=per_rank)
        program = prepare(profile, topology, plan)
        per_rank_ops = int(max(program.ops.rank_offsets[1:] - program.ops.rank_offsets[:-1]))

        def bare(num_ranks: int = ranks, num_ops: int = per_rank_ops) -> None:
            bare_simpy_loop(num_ranks, num_ops).run()

        key = f"{schedule} R={ranks} V={per_rank} m={m} ({program.ops.num_ops} ops)"
        found[f"{key}|bare simpy"] = bare
        found[f"{key}|des"] = lambda g=program: run_des(g)
        found[f"{key}|des compiled"] = lambda g=program: run_des(g, **compiled_des)
        found[f"{key}|analytic"] = lambda g=program: run_analytic(g)
        found[f"{key}|analytic compiled"] = lambda g=program: run_analytic(g, **compiled_analytic)
        found[f"{key}|prepare"] = lambda pr=profile, t=topology, pl=plan: prepare(pr, t, pl)
    for task in found.values():  # numba's start-up and compiling, outside the timings
        task()
    return found


def calls_per_sample(found: dict[str, Callable[[], Any]]) -> dict[str, int]:
    """Per task, how many calls make a sample of about ``SAMPLE_S`` (from one timed call):
    the fastest of a few single calls of a 2 ms step is mostly the machine's noise."""
    counts = {}
    for name, task in found.items():
        started = time.perf_counter()
        task()
        counts[name] = max(1, min(1000, round(SAMPLE_S / max(time.perf_counter() - started, 1e-6))))
    return counts


def worker() -> None:
    """Serve ``tasks`` to ``rows`` (see ``alternating.serve``), each sample many calls of a short step."""
    found = tasks()
    serve(found, calls=calls_per_sample(found))


def rows(baseline: Path, candidate: Path) -> list[dict[str, Any]]:
    """Fastest time of every step in each tree, asked alternately (this tree's task list)."""
    return alternate(__file__, baseline, candidate, lambda step: REPEATS, names_from=1)


def render(found: list[dict[str, Any]], baseline: str, header: str) -> str:
    """The RESULTS.md section: per step both times and their ratio; per point the DES over bare SimPy."""
    lines = ["## One timing kernel against the pre-change engines (`bench_kernel_ab.py`)", "", header, "",
             f"Baseline: {baseline}. Each step is the fastest of {REPEATS} samples per side, asked alternately, "
             f"a sample timing as many calls as last about {SAMPLE_S * 1e3:.0f} ms (per call below). "
             "`des` and `analytic` are the default calls (the kernels compiled or plain as each tree's "
             "policy chooses); `compiled` forces numba's kernels. `des / bare` is the DES time over a bare "
             "SimPy loop with one timeout per op (below 1: faster than SimPy's own loop).", "",
             "| point | step | baseline ms | this tree ms | this / baseline |", "|---|---|---|---|---|"]
    bare = {(row["point"], side): row[f"{side}_s"] for row in found if row["step"] == "bare simpy"
            for side in ("baseline", "candidate")}
    for row in found:
        lines.append(f"| {row['point']} | {row['step']} | {row['baseline_s'] * 1e3:.2f} | "
                     f"{row['candidate_s'] * 1e3:.2f} | {row['candidate_s'] / row['baseline_s']:.2f} |")
    lines += ["", "| point | des / bare, baseline | des / bare, this tree | compiled des / bare, baseline | "
              "compiled des / bare, this tree |", "|---|---|---|---|---|"]
    for point in dict.fromkeys(row["point"] for row in found):
        step = {row["step"]: row for row in found if row["point"] == point}
        cells = [f"{step[name][f'{side}_s'] / bare[(point, side)]:.2f}" for name in ("des", "des compiled")
                 for side in ("baseline", "candidate")]
        lines.append(f"| {point} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, help="source tree to compare with")
    parser.add_argument("--label", default="", help="what the baseline is (e.g. its commit)")
    parser.add_argument("--write", action="store_true", help="replace this section of benchmarks/RESULTS.md")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker()
        return
    if args.baseline is None:
        parser.error("--baseline TREE is required")
    sys.path.insert(0, str(HERE))
    import datetime as dt

    from results_file import machine, write_section

    found = rows(args.baseline.resolve(), HERE.parent)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    section = render(found, args.label or str(args.baseline), f"{stamp}; {machine()}; load average at start {load}")
    print(section)
    if args.write:
        write_section("kernel-ab", section)


if __name__ == "__main__":
    main()
