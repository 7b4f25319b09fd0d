"""Memory in proportion to the run, or a limit checked up front (issue 37, item 9).

A gpipe run of 20,000 stages and one microbatch (40,000 ops) once built ranks x ranks tables
(6.4 GB); PipeDream's partitioner on 512 devices and 2,700 layers keeps about 19 GB of tables;
a sweep point that runs out of memory ended the whole sweep. Each runs here through the CLI under
an address-space limit (RLIMIT_AS), so a regression fails fast instead of taking the machine.
"""

from __future__ import annotations

import csv
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipesim import build_schedule
from pipesim.schedule.columns import send_links

ROOT = Path(__file__).resolve().parents[1]


def pipesim(*args: str, limit_gib: float) -> subprocess.CompletedProcess[str]:
    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (int(limit_gib * 2**30), int(limit_gib * 2**30)))

    return subprocess.run([sys.executable, "-m", "pipesim", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600, preexec_fn=limited)


def test_twenty_thousand_stages_simulate_in_memory_of_their_ops() -> None:
    done = pipesim("simulate", "--uniform", "layers=20000,forward_ms=1,backward_ms=1,activation_bytes=1000,"
                   "param_bytes=1000", "--stages", "20000", "--microbatches", "1", "--schedule", "gpipe",
                   "--bandwidth", "10GB/s", "--json", limit_gib=2.5)
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"num_ops": 60000' in done.stdout


@pytest.mark.parametrize(("name", "p", "m", "ranks"), [("1f1b", 5, 4, None), ("interleaved-1f1b", 8, 4, 4),
                                                       ("zbv", 8, 8, 4), ("dualpipev", 6, 6, 3)])
def test_send_links_number_the_rank_pairs_in_order(name: str, p: int, m: int, ranks: int | None) -> None:
    """The oracle: every directed (sending rank, receiving rank) pair a remote link crosses, sorted,
    numbered from 0; each remote link carries its pair's number, every other link -1."""
    schedule = build_schedule(name, p, m, **({"num_ranks": ranks} if ranks else {}))
    links = send_links(schedule)
    senders = np.asarray(schedule.stage_to_rank)[links.stage]
    pairs = sorted({(int(a), int(b)) for a, b, remote in zip(senders, links.rank, links.is_remote) if remote})
    expected = [pairs.index((int(a), int(b))) if remote else -1
                for a, b, remote in zip(senders, links.rank, links.is_remote)]
    assert links.pair.tolist() == expected
    assert len(pairs) >= 2


def test_a_partitioner_past_its_memory_limit_is_refused_up_front(tmp_path: Path) -> None:
    from pipesim import uniform_profile
    from pipesim.spec.files import save_model

    save_model(uniform_profile(num_layers=2700, forward_s=1e-3, backward_s=2e-3, activation_bytes=1e6,
                               param_bytes=4e6), tmp_path / "chain.json")
    done = pipesim("plan", "--profile", str(tmp_path / "chain.json"), "--devices", "512", "--bandwidth", "10GB/s",
                   limit_gib=3)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr[-2000:]
    assert done.stderr.startswith("pipesim: error: devices=512: with 2,700 layers the partitioner's tables would "
                                  "need about 19.2 GiB, more than its limit of 4 GiB")


def test_a_sweep_point_out_of_memory_is_an_error_row_and_the_others_run(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("profile: {uniform: {layers: 16, forward_ms: 1.0, backward_ms: 1.0, activation_bytes: 1000, "
                    "param_bytes: 1000}}\nstages: [8]\nmicrobatches: [4, 400000]\nschedule: [gpipe]\n"
                    "bandwidth: [10GB/s]\n")
    out = tmp_path / "t.csv"
    done = pipesim("sweep", str(spec), "--out", str(out), "--workers", "1", limit_gib=1.5)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = list(csv.DictReader(out.open()))
    assert [row["num_microbatches"] for row in rows] == ["4", "400000"]
    assert rows[0]["error"] == "" and float(rows[0]["iteration_time_s"]) > 0
    assert rows[1]["error"].startswith("out of memory: ") and rows[1]["iteration_time_s"] == "nan"
