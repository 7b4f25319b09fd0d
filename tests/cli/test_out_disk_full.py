"""A disk that refuses ``simulate --out``'s files: exit 1, one line, and the folder as it was (issue 37, item 13).

The refusal is real: a per-file size limit (RLIMIT_FSIZE: the write fails with EFBIG, Python
ignores SIGXFSZ) that metrics.json fits under and trace.json does not, and, where user and mount
namespaces allow it, a tmpfs too small for the set (ENOSPC).
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN = ["simulate", "--uniform", "layers=8,forward_ms=1,backward_ms=2,activation_bytes=1000,param_bytes=1000",
       "--stages", "4", "--microbatches", "16", "--schedule", "1f1b"]
# metrics.json is about 6 KB, trace.json about 40 KB: the limit falls between them.
FILE_LIMIT = 30_000


def size_limited() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))


def pipesim(*args: str, limited: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipesim", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300, preexec_fn=size_limited if limited else None)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.mark.parametrize("extra", [(), ("--schedule", "gpipe")], ids=["one run", "a comparison"])
def test_a_file_size_limit_exits_1_and_leaves_a_new_folder_unmade(tmp_path: Path, extra: tuple[str, ...]) -> None:
    out = tmp_path / "new" / "report"
    done = pipesim(*RUN, *extra, "--out", str(out), limited=True)
    assert done.returncode == 1, done.stderr
    assert done.stderr == f"pipesim: error: cannot write {out}: File too large; nothing was written to {out}\n"
    assert not (tmp_path / "new").exists()


def test_a_file_size_limit_leaves_an_earlier_report_whole(tmp_path: Path) -> None:
    out = tmp_path / "report"
    first = pipesim(*RUN, "--out", str(out))
    assert first.returncode == 0, first.stderr
    (out / "notes.txt").write_text("mine\n")
    before = snapshot(out)
    done = pipesim(*RUN[:-1], "gpipe", "--out", str(out), limited=True)
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "File too large" in done.stderr
    assert snapshot(out) == before
    assert sorted(path.name for path in out.iterdir()) == sorted(before)  # no temporary file left either


FULL_DISK = """\
set -u
mount -t tmpfs -o size=32k tmpfs "$DISK"
"$PYTHON" -m pipesim "$@" --out "$DISK/report" >"$STATE/out" 2>"$STATE/err"
echo $? >"$STATE/rc"
ls -A "$DISK" >"$STATE/left"
"""


def test_a_full_filesystem_exits_1_and_leaves_nothing(tmp_path: Path) -> None:
    disk, state = tmp_path / "disk", tmp_path / "state"
    disk.mkdir()
    state.mkdir()
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-rm", "mount", "-t", "tmpfs", "-o", "size=32k", "tmpfs", str(disk)],
            capture_output=True, timeout=30).returncode != 0:
        pytest.skip("no unprivileged user and mount namespaces here (unshare -rm) to mount a small tmpfs")
    env = dict(os.environ, DISK=str(disk), STATE=str(state), PYTHON=sys.executable)
    subprocess.run(["unshare", "-rm", "sh", "-c", FULL_DISK, "sh", *RUN], env=env, cwd=ROOT, check=True,
                   timeout=300)
    stderr = (state / "err").read_text()
    assert (state / "rc").read_text().strip() == "1" and len(stderr.splitlines()) == 1, stderr
    assert "No space left on device" in stderr
    assert (state / "left").read_text() == ""
