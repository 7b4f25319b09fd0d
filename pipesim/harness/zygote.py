"""The launcher's side of the rank fork server (pipesim.harness.rank.forkserver): start it, ask it for ranks, watch them.

Importing torch takes seconds per process; a run of P ranks repeated R times would pay it P * R
times. The fork server imports torch once and forks every rank from that state; it reports the
children's pids, then each exit status, one JSON line each. It dies with its parent, and its
children die with it (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Any

from pipesim.harness.lifetime import die_with_parent

POLL_S = 0.05


class ForkedRank:
    """The launcher's handle on a rank forked by the zygote, with Popen's poll/terminate/kill/wait."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote = zygote
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit status (negative: the signal) once the rank has ended, else None."""
        if self.returncode is None:
            self.zygote.collect()
        return self.returncode

    def terminate(self) -> None:
        """SIGTERM the rank."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the rank."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the rank to end.

        Raises:
            subprocess.TimeoutExpired: it did not end within ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.perf_counter() + timeout
        while self.poll() is None:
            if deadline is not None and time.perf_counter() > deadline:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout or 0.0)
            time.sleep(POLL_S)
        assert self.returncode is not None
        return self.returncode


class Zygote:
    """The parent's side of the fork server."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "pipesim.harness.rank.forkserver"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, preexec_fn=die_with_parent)
        self.ranks: dict[int, ForkedRank] = {}
        self._buffer = b""
        if self._read_line(timeout_s=300.0) != {"ready": True}:
            raise RuntimeError("the rank fork server did not start")

    @property
    def alive(self) -> bool:
        """True while the server runs."""
        return self.process.poll() is None

    def _read_line(self, timeout_s: float | None) -> dict[str, Any] | None:
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = None if timeout_s is None else time.perf_counter() + timeout_s
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.perf_counter())
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError("the rank fork server exited")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return dict(json.loads(line))

    def start(self, module: str, args: list[str], env: list[dict[str, str]], logs: list[str]) -> list[ForkedRank]:
        """Fork one rank per entry of ``env``, each running ``module.main(args)``."""
        assert self.process.stdin is not None
        request = {"module": module, "args": args, "env": env, "logs": logs, "cwd": os.getcwd()}
        self.process.stdin.write((json.dumps(request) + "\n").encode())
        self.process.stdin.flush()
        reply = self._read_line(timeout_s=60.0)
        if reply is None or "pids" not in reply:
            raise RuntimeError(f"the rank fork server did not start the ranks: {reply}")
        ranks = [ForkedRank(self, pid) for pid in reply["pids"]]
        self.ranks.update({rank.pid: rank for rank in ranks})
        return ranks

    def collect(self) -> None:
        """Read the exit statuses reported so far."""
        while True:
            try:
                message = self._read_line(timeout_s=0.0)
            except RuntimeError:
                for rank in self.ranks.values():
                    if rank.returncode is None:
                        rank.returncode = -int(signal.SIGKILL)
                return
            if message is None:
                return
            done = self.ranks.pop(int(message["pid"]), None)
            if done is not None:
                done.returncode = int(message["code"])

    def close(self) -> None:
        """Stop the server (its children die with it)."""
        if self.alive:
            self.process.kill()
            self.process.wait()


_SERVER: list[Zygote] = []


def shared_zygote() -> Zygote:
    """This process's fork server, started on first use and stopped at exit."""
    if not _SERVER or not _SERVER[0].alive:
        import atexit

        _SERVER[:] = [Zygote()]
        atexit.register(_SERVER[0].close)
    return _SERVER[0]
