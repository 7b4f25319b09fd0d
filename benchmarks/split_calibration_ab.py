"""A/B of the calibration for a split backward (issue 34): ZB-H1's real runs predicted from GPipe and
1F1B calibration runs alone (I and W scaled as B, an F after a W timed as one after a B) against the
same plus a ZB-H1 calibration run (``calibrate(..., split_backward=True)``).

Both validations run the same schedule on the same profile, alternated run by run (A B A B), each
round calibrated afresh; printed: each one's median error, the median measured over calibrated op
time per kind, and the runs' noise floor. ``python benchmarks/split_calibration_ab.py [--rounds N]
[--case 2]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_validate import CASES, PerRound  # noqa: E402

from pipesim.harness.calibration import CalibrationRun  # noqa: E402
from pipesim.harness.linkbench import measure_links  # noqa: E402
from pipesim.harness.profiler import Timing, measure_profile  # noqa: E402
from pipesim.harness.validate import ScheduleValidation  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--case", type=int, default=2, help="bench_validate's case number (1-based)")
    parser.add_argument("--schedule", default="zb-h1")
    args = parser.parse_args()
    case = CASES[args.case - 1]
    profile = measure_profile(case.spec, case.microbatch_size, timing=Timing(repeats=30, processes=case.num_ranks)).profile
    largest = int(max(layer.activation_bytes for layer in profile.layers))
    topology, _ = measure_links(case.num_ranks, max_bytes=max(4, largest))
    common = {"schedule": args.schedule, "num_stages": case.num_ranks, "num_microbatches": case.num_microbatches,
              "num_minibatches": case.num_minibatches}
    calibrations = {"fused": PerRound(case.spec, CalibrationRun(), split_runs=False),
                    "split": PerRound(case.spec, CalibrationRun())}
    validations = {name: ScheduleValidation(profile, topology, case.spec, calibration=calibration, **common)
                   for name, calibration in calibrations.items()}
    load = os.getloadavg()
    started = time.perf_counter()
    for number in range(args.rounds):
        order = list(validations) if number % 2 == 0 else list(validations)[::-1]  # neither always first
        for name in order:
            calibrations[name].new_round()
            validations[name].run_once()
        print(f"round {number + 1} of {args.rounds} at {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    print(f"{case.label}, {args.schedule}, m={case.num_microbatches} K={case.num_minibatches}, {args.rounds} rounds "
          f"alternated; load average {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after; nproc {os.cpu_count()}")
    print("| calibration | median error | errors by run | noise floor |")
    print("|---|---|---|---|")
    for name, validation in validations.items():
        comparison = validation.comparison()
        errors = [run.iteration_time_error for run in comparison.runs]
        print(f"| {name} | {statistics.median(errors):+.1%} | {' '.join(f'{e:+.1%}' for e in errors)} "
              f"| {comparison.noise_floor:.1%} |")


if __name__ == "__main__":
    main()
