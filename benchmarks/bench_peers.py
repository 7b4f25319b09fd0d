"""pipesim beside its peers, timed in one run on the same schedules (1F1B and interleaved 1F1B):

- ``pipesim.simulate`` end to end (warm; default kernel policy, and compiled), and the analytic
  engine alone (compiled) on a lowered program;
- a bare SimPy loop with one timeout per op (the floor of any SimPy model);
- a plain-Python longest path over the explicit op graph (edges: a rank's order and each op's
  input), the textbook way to compute a schedule's timeline;
- torch.distributed.pipelining's unit-step simulator (``_simulate_comms_compute`` over the
  schedule with its sends and receives added by ``_add_send_recv``), when torch is installed;
- for the zero-bubble rows, one greedy pass of the zero-bubble paper's scheduler (Qi et al.,
  ICLR 2024, section 3.1: F, I and W placed one at a time, each timed as it is placed), in plain
  Python as the paper's repository runs it: ``pipesim.schedule.zb_auto.greedy`` with one of its
  eight settings, on the same stage times (zb-auto runs all eight, then simulates the best).

Per-op cost of each peer and its ratio to ``simulate``. The longest path is checked against
pipesim's makespan on a zero-communication topology (they must agree), so the peer computes the
same thing it is timed for.

    python benchmarks/bench_peers.py [--write]
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bare_simpy import bare_simpy_loop  # noqa: E402
from pipesim import Topology, make_plan, simulate, uniform_profile  # noqa: E402
from pipesim.engine.analytic import run_analytic  # noqa: E402
from pipesim.engine.lowering import Program  # noqa: E402
from pipesim.schedule.csv_format import to_csv  # noqa: E402
from pipesim.schedule.ir import F_CODE, I_CODE, W_CODE  # noqa: E402
from pipesim.schedule.zb_auto import Knobs, ZeroBubbleCosts, greedy  # noqa: E402
from pipesim.simulation import prepare  # noqa: E402

CASES = (("1f1b", 8, 32, 1), ("1f1b", 32, 128, 1), ("1f1b", 64, 512, 1),
         ("interleaved-1f1b", 16, 64, 2), ("interleaved-1f1b", 64, 512, 2), ("zb-h1", 8, 32, 1), ("zb-h1", 64, 512, 1))


def best_of(run: Callable[[], Any], budget_s: float = 1.5, most: int = 5) -> float:
    """Fastest of up to ``most`` runs, stopping once ``budget_s`` is spent (at least two runs)."""
    times: list[float] = []
    spent = 0.0
    while len(times) < most and (len(times) < 2 or spent < budget_s):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
        spent += times[-1]
    return min(times)


def longest_path_ends(program: Program) -> list[float]:
    """Each op's end by Kahn's topological order over the op graph, in plain Python: an op
    starts when its rank's previous op has ended and its input has arrived (end + transfer)."""
    ops = program.ops
    n = ops.num_ops
    duration, transfer = ops.duration_s.tolist(), ops.transfer_s.tolist()
    successors: list[list[int]] = [[] for _ in range(n)]
    indegree = [0] * n
    offsets = ops.rank_offsets.tolist()
    for r in range(len(offsets) - 1):
        for g in range(offsets[r], offsets[r + 1] - 1):
            successors[g].append(g + 1)
            indegree[g + 1] += 1
    for g, w in enumerate(ops.wait.tolist()):
        if w >= 0:
            successors[w].append(g)
            indegree[g] += 1
    start = [0.0] * n
    end = [0.0] * n
    ready = [g for g in range(n) if indegree[g] == 0]
    while ready:
        g = ready.pop()
        end[g] = start[g] + duration[g]
        for h in successors[g]:
            arrival = end[g] + (transfer[g] if h != g + 1 or ops.rank[h] != ops.rank[g] else 0.0)
            if arrival > start[h]:
                start[h] = arrival
            indegree[h] -= 1
            if indegree[h] == 0:
                ready.append(h)
    return end


def torch_simulator(schedule_csv: str, num_ranks: int, num_stages: int) -> Callable[[], Any] | None:
    """torch's unit-step simulation of the schedule in ``schedule_csv`` (None without torch)."""
    try:
        from torch.distributed.pipelining import schedules
    except ImportError:
        return None
    actions = {rank: [schedules._Action.from_str(cell) for cell in row.split(",") if cell]
               for rank, row in enumerate(schedule_csv.strip().splitlines())}

    def stage_to_rank(stage: int) -> int:
        # Interleaved placement: stage s on rank s mod R.
        return stage % num_ranks

    def run() -> Any:
        # Both functions consume the lists they are given: each run gets its own.
        with_comms = schedules._add_send_recv({r: list(a) for r, a in actions.items()}, stage_to_rank, num_stages)
        return schedules._simulate_comms_compute(with_comms, stage_to_rank, num_stages)

    return run


