"""``pipesim check`` through its real entry point: valid files, each class of broken file, bad input."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipesim.cli import main
from pipesim.schedule.csv_format import to_csv
from pipesim.schedule.registry import build_schedule

ROOT = Path(__file__).resolve().parents[2]


def check(path: Path, *args: str, separate_process: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``pipesim check``: as ``python -m pipesim`` in a new process, or through ``pipesim.cli.main``
    (the console script's function) in this one, which is much faster."""
    argv = ["check", str(path), *args]
    if separate_process:
        return subprocess.run([sys.executable, "-m", "pipesim", *argv], capture_output=True, text=True, cwd=ROOT,
                              timeout=120)
    stdout, stderr = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            main(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
    return subprocess.CompletedProcess(argv, code, stdout.getvalue(), stderr.getvalue())


def write(tmp_path: Path, rows: list[str], name: str = "schedule.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_a_valid_schedule_exits_0(tmp_path: Path) -> None:
    path = tmp_path / "1f1b.csv"
    path.write_text(to_csv(build_schedule("1f1b", 4, 8)), encoding="utf-8")
    done = check(path, "--stages-per-rank", "1", separate_process=True)
    assert done.returncode == 0, done.stdout + done.stderr
    shape = "4 ranks, 4 stages, 8 microbatches, 64 compute ops, 0 non-compute cells skipped"
    assert done.stdout == f"{path}: valid ({shape})\n"


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        # missing op: 1B1 dropped (it has no cell, so the op is named)
        (["0F0,0F1,0B0,0B1", "1F0,1B0,1F1"], ["rank 1, no cell, op 1B1 (or I/W): is missing"]),
        # duplicate op: 0F1 twice, the second cell is the offender
        (["0F0,0F1,0F1,0B0,0B1", "1F0,1B0,1F1,1B1"],
         ["rank 0, position 2 (column 3), op 0F1: appears more than once", ">0F1<"]),
        # B before F on rank 1
        (["0F0,0F1,0B0,0B1", "1B0,1F0,1F1,1B1"],
         ["rank 1, position 0 (column 1), op 1B0: runs before 1F0", ">1B0<"]),
        # a cross-rank order that deadlocks: rank 0 waits for 1B0 before sending 0F1, which 1F1 needs
        (["0F0,0B0,0F1,0B1", "1F0,1F1,1B0,1B1"],
         ["rank 0, position 1 (column 2), op 0B0: deadlock: waits for 1B0",
          "rank 1, position 1 (column 2), op 1F1: deadlock: waits for 0F1", ">0B0<", ">1F1<"]),
        # a stage on two ranks
        (["0F0,0F1,0B0,0B1", "1F0,1B0,1F1,1B1,0F2"],
         ["rank 1, position 4 (column 5), op 0F2: stage 0 belongs to rank 0"]),
    ],
    ids=["missing", "duplicate", "b-before-f", "deadlock", "stage-on-two-ranks"],
)
def test_each_class_of_broken_schedule_exits_1_naming_the_cell(tmp_path: Path, rows: list[str],
                                                               expected: list[str]) -> None:
    done = check(write(tmp_path, rows), separate_process=expected[0].startswith("rank 0, position 1"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines()[0].startswith(f"{tmp_path / 'schedule.csv'}: invalid")
    for text in expected:
        assert text in done.stdout, done.stdout
    assert "rank  0 |" in done.stdout and "rank  1 |" in done.stdout  # the grid


def test_json_output(tmp_path: Path) -> None:
    done = check(write(tmp_path, ["0F0,,0B0", "1F0,1SEND_B0,1B0,1REDUCE_GRAD", "2F1"]), "--json")
    assert done.returncode == 1
    data = json.loads(done.stdout)
    assert data["valid"] is False
    assert (data["num_ranks"], data["num_stages"], data["num_microbatches"], data["num_skipped_cells"]) == (3, 3, 2, 2)
    assert data["stage_to_rank"] == [0, 1, 2]
    first = data["violations"][0]
    assert set(first) == {"rank", "position", "column", "op", "message"}
    assert {"rank": 2, "position": -1, "column": None, "op": "2F0", "message": "is missing"} in data["violations"]


def test_stages_per_rank_and_multi_stage_ranks(tmp_path: Path) -> None:
    # A V placement: rank 0 holds stages 0 and 3, rank 1 holds 1 and 2.
    rows = ["0F0,3F0,3B0,0B0", "1F0,2F0,2B0,1B0"]
    assert check(write(tmp_path, rows), "--stages-per-rank", "2").returncode == 0
    done = check(write(tmp_path, rows), "--stages-per-rank", "1")
    assert done.returncode == 1
    assert "rank 0, position 0 (column 1), op 0F0: rank 0 holds 2 stage(s) [0, 3], expected 1" in done.stdout
    swapped = check(write(tmp_path, ["0F0,3F0,3B0,0B0", "2F0,1F0,2B0,1B0"]))
    assert "op 2F0: runs before 1F0, which it needs and which comes later on the same rank" in swapped.stdout


def test_microbatches_option_beyond_the_ops_is_refused_not_walked(tmp_path: Path) -> None:
    """A count no file of this many ops could cover is refused up front (10**12 hung listing each missing op)."""
    path = write(tmp_path, ["0F0,0B0"])
    done = check(path, "--microbatches", "1000000000000")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"pipesim: error: {path}: microbatches=1000000000000: is too large: 2 compute ops cannot "
                           "cover microbatches 0..999999999999\n")


def test_microbatches_option_flags_out_of_range_cells(tmp_path: Path) -> None:
    done = check(write(tmp_path, ["0F0,0F1,0B0,0B1", "1F1,1B0,1F2,1B1"]), "--microbatches", "2")
    assert done.returncode == 1
    assert "rank 1, position 2 (column 3), op 1F2: microbatch 2 is outside 0..1" in done.stdout
    assert "rank 1, no cell, op 1F0: is missing" in done.stdout


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("0F0,0X1\n", "row 1 column 2='0X1': must be an action like"),
        ("0F0,(0F1;1B0)OVERLAP_X\n", "row 1 column 2"),
        ("0F0,0B\u0661\n", "row 1 column 2='0B\u0661': must be an action like"),  # an Arabic-Indic 1
        ("0F0,0SEND_F\u0661\n", "row 1 column 2='0SEND_F\u0661': must be an action like"),
        (",,\n0SEND_F0\n", "holds no compute ops"),
    ],
)
def test_unreadable_input_is_one_line_and_exit_2(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(content, encoding="utf-8")
    done = check(path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and expected in done.stderr, done.stderr
    assert done.stdout == ""


def test_missing_and_binary_files_exit_2(tmp_path: Path) -> None:
    done = check(tmp_path / "nope.csv", separate_process=True)
    assert done.returncode == 2 and "file does not exist" in done.stderr
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe0F0")
    done = check(binary)
    assert done.returncode == 2 and "is not UTF-8 text" in done.stderr
