"""OUT.parts/ shared with others: one sweep writes at a time, a resume trusts only sound chunks, and a
link to scratch space is used and left in place (issue 37, items 4, 5 and 6).

The sweeps are real (in this process, or the CLI in a subprocess); the chunks are damaged on disk
as a crash, a full disk or a careless copy would leave them, and every resumed table is compared
byte for byte with an uninterrupted sweep's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipesim.errors import ConfigError
from pipesim.sweep import run_sweep
from sweep_specs import HEAVY_SPEC

ROOT = Path(__file__).resolve().parents[2]
SPEC = """\
profile: {uniform: {layers: 8, forward_ms: 1.0, backward_ms: 2.0, activation_bytes: 1000, param_bytes: 4000}}
bandwidth: [10GB/s]
stages: [2, 4]
microbatches: [2, 4, 8]
schedule: [gpipe, 1f1b, 2bw]
"""
NUM_POINTS = 18


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    return path


@pytest.fixture
def reference(spec: Path, tmp_path: Path) -> bytes:
    out = tmp_path / "reference" / "results.parquet"
    run_sweep(spec, out, workers=1, in_process=True)
    return out.read_bytes()


def interrupted(spec: Path, out: Path, after: int = 8) -> list[Path]:
    """Run the sweep in this process, two points a chunk, and stop it (as Ctrl-C would) once
    ``after`` points are on disk; return the chunks it left."""
    def stop(done: int, total: int, where: str = "", work: float | None = None) -> None:
        if done >= after:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, out, workers=1, in_process=True, batch_size=2, progress=stop)
    chunks = sorted(Path(f"{out}.parts").glob("chunk-*.parquet"))
    assert len(chunks) >= 3
    return chunks


def rewrite(chunk: Path, change: Callable[[pd.DataFrame], pd.DataFrame]) -> None:
    pq.write_table(pa.Table.from_pandas(change(pd.read_parquet(chunk)), preserve_index=False), chunk)


DAMAGES: dict[str, Callable[[Path], None]] = {
    "truncated": lambda chunk: chunk.write_bytes(chunk.read_bytes()[: chunk.stat().st_size // 2]),
    "empty": lambda chunk: chunk.write_bytes(b""),
    "garbage": lambda chunk: chunk.write_bytes(os.urandom(600)),
    "metric column of text": lambda chunk: rewrite(chunk, lambda frame: frame.assign(
        iteration_time_s=frame["iteration_time_s"].astype(str))),
    "missing column": lambda chunk: rewrite(chunk, lambda frame: frame.drop(columns=["bubble_fraction"])),
    "point out of range": lambda chunk: rewrite(chunk, lambda frame: frame.assign(point=frame["point"] + 1000)),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_resume_names_a_damaged_chunk_and_computes_just_its_points_again(
    spec: Path, reference: bytes, tmp_path: Path, damage: str
) -> None:
    out = tmp_path / "results.parquet"
    chunks = interrupted(spec, out)
    damaged = chunks[1]
    kept = sum(len(pq.read_table(chunk).column("point")) for chunk in chunks if chunk != damaged)
    DAMAGES[damage](damaged)
    warnings: list[str] = []
    summary = run_sweep(spec, out, workers=1, in_process=True, resume=True, warn=warnings.append)
    assert len(warnings) == 1 and warnings[0].startswith(f"{damaged}: ") and "its points run again" in warnings[0]
    assert summary.dropped == (warnings[0].removesuffix("; removed, its points run again"),)
    assert (summary.num_resumed, summary.num_run) == (kept, NUM_POINTS - kept)
    assert out.read_bytes() == reference and not Path(f"{out}.parts").exists()


def test_a_repeated_chunk_is_dropped_and_the_table_has_each_point_once(
    spec: Path, reference: bytes, tmp_path: Path
) -> None:
    out = tmp_path / "results.parquet"
    chunks = interrupted(spec, out)
    kept = sum(len(pq.read_table(chunk).column("point")) for chunk in chunks)
    copy = chunks[0].with_name("chunk-99999998-99999999.parquet")
    shutil.copy(chunks[0], copy)
    warnings: list[str] = []
    summary = run_sweep(spec, out, workers=1, in_process=True, resume=True, warn=warnings.append)
    assert len(warnings) == 1 and warnings[0].startswith(f"{copy}: repeats point ")
    assert summary.num_resumed == kept
    assert out.read_bytes() == reference


def test_a_manifest_that_is_not_an_object_is_one_line_naming_it(spec: Path, tmp_path: Path) -> None:
    out = tmp_path / "results.parquet"
    interrupted(spec, out)
    manifest = Path(f"{out}.parts") / "manifest.json"
    manifest.write_text("[]\n")
    done = subprocess.run([sys.executable, "-m", "pipesim", "sweep", str(spec), "--out", str(out), "--resume"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2 and done.stderr == (
        f"pipesim: error: {manifest}: manifest='list': must be a JSON object naming the sweep's digest; delete "
        f"{manifest.parent} to start over\n")


def test_the_cli_warns_of_a_dropped_chunk_and_completes(spec: Path, reference: bytes, tmp_path: Path) -> None:
    out = tmp_path / "results.parquet"
    chunks = interrupted(spec, out)
    chunks[0].write_bytes(b"")
    done = subprocess.run([sys.executable, "-m", "pipesim", "sweep", str(spec), "--out", str(out), "--resume",
                           "--workers", "1"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith(f"pipesim: warning: {chunks[0]}: is not a readable Parquet file (")
    assert done.stderr.rstrip().endswith("; removed, its points run again")
    assert out.read_bytes() == reference


def test_a_second_sweep_onto_the_same_out_is_refused_naming_the_first(tmp_path: Path) -> None:
    """Sweep A runs in its own process; B, started once A has made its parts folder, stops at once
    with one line naming A's pid; A finishes with the whole table, as if B had never run."""
    spec = tmp_path / "big.yaml"
    spec.write_text(HEAVY_SPEC)
    out, parts = tmp_path / "results.csv", tmp_path / "results.csv.parts"
    command = [sys.executable, "-m", "pipesim", "sweep", str(spec), "--out", str(out), "--workers", "1",
               "--batch-size", "1"]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while not (parts / "manifest.json").exists() and time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.05)
        assert first.poll() is None, "the first sweep ended before the second could start: make it longer"
        second = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=120)
        still_running = first.poll() is None
        stdout, stderr = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
    assert still_running, "the second sweep took as long as the first: it did not stop at the lock"
    assert second.returncode == 2 and second.stderr == (
        f"pipesim: error: out='{out}': another sweep (pid {first.pid}) is writing it and {parts}; wait for it to "
        "end, or choose another --out\n")
    assert first.returncode == 0, stderr
    assert "144 points (144 simulated, 0 resumed)" in stdout
    expected = tmp_path / "expected.csv"
    run_sweep(spec, expected, workers=1, in_process=True)
    assert out.read_bytes() == expected.read_bytes() and not parts.exists()


