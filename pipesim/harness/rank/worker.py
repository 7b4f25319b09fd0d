"""One rank's process: ``python -m pipesim.harness.rank.worker CONFIG.json``, under pipesim's launcher or torchrun.

It reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT from the environment (torchrun sets them;
so does ``pipesim run``) and PIPESIM_RUN_DIR for its record file (a temporary folder if unset).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

import torch.distributed as dist

from pipesim.harness.config import RunConfig
from pipesim.harness.rank.runtime import RankRuntime, init_process_group, write_error


def main(argv: list[str]) -> int:
    """Run one rank; on any failure write the error file and leave at once with status 1."""
    if len(argv) != 1:
        print("usage: python -m pipesim.harness.rank.worker CONFIG.json", file=sys.stderr)
        return 2
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    given = os.environ.get("PIPESIM_RUN_DIR")
    run_dir = Path(given or tempfile.mkdtemp(prefix=f"pipesim-rank{rank}-"))
    runtime = None
    try:
        config = RunConfig.from_json(Path(argv[0]).read_text(encoding="utf-8"))
        init_process_group(config, rank, world_size)
        runtime = RankRuntime(config, rank, world_size, run_dir)
        runtime.run()
        runtime.finish()
        dist.destroy_process_group()
        if not given:  # under torchrun: the records served their purpose (rank 0 wrote the trace)
            shutil.rmtree(run_dir, ignore_errors=True)
    except BaseException as error:  # noqa: BLE001 - every failure must be reported, even KeyboardInterrupt
        if runtime is not None:
            runtime.fail(run_dir, error)
        else:
            write_error(run_dir, rank, "", error)
        traceback.print_exc()
        print(f"rank {rank}: records kept in {run_dir}", file=sys.stderr)
        sys.stderr.flush()
        # Leave without tearing the process group down: its peers may be dead or hung.
        os._exit(1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
