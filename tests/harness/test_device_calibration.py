"""pipesim device calibrate's measurement path: on the CPU its numbers describe nothing, but every
measurement runs and the fit takes what it writes; on a CUDA GPU the command writes a device file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pipesim.harness.linkbench import measure_collectives  # noqa: E402
from pipesim.harness.rank.device_calibration import measure_device  # noqa: E402
from pipesim.spec.calibration import fit_collectives, fit_device  # noqa: E402
from pipesim.spec.cluster import load_cluster  # noqa: E402
from pipesim.spec.device import load_device  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_every_measurement_runs_on_the_cpu_and_the_fit_reads_it() -> None:
    measured = measure_device(device="cpu", quick=True, sustained_s=0.2, progress=lambda text: None)
    assert measured["schema"] == "pipesim.device-measurements/1" and measured["machine"]["device_type"] == "cpu"
    assert {"launch", "copy", "gemm", "attention", "elementwise", "sustained"} <= set(measured)
    assert all(row["seconds"] > 0 for row in measured["gemm"] + measured["copy"])
    assert all(row["forward_seconds"] > 0 for row in measured["attention"])
    device, errors = fit_device(json.loads(json.dumps(measured)), load_device("h200"), name="cpu-smoke")
    assert device.name == "cpu-smoke" and device.measured is not None and set(errors) == {"matmul", "attention"}
    assert device.peak_flops == load_device("h200").peak_flops  # the datasheet part is the base's


def test_collectives_run_across_two_cpu_ranks_and_the_fit_reads_them() -> None:
    # gloo on loopback: real torch.distributed ranks; the times describe this host, not a GPU's links.
    measured = measure_collectives(2, max_bytes=1 << 20, repeats=2, warmup=1, backend="gloo")
    assert measured["schema"] == "pipesim.collective-measurements/1" and measured["world_size"] == 2
    for name in ("all_reduce", "reduce_scatter", "all_gather"):
        rows = measured[name]
        assert [row["bytes"] for row in rows] == sorted(row["bytes"] for row in rows) and len(rows) >= 4
        assert all(row["seconds"] > 0 and row["bytes"] % 8 == 0 for row in rows)
    cluster, error = fit_collectives(json.loads(json.dumps(measured)), load_cluster("dgx-h100"))
    assert cluster.tiers[0].latency_s >= 0 and 0 < cluster.tiers[0].bus_efficiency <= 1 and error >= 0
    assert cluster.tiers[1:] == load_cluster("dgx-h100").tiers[1:]


def test_calibrate_without_a_gpu_is_one_line_naming_the_way_out(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: the command would measure it")
    done = subprocess.run([sys.executable, "-m", "pipesim", "device", "calibrate", "--out", str(tmp_path / "d.json")],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2 and "--measurements" in done.stderr and len(done.stderr.splitlines()) == 1
    assert not (tmp_path / "d.json").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_calibrate_on_a_gpu_writes_a_device_file(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    done = subprocess.run([sys.executable, "-m", "pipesim", "device", "calibrate", "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr
    assert load_device(str(out)).measured is not None


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two or more CUDA GPUs (NCCL collectives)")
def test_calibrate_on_several_gpus_writes_a_cluster_file(tmp_path: Path) -> None:
    out, node = tmp_path / "gpu.json", tmp_path / "node.json"
    done = subprocess.run([sys.executable, "-m", "pipesim", "device", "calibrate", "--out", str(out),
                           "--cluster-out", str(node)], capture_output=True, text=True, cwd=ROOT, timeout=1200)
    assert done.returncode == 0, done.stderr
    measured = load_cluster(str(node)).tiers[0]
    assert measured.latency_s >= 0 and 0 < measured.bus_efficiency <= 1