def test_the_lock_is_released_when_a_sweep_fails_or_is_interrupted(spec: Path, tmp_path: Path) -> None:
    out = tmp_path / "results.parquet"
    interrupted(spec, out)
    with pytest.raises(ConfigError, match="pass --resume"):  # refused: it must not keep the lock either
        run_sweep(spec, out, workers=1, in_process=True)
    summary = run_sweep(spec, out, workers=1, in_process=True, resume=True)
    assert summary.num_resumed >= 6 and summary.num_resumed + summary.num_run == NUM_POINTS


def test_parts_linked_to_scratch_space_take_the_chunks_and_stay(spec: Path, reference: bytes, tmp_path: Path) -> None:
    """OUT.parts as a symbolic link to a scratch folder: the chunks go there; at the end pipesim removes
    what it wrote there and leaves the link, the folder and whatever else the folder holds."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "notes.txt").write_text("mine\n")
    out = tmp_path / "results.parquet"
    parts = Path(f"{out}.parts")
    parts.symlink_to(scratch, target_is_directory=True)
    chunks = interrupted(spec, out)
    assert all(chunk.resolve().parent == scratch for chunk in chunks)
    summary = run_sweep(spec, out, workers=1, in_process=True, resume=True)
    assert summary.num_resumed + summary.num_run == NUM_POINTS and out.read_bytes() == reference
    assert parts.is_symlink() and sorted(path.name for path in scratch.iterdir()) == ["notes.txt"]
    again = run_sweep(spec, out, workers=1, in_process=True, resume=True)
    assert (again.num_run, again.num_resumed) == (0, NUM_POINTS), "a finished table was simulated again"
