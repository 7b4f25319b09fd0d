"""Does pipesim search find what the published runs ran (issue 33)? For each run of the published-runs
file: the search over the run's model, GPUs, global batch and sequence length, and the paper's own
configuration simulated by the same cost model under the same software assumptions as the search
(today's defaults: fused attention, the device's 16-bit type, the DP reduction after the last
backward). The paper's configuration is either among the search's top 5, or the search's best beats
it by the model's own prediction (by how much is printed), or neither (the search missed it).

    python benchmarks/search_published.py [--runs FILE] [--write]

``--write`` puts the table into benchmarks/RESULTS.md (section ``search-published``).
"""

from __future__ import annotations

import argparse
import datetime
import time
from pathlib import Path
from typing import Any

from bench_published import DEFAULT_RUNS, NOTES, cluster_of, config_of, device_of
from results_file import machine, write_section

from pipesim.search import search
from pipesim.spec.files import read_json
from pipesim.training import megatron_schedule, simulate_training

TOP = 5


def compare(run: dict[str, Any], runs_file: Path) -> dict[str, Any]:
    """The search's top 5 and the paper's configuration, predicted alike."""
    parallel, model = run["parallelism"], run["model"]
    note = NOTES.get(run["id"], {})
    config = config_of(model, runs_file)
    device = device_of(run["hardware"])
    cluster = cluster_of(run["hardware"], device)
    tp, pp, dp, cp = parallel["tp"], parallel["pp"], parallel["dp"], parallel.get("cp") or 1
    v = (parallel.get("virtual_stages") or note.get("virtual_stages") or 1) if pp > 1 else 1
    size = parallel.get("microbatch_size") or note.get("microbatch_size") or 1
    recompute = parallel.get("recompute") or "none"
    zero = parallel.get("zero_stage") or 0
    began = time.perf_counter()
    outcomes = search(config, device=device, cluster=cluster, num_gpus=tp * cp * pp * dp,
                      global_batch=parallel["global_batch_size"], seq_len=model["seq_len"], top=TOP)
    seconds = time.perf_counter() - began
    top = [o for o in outcomes if o.fits][:TOP]
    paper = simulate_training(config, device=device, cluster=cluster, global_batch=parallel["global_batch_size"],
                              tp=tp, pp=pp, dp=dp, cp=cp, stages_per_rank=v,
                              schedule=megatron_schedule(v), microbatch_size=size,
                              seq_len=model["seq_len"], sequence_parallel=bool(parallel.get("sequence_parallel")),
                              recompute=recompute, zero=zero)
    wanted = (tp, pp, dp, cp, size, v, recompute, bool(parallel.get("sequence_parallel")), zero)
    place = next((index + 1 for index, o in enumerate(top)
                  if (o.candidate.tp, o.candidate.pp, o.candidate.dp, o.candidate.cp, o.candidate.microbatch_size,
                      o.candidate.stages_per_rank, o.candidate.recompute, o.candidate.sequence_parallel,
                      o.candidate.zero) == wanted and o.candidate.schedule in ("1f1b", "interleaved-1f1b")), 0)
    best = top[0] if top else None
    gain = best.tokens_per_s / paper.tokens_per_s if best is not None else 0.0
    verdict = f"in the top 5 (#{place})" if place else \
        f"beaten: best {gain:.2f}x its tokens/s" if gain > 1 else "missed"
    if not paper.fits:
        verdict += "; the paper's configuration does not fit by the model"
    c = best.candidate if best is not None else None
    chosen = (f"tp={c.tp} cp={c.cp} pp={c.pp} dp={c.dp} b={c.microbatch_size} {c.schedule} V={c.stages_per_rank} "
              f"SP={'on' if c.sequence_parallel else 'off'} {c.recompute} ZeRO-{c.zero}") if c is not None else "none fits"
    return {"id": run["id"], "paper": f"tp={tp} pp={pp} dp={dp} b={size} V={v} {recompute}", "verdict": verdict,
            "best": chosen, "gain": gain, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    data = read_json(args.runs)
    rows = [compare(run, args.runs) for run in (data["runs"] if isinstance(data, dict) else data)]
    table = "\n".join(f"| {r['id']} | {r['paper']} | {r['verdict']} | {r['best']} | {r['seconds']:.1f} |" for r in rows)
    text = f"""## The search against published runs (`python benchmarks/search_published.py --write`)

{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {machine()}, runs from {args.runs.name}.
The paper's configuration and the search's candidates predicted by the same cost model under the
same assumptions (fused attention, the device's 16-bit type, DP reduction after the backward);
"beaten" gives the search's best tokens/s over the paper configuration's, both predicted.

| run | paper's configuration | verdict | search's best | search s |
| --- | --- | --- | --- | ---: |
{table}
"""
    print(text)
    if args.write:
        write_section("search-published", text)


if __name__ == "__main__":
    main()
