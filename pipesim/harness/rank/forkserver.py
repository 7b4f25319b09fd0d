"""The rank fork server: torch is imported once, and every rank is forked from that state.

Started by the launcher (pipesim.harness.zygote) as ``python -m pipesim.harness.rank.forkserver``.
It imports torch and the rank entry points, runs no torch op (so no thread pool exists when it
forks), and on each request (one JSON line: module, args, per-rank environment and log file)
forks one child per rank, each running ``module.main(args)``. It writes the children's pids,
then each exit status, one JSON line each.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import sys
from typing import Any

from pipesim.harness.lifetime import die_with_parent


def _child(request: dict[str, Any], rank: int) -> None:
    """In a forked rank: become the worker and never return."""
    code = 1
    try:
        die_with_parent()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        log = os.open(request["logs"][rank], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.chdir(request["cwd"])
        sys.path.insert(0, request["cwd"])
        os.environ.update(request["env"][rank])
        code = int(importlib.import_module(request["module"]).main(request["args"]))
    except BaseException:  # noqa: BLE001 - a child must never return into the server's loop
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    """The server loop: one request at a time; report pids, then each child's exit status.

    A Ctrl-C at the terminal reaches the whole process group: the launcher reports it and ends the
    run, and the ranks (SIGINT at its default again) stop; the server ignores it, so that no
    KeyboardInterrupt from its import or its wait follows the launcher's one line."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    import torch  # noqa: F401 - the point of the fork server: import once, fork many
    import torch.distributed  # noqa: F401

    import pipesim.harness.rank.linkbench_rank  # noqa: F401
    import pipesim.harness.rank.profile_rank  # noqa: F401
    import pipesim.harness.rank.worker  # noqa: F401

    out = sys.stdout.buffer
    out.write(b'{"ready": true}\n')
    out.flush()
    for line in sys.stdin.buffer:
        request = json.loads(line)
        pids = []
        for rank in range(len(request["env"])):
            pid = os.fork()
            if pid == 0:
                _child(request, rank)
            pids.append(pid)
        out.write((json.dumps({"pids": pids}) + "\n").encode())
        out.flush()
        for _ in pids:
            pid, status = os.waitpid(-1, 0)
            out.write((json.dumps({"pid": pid, "code": os.waitstatus_to_exitcode(status)}) + "\n").encode())
            out.flush()


if __name__ == "__main__":
    serve()