def zero_bubble_pass(program: Program) -> Callable[[], Any]:
    """One pass of the zero-bubble greedy scheduler on the program's stage times (F, I and W
    from the lowered ops, free links, no memory limit): it places and times every F, I and W."""
    ops = program.ops
    # Every op of one (stage, kind) lasts the same: any of them gives the stage's time.
    time_of = dict(zip(zip(ops.stage.tolist(), ops.kind.tolist()), ops.duration_s.tolist(), strict=True))
    p = program.schedule.num_stages
    costs = ZeroBubbleCosts(forward_s=tuple(time_of[(s, F_CODE)] for s in range(p)),
                            backward_input_s=tuple(time_of[(s, I_CODE)] for s in range(p)),
                            backward_weight_s=tuple(time_of[(s, W_CODE)] for s in range(p))).checked(p)
    m = program.schedule.num_microbatches
    return lambda: greedy(costs, m, math.inf, Knobs(True, False, False))


def rows() -> list[dict[str, Any]]:
    """One row per case: per-op microseconds of pipesim and each peer."""
    found = []
    for schedule, p, m, v in CASES:
        profile = uniform_profile(num_layers=p, forward_s=1e-3, backward_s=2e-3, activation_bytes=1e6)
        ranks = p // v
        free = Topology.uniform(num_devices=ranks, bandwidth="1000000TB/s", latency="0s")
        options: dict[str, Any] = {"stages_per_rank": v} if v > 1 else {}
        plan = make_plan(profile, schedule=schedule, num_stages=p, num_microbatches=m, **options)
        program = prepare(profile, free, plan)
        ends = longest_path_ends(program)
        ours = run_analytic(program).spans["end_s"][: program.ops.num_ops]
        if not np.allclose(ends, ours, rtol=0, atol=1e-12):
            raise SystemExit(f"{schedule} p={p} m={m}: the longest path disagrees with pipesim")
        n = program.ops.num_ops
        row: dict[str, Any] = {"case": f"{schedule} p={p} m={m}" + (f" V={v}" if v > 1 else ""), "ops": n}
        for label, kernels in (("simulate", None), ("simulate compiled", "always")):
            row[label] = best_of(lambda: simulate(profile, free, schedule=schedule, num_stages=p, num_microbatches=m,
                                                  engine="analytic", kernels=kernels, **options))
        row["analytic engine compiled"] = best_of(lambda: run_analytic(program, compiled=True))
        row["bare SimPy"] = best_of(lambda: bare_simpy_loop(ranks, n // ranks).run())
        row["longest path"] = best_of(lambda: longest_path_ends(program))
        torch_run = torch_simulator(to_csv(program.schedule), ranks, p)
        row["torch simulator"] = best_of(torch_run) if torch_run is not None else None
        row["zero-bubble greedy"] = best_of(zero_bubble_pass(program)) if schedule.startswith("zb") else None
        found.append(row)
        print(row, flush=True)
    return found


def render(found: list[dict[str, Any]], header: str) -> str:
    peers = ("simulate", "simulate compiled", "analytic engine compiled", "bare SimPy", "longest path",
             "torch simulator", "zero-bubble greedy")
    lines = ["## pipesim beside its peers (`make bench-peers`)", "", header, "",
             "Microseconds per op (best of up to 5 warm runs); in brackets the time over `simulate`'s (the",
             "default kernel policy: plain Python below 50,000 ops). `analytic engine compiled`: `run_analytic`",
             "on a lowered program (timing, memory events, trace assembly).", "",
             "| case | ops | " + " | ".join(peers) + " |", "|---|---:|" + "---:|" * len(peers)]
    for row in found:
        cells = []
        for peer in peers:
            if row[peer] is None:
                cells.append("n/a (no torch)" if peer == "torch simulator" else "")
                continue
            ratio = "" if peer == "simulate" else f" ({row[peer] / row['simulate']:.2f}x)"
            cells.append(f"{row[peer] / row['ops'] * 1e6:.3f}{ratio}")
        lines.append(f"| {row['case']} | {row['ops']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="replace this section of benchmarks/RESULTS.md")
    args = parser.parse_args()
    from results_file import machine, write_section

    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    section = render(rows(), f"{stamp}; {machine()}; load average at start {load}.")
    print(section)
    if args.write:
        write_section("peers", section)


if __name__ == "__main__":
    main()
