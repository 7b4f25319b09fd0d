"""Which calibration run predicts a schedule's real run best: per-op wall and CPU times, in turns, in one session.

For one model and schedule: a layer profile and a linkbench once; then rounds, each running (in a
rotating order) every calibration run named by ``--calibrations`` and the validated run, all of
the real runtime on the same partition. Per round it prints every calibration's prediction error
against that round's validated run, and per stage and kind the validated run's mean op (wall and
thread CPU time) over each calibration's. The validated run's times are only compared against.

    python benchmarks/calibration_ab.py --model mlp --schedule gpipe --rounds 4 \
        --calibrations gpipe:4,gpipe:8,1f1b:8
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipesim.engine.trace import Trace  # noqa: E402
from pipesim.harness.calibration import measured_op_times, scaled  # noqa: E402
from pipesim.harness.config import ModelSpec, RunConfig  # noqa: E402
from pipesim.harness.launch import launch  # noqa: E402
from pipesim.harness.linkbench import measure_links  # noqa: E402
from pipesim.harness.priority import raise_priority  # noqa: E402
from pipesim.harness.profiler import Timing, measure_profile  # noqa: E402
from pipesim.harness.comparison import op_means, relative_error  # noqa: E402
from pipesim.metrics import compute_metrics  # noqa: E402
from pipesim.simulation import simulate  # noqa: E402
from pipesim.spec.stages import balance_partition  # noqa: E402

MODELS = {"mlp": (ModelSpec("mlp", depth=8, width=512), 64),
          "transformer": (ModelSpec("transformer", depth=4, width=128, seq_len=64, heads=4), 8)}


def main() -> int:
    """Run the rounds and print one JSON line per round."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp")
    parser.add_argument("--schedule", default="gpipe")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--minibatches", type=int, default=8)
    parser.add_argument("--calibrations", default="gpipe:4,gpipe:8,1f1b:8",
                        help="schedule:m[:K] of each calibration run (K default 20; the validated run's --minibatches "
                             "is the calibration's default elsewhere)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--nice", type=int, default=-20)
    args = parser.parse_args()
    raise_priority(args.nice)
    spec, batch = MODELS[args.model]
    profile = measure_profile(spec, batch, timing=Timing(repeats=30, processes=2)).profile
    largest = int(max(layer.activation_bytes for layer in profile.layers))
    topology, _ = measure_links(2, max_bytes=max(4, largest))
    cuts = balance_partition(profile, 2)
    runs: list[tuple[str, str, int, int]] = []
    for item in args.calibrations.split(","):
        parts = item.split(":")
        runs.append((item, parts[0], int(parts[1]), int(parts[2]) if len(parts) > 2 else 20))
    runs.append(("run", args.schedule, args.microbatches, args.minibatches))
    with tempfile.TemporaryDirectory() as folder:
        for round_index in range(args.rounds):
            order = runs[round_index % len(runs):] + runs[:round_index % len(runs)]
            traces: dict[str, Trace] = {}
            for label, schedule, m, k in order:
                config = RunConfig(model=spec, schedule=schedule, num_stages=2, num_microbatches=m,
                                   num_minibatches=k, microbatch_size=batch, partition=cuts)
                path = Path(folder) / "trace.json"
                launch(config.with_outputs(trace_out=path))
                traces[label] = Trace.from_json(path.read_text(encoding="utf-8"))
            measured = compute_metrics(traces["run"]).iteration_time_s
            wall, cpu = op_means(traces["run"]), op_means(traces["run"], cpu=True)
            report: dict[str, object] = {"round": round_index, "measured_ms": measured * 1e3,
                                         "run_cpu_share": traces["run"].info.cpu_share}
            for label, *_ in runs[:-1]:
                trace = traces[label]
                times = scaled(profile, cuts, measured_op_times(trace, 2, "mean"))
                predicted = simulate(times, topology, schedule=args.schedule, num_stages=2,
                                     num_microbatches=args.microbatches, num_minibatches=args.minibatches,
                                     partition=cuts, optimizer_state_multiplier=0.0).metrics.iteration_time_s
                cal_wall, cal_cpu = op_means(trace), op_means(trace, cpu=True)
                report[label] = {
                    "error": round(relative_error(predicted, measured), 4),
                    "cpu_share": trace.info.cpu_share,
                    # a split backward's I and W have no calibrated counterpart (they scale as B)
                    "wall_ratio": {key: round(wall[key] / cal_wall[key], 3) for key in wall if key in cal_wall},
                    "cpu_ratio": {key: round(cpu[key] / cal_cpu[key], 3) for key in cpu if cal_cpu.get(key)},
                }
            report["run_ops_ms"] = {key: round(value * 1e3, 3) for key, value in wall.items()}
            report["run_cpu_ms"] = {key: round(value * 1e3, 3) for key, value in cpu.items()}
            print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
