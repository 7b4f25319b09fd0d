"""pipesim search speed: Llama-3 70B on 512 H100 (issue 19's target: under 60 s on the 2-core machine).

Whole processes, as a user runs them: the search command against ``python -c "import numpy, pipesim"``
measured in the same run, alternating, so host drift hits both alike. Writes its section of
benchmarks/RESULTS.md.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from results_file import machine, write_section

ROOT = Path(__file__).resolve().parents[1]
SEARCH = ["-m", "pipesim", "search", "--model", "llama3-70b", "--device", "h100", "--gpus", "512",
          "--global-batch", "1024", "--json"]
BASELINE = ["-c", "import numpy, pipesim"]


def wall(args: list[str]) -> tuple[float, str]:
    """Seconds of one ``python ARGS`` process, and its stdout."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, check=True)
    return time.perf_counter() - started, done.stdout


def main(repeats: int = 2) -> None:
    """Run baseline and search ``repeats`` times each, alternating, and write the section."""
    searches, baselines, output = [], [], ""
    for _ in range(repeats):
        baselines.append(wall(BASELINE)[0])
        seconds, output = wall(SEARCH)
        searches.append(seconds)
    data = json.loads(output)
    best, rows = data["best"], data["candidates"]
    simulated = sum(row["status"] == "simulated" for row in rows)
    search_s, baseline_s = statistics.median(searches), statistics.median(baselines)
    text = f"""## Configuration search (`make bench-search`)

{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {machine()}.
`pipesim search --model llama3-70b --device h100 --gpus 512 --global-batch 1024 --json`, whole process,
median of {repeats} (each run beside a `python -c "import numpy, pipesim"` baseline):

| what | seconds | over baseline |
| --- | ---: | ---: |
| baseline import | {baseline_s:.2f} | 1.0x |
| search ({len(rows)} candidates, {simulated} simulated) | {search_s:.2f} | {search_s / baseline_s:.1f}x |

Target: under 60 s on this 2-core machine ({search_s / 60:.2f}x of it). Best: tp={best['tp']}, pp={best['pp']},
dp={best['dp']}, b={best['microbatch_size']}, {best['schedule']} (V={best['stages_per_rank']}),
recompute {best['recompute']}: {best['tokens_per_s']:,.0f} tokens/s, MFU {best['mfu']:.1%},
peak {best['peak_memory_bytes'] / 1e9:.1f} GB (simulated; efficiency 0.5 of peak assumed).
Individual runs: search {', '.join(f'{s:.2f}' for s in searches)} s; baseline {', '.join(f'{s:.2f}' for s in baselines)} s.
"""
    text += f"Load average over the last minute when it finished: {os.getloadavg()[0]:.1f} (the machine is shared).\n"
    write_section("search", text)
    print(text)


if __name__ == "__main__":
    main()
