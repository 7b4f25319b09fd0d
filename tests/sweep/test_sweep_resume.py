"""--resume on a finished table (CSV or Parquet) does no work and leaves the file byte for byte."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipesim.sweep import read_table, run_sweep
from pipesim.sweep.store import csv_digest_path, finished_digest

SPEC = """\
profile: {uniform: {layers: 8, forward_ms: 1.0, backward_ms: 2.0, activation_bytes: 1000000, param_bytes: 4000000}}
bandwidth: [10GB/s]
stages: [2, 4]
microbatches: [4, 8]
schedule: [1f1b, 2bw]
"""
NUM_POINTS = 8


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_resuming_a_finished_sweep_does_nothing(tmp_path: Path, suffix: str) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    out = tmp_path / f"results{suffix}"
    first = run_sweep(spec, out, workers=1)
    assert first.num_run == NUM_POINTS
    written, stamp = out.read_bytes(), out.stat().st_mtime_ns
    os.utime(out, ns=(stamp - 10**9, stamp - 10**9))  # any rewrite would move the time forward again
    again = run_sweep(spec, out, workers=1, resume=True)
    assert (again.num_run, again.num_resumed, again.num_batches) == (0, NUM_POINTS, 0)
    assert out.read_bytes() == written and out.stat().st_mtime_ns == stamp - 10**9
    assert not Path(f"{out}.parts").exists()
    assert len(read_table(out)) == NUM_POINTS


def test_a_finished_csv_edited_afterwards_is_simulated_again(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    out = tmp_path / "results.csv"
    run_sweep(spec, out, workers=1)
    assert csv_digest_path(out).is_file() and finished_digest(out) is not None
    written = out.read_bytes()
    out.write_bytes(written.replace(b"\n", b"\r\n", 1))  # the digest names other bytes now
    assert finished_digest(out) is None
    again = run_sweep(spec, out, workers=1, resume=True)
    assert again.num_run == NUM_POINTS and out.read_bytes() == written


@pytest.mark.parametrize("resume", [False, True])
def test_a_parts_folder_without_finished_chunks_is_started_over(tmp_path: Path, resume: bool) -> None:
    """What a sweep that failed before its first chunk leaves: the manifest (of any spec) and maybe a
    temporary file; nothing to keep, so the next run starts over instead of asking for --resume."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    out = tmp_path / "results.parquet"
    parts = Path(f"{out}.parts")
    parts.mkdir()
    (parts / "manifest.json").write_text('{"schema": "pipesim.sweep-parts/1", "digest": "other", "num_points": 3}')
    (parts / ".chunk-00000000-00000003.parquet.tmp").write_bytes(b"half")
    summary = run_sweep(spec, out, workers=1, resume=resume)
    assert (summary.num_run, summary.num_resumed) == (NUM_POINTS, 0)
    assert len(read_table(out)) == NUM_POINTS and not parts.exists()
