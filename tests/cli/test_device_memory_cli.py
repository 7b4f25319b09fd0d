"""Device memory is the headline (issue 18 item 1) and the memory verdict travels into metrics.json
and the HTML report (issue 19 item 4), through the real entry point."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.cli_runner import pipesim

# Issue 18's example: 16 layers of 100 MB activations and 100 MB weights cut into 8 stages, two on
# each of 4 ranks, interleaved 1F1B with 8 microbatches.
EXAMPLE = ("--uniform", "layers=16,forward_ms=1,backward_ms=2,activation_bytes=100000000,param_bytes=100000000",
           "--ranks", "4", "--stages-per-rank", "2", "--microbatches", "8", "--schedule", "interleaved-1f1b")


def simulate_json(*args: str) -> dict[str, object]:
    done = pipesim("simulate", *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_the_headline_and_the_budget_read_the_largest_device_not_the_largest_stage(tmp_path: Path) -> None:
    # Device 0 holds stages 0 and 4: weights, gradients and optimizer state of 4 layers (3 x 400 MB)
    # plus, at its peak, 22 layers' worth of stashed activations (2.2 GB): 3.40 GB; stage 0 alone
    # peaks at 2.20 GB, the largest single stage. Every stage fits in 3 GB; device 0 does not.
    data = simulate_json(*EXAMPLE, "--memory", "3GB")
    assert data["peak_memory_bytes"] == 3.4e9
    assert data["device_peak_memory_bytes"] == [3.4e9, 3.0e9, 2.6e9, 2.2e9]
    stages = data["stages"]
    assert max(stage["peak_memory_bytes"] for stage in stages) == 2.2e9  # type: ignore[attr-defined]
    breakdown = data["device_peak_breakdown_bytes"][0]  # type: ignore[index]
    assert breakdown == {"weights": 4e8, "gradients": 4e8, "optimizer": 4e8, "activations": 2.2e9, "working": 0.0}
    assert data["fits"] is False
    assert data["device_memory_headroom_bytes"] == [-4e8, 0.0, 4e8, 8e8]

    out = tmp_path / "run"
    table = pipesim("simulate", *EXAMPLE, "--memory", "3GB", "--out", str(out))
    assert table.returncode == 0, table.stderr
    headline = table.stdout.splitlines()[1]
    assert headline.endswith("peak memory 3.40 GB (device 0)")
    # The per-device section lists each device's stages, summed peak and headroom; the per-stage one stays.
    rows = [line.split() for line in table.stdout.splitlines() if line.split()[:2] == ["0", "│"]]
    assert rows[0][:8:2] == ["0", "0,4", "84.2%", "3.40"] and rows[0][-2:] == ["-400.00", "MB"]
    assert rows[1][:14:2] == ["0", "0", "0:2", "84.2%", "15.8%", "0.000", "2.20"]
    assert "does NOT fit in 3GB per device (worst overshoot 0.40 GB, device 0)" in table.stdout
    saved = json.loads((out / "metrics.json").read_text())
    assert (saved["fits"], saved["memory_budget_bytes"]) == (False, 3e9)
    assert saved["device_memory_headroom_bytes"] == data["device_memory_headroom_bytes"]

    # The report states the saved verdict first; a budget given to it wins over the saved one.
    report = tmp_path / "report.html"
    assert pipesim("report", str(out), "--out", str(report)).returncode == 0
    text = report.read_text()
    verdict = "does NOT fit in 3GB per device (worst overshoot 0.40 GB, device 0)"
    assert f'<p class="verdict"><strong>{verdict}</strong></p>' in text
    assert "does NOT fit in 3GB</h1>" in text
    assert text.index(verdict) < text.index("<h2>Summary</h2>") and "<h2>Per device</h2>" in text
    looser = tmp_path / "looser.html"
    assert pipesim("report", str(out), "--out", str(looser), "--memory", "3.5GB").returncode == 0
    assert "fits in 3.5GB per device (least headroom 0.10 GB, device 0)" in looser.read_text()


def test_report_memory_on_a_sweep_table_is_one_line_and_exit_2(tmp_path: Path) -> None:
    table = tmp_path / "sweep.csv"
    table.write_text("point,schedule\n0,1f1b\n")
    done = pipesim("report", str(table), "--out", str(tmp_path / "r.html"), "--memory", "80GB")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "memory" in done.stderr
    assert not (tmp_path / "r.html").exists()
