"""Issue 8's engine work: speed on several stages per rank and shared NICs, and an A/B against a baseline tree.

``make bench-schedules`` writes the ``schedules`` section of RESULTS.md. With
``--baseline TREE`` (a source tree, e.g. ``git archive main | tar -x -C /tmp/main``) it also
times lowering, memory events, both engines and metrics in that tree and in this one: each
tree runs in its own long-lived worker process (``PYTHONPATH=TREE``), and the driver asks them
in turn, alternating which goes first, to run one step once, so both see the same load on a
shared machine; the fastest of the repeats is compared.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from alternating import alternate, serve

HERE = Path(__file__).resolve().parent
FORWARD_S, BACKWARD_S, ACTIVATION_BYTES, PARAM_BYTES = 1e-3, 2e-3, 1e6, 4e6
BANDWIDTH, LATENCY = "25Gbit/s", "5us"
# (schedule, ranks, stages per rank, m): several stages per rank, split backward, one stage per rank.
FEATURE_POINTS = (("1f1b", 32, 1, 256), ("interleaved-1f1b", 16, 2, 128), ("zbv", 16, 2, 128),
                  ("dualpipev", 16, 2, 64), ("zb-h1", 32, 1, 256))
# A/B points (schedule, p, m) and repeats per step.
AB_POINTS = (("1f1b", 8, 64), ("2bw", 32, 256), ("1f1b", 64, 512))
AB_REPEATS = {"lower": 15, "memory": 15, "analytic": 15, "des": 5, "metrics": 15}


def best_of(run: Callable[[], Any], budget_s: float = 1.0, most: int = 7) -> float:
    """Fastest wall time of ``run()`` over repeats within about ``budget_s`` (at least 2)."""
    times: list[float] = []
    while len(times) < 2 or (sum(times) < budget_s and len(times) < most):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def feature_rows() -> list[dict[str, Any]]:
    """DES and analytic ops/s on issue 8's schedules, and the DES with every device's NIC shared
    (max-min fair sharing, which only the DES models) on the same programs."""
    from pipesim import Topology, uniform_profile
    from pipesim.engine.analytic import run_analytic
    from pipesim.engine.des import run_des
    from pipesim.simulation import make_plan, prepare

    def topology(num_devices: int, shared: bool) -> Topology:
        data = Topology.uniform(num_devices=num_devices, bandwidth=BANDWIDTH, latency=LATENCY).model_dump(by_alias=True)
        data["shared"] = shared
        return Topology.model_validate(data)

    rows = []
    for schedule, ranks, per_rank, m in FEATURE_POINTS:
        p = ranks * per_rank
        profile = uniform_profile(num_layers=p, forward_s=FORWARD_S, backward_s=BACKWARD_S,
                                  activation_bytes=ACTIVATION_BYTES, param_bytes=PARAM_BYTES)
        plan = make_plan(profile, schedule=schedule, num_stages=p, num_microbatches=m, stages_per_rank=per_rank)
        dedicated = prepare(profile, topology(ranks, False), plan)
        shared = prepare(profile, topology(ranks, True), plan)
        assert shared.has_link_contention and not dedicated.has_link_contention
        row = {"schedule": schedule, "ranks": ranks, "stages_per_rank": per_rank, "m": m,
               "ops": dedicated.ops.num_ops,
               "des_s": best_of(lambda: run_des(dedicated), budget_s=2.0, most=3),
               "analytic_s": best_of(lambda: run_analytic(dedicated)),
               "des_shared_s": best_of(lambda: run_des(shared), budget_s=2.0, most=3)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _ab_tasks() -> dict[str, Callable[[], Any]]:
    """Every (point, step) of the A/B as a closure over inputs built once (run in a worker)."""
    from pipesim import Topology, uniform_profile
    from pipesim.engine.analytic import run_analytic
    from pipesim.engine.des import run_des
    from pipesim.engine.lowering import lower
    from pipesim.engine.memory import memory_columns
    from pipesim.metrics import compute_metrics
    from pipesim.schedule.registry import build_schedule
    from pipesim.simulation import make_plan, prepare
    from pipesim.spec.stages import stage_costs

    tasks: dict[str, Callable[[], Any]] = {}
    for schedule, p, m in AB_POINTS:
        profile = uniform_profile(num_layers=p, forward_s=FORWARD_S, backward_s=BACKWARD_S,
                                  activation_bytes=ACTIVATION_BYTES, param_bytes=PARAM_BYTES)
        topology = Topology.uniform(num_devices=p, bandwidth=BANDWIDTH, latency=LATENCY)
        plan = make_plan(profile, schedule=schedule, num_stages=p, num_microbatches=m)
        built = build_schedule(schedule, p, m, num_minibatches=plan.num_minibatches)
        costs = stage_costs(profile, plan, topology)
        program = prepare(profile, topology, plan)
        trace = run_analytic(program)
        n = program.ops.num_ops
        start, end = trace.spans["start_s"][:n].copy(), trace.spans["end_s"][:n].copy()
        key = f"{schedule} p={p} m={m}"
        tasks[f"{key}|lower"] = lambda b=built, c=costs, t=topology: lower(b, c, t, check=False)
        tasks[f"{key}|memory"] = lambda g=program, s=start, e=end: memory_columns(g, s, e)
        tasks[f"{key}|analytic"] = lambda g=program: run_analytic(g)
        tasks[f"{key}|des"] = lambda g=program: run_des(g)
        tasks[f"{key}|metrics"] = lambda t=trace: compute_metrics(t)
    return tasks


def worker() -> None:
    """Serve ``_ab_tasks`` to ``ab_rows`` (see ``alternating.serve``)."""
    serve(_ab_tasks())


def ab_rows(baseline: Path, candidate: Path) -> list[dict[str, Any]]:
    """Fastest time of every step in each tree, asked alternately; one row per (point, step)."""
    return alternate(__file__, baseline, candidate, AB_REPEATS.__getitem__)


def _rate(ops: int, seconds: float) -> str:
    return f"{ops / seconds / 1e6:.2f} M" if ops / seconds >= 1e5 else f"{ops / seconds / 1e3:.0f} k"


def render(header: str, features: list[dict[str, Any]], ab: list[dict[str, Any]] | None, baseline: str) -> str:
    """The ``schedules`` section of RESULTS.md."""
    lines = ["## Several stages per rank, split backward, shared NICs (issue 8)", "",
             "Written by `make bench-schedules` (benchmarks/bench_schedules.py).", "", header, "",
             "Uniform stages (1 ms forward, 2 ms backward, 1 MB activations, 4 MB weights) on links of 25 Gbit/s "
             "and 5 us; I and W take half the backward each (the profile has no measured split). `DES shared` "
             "runs the same program with every device's NIC shared by the flows leaving and entering it "
             "(`Topology.shared`): those links become first-in first-out queues served through "
             "`engine/network.py`, which recomputes max-min fair rates whenever a flow starts or ends; the "
             "analytic engine refuses such programs. Programs without shared NICs never build that machinery.",
             "", "| schedule | ranks | stages per rank | m | ops | DES ops/s | analytic ops/s | analytic / DES "
             "| DES shared ops/s | DES shared / DES |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in features:
        ops = row["ops"]
        lines.append(f"| {row['schedule']} | {row['ranks']} | {row['stages_per_rank']} | {row['m']} | {ops:,} | "
                     f"{_rate(ops, row['des_s'])} | {_rate(ops, row['analytic_s'])} | "
                     f"{row['des_s'] / row['analytic_s']:.0f}x | {_rate(ops, row['des_shared_s'])} | "
                     f"{row['des_s'] / row['des_shared_s']:.2f}x |")
    if ab:
        lines += ["", f"### A/B against {baseline}", "",
                  "Each step in a worker process per tree, asked in turn (alternating which goes first), fastest "
                  "of the repeats; below 1 is faster here.", "",
                  "| point | step | baseline ms | this tree ms | this / baseline |", "|---|---|---|---|---|"]
        for row in ab:
            lines.append(f"| {row['point']} | {row['step']} | {row['baseline_s'] * 1e3:.2f} | "
                         f"{row['candidate_s'] * 1e3:.2f} | {row['candidate_s'] / row['baseline_s']:.2f} |")
    return "\n".join(lines + [""])


def main() -> None:
    """Run the feature points (and the A/B with --baseline) and write the schedules section."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--baseline", default=None, metavar="TREE", help="a source tree to compare this one with")
    parser.add_argument("--label", default=None, help="how to name the baseline in RESULTS.md (default: its path)")
    parser.add_argument("--out", default=str(HERE / "RESULTS.md"), help="the shared results file")
    args = parser.parse_args()
    if args.worker:
        worker()
        return
    sys.path.insert(0, str(HERE))
    from bench_engines import machine
    from results_file import write_section

    header = machine()
    features = feature_rows()
    ab = ab_rows(Path(args.baseline), HERE.parent) if args.baseline else None
    write_section("schedules", render(header, features, ab, args.label or str(args.baseline)), Path(args.out))
    print(f"wrote the schedules section of {args.out}")


if __name__ == "__main__":
    main()
