"""Device files: every shipped number has a source, bad files are one line, the fit reproduces the shipped H200."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipesim.errors import ConfigError
from pipesim.spec.calibration import fit_collectives, fit_device
from pipesim.spec.cluster import load_cluster
from pipesim.spec.device import Device, load_device, shipped_devices
from pipesim.spec.files import load_device_file

ROOT = Path(__file__).resolve().parents[2]
SOURCED = ("memory_bytes", "peak_flops", "vector_flops", "memory_bandwidth_bytes_per_s", "num_sms", "launch_s",
           "sustained_share", "matmul", "memory", "attention")


@pytest.mark.parametrize("name", shipped_devices())
def test_every_shipped_device_number_names_its_source(name: str) -> None:
    device = load_device(name)
    assert set(SOURCED) <= set(device.sources), set(SOURCED) - set(device.sources)
    assert all(source.strip() for source in device.sources.values())
    assert device.default_cluster is not None


def test_the_shipped_devices_are_the_ones_the_issue_names() -> None:
    assert set(shipped_devices()) >= {"v100", "a100-40gb", "a100-80gb", "h100", "h200"}
    assert "fp8" in load_device("h100").peak_flops and "fp8" not in load_device("a100-80gb").peak_flops
    # Memory as the driver reports it: an H100 80GB shows 81,559 MiB.
    assert load_device("h100").memory_bytes == 81559 * 2**20


def test_a_bad_device_file_is_one_line_naming_the_field(tmp_path: Path) -> None:
    data = json.loads((ROOT / "pipesim" / "data" / "devices" / "h100.json").read_text())
    for field, value, message in (("peak_flops", {"bf17": 1e15}, "peak_flops.bf17"),
                                  ("num_sms", 0, "num_sms"),
                                  ("memory", {"max_efficiency": 0.9, "half_bytes": 0,
                                              "kind_efficiency": {"norm": 1.5}}, "kind_efficiency.norm")):
        path = tmp_path / "device.json"
        path.write_text(json.dumps({**data, field: value}))
        with pytest.raises(ConfigError, match=message):
            load_device_file(path=path)
    with pytest.raises(ConfigError, match="device"):
        load_device("no-such-gpu")


def test_a_precision_the_card_lacks_is_refused() -> None:
    with pytest.raises(ConfigError, match="precision='fp8'"):
        load_device("a100-80gb").peak("fp8")


def test_fitting_the_shipped_measurements_gives_the_shipped_h200_curves() -> None:
    """The H200 file was fitted from the raw measurements kept in benchmarks/data: refitting them
    (what ``pipesim device calibrate --measurements`` does, no GPU) gives the same curves."""
    shipped = load_device("h200")
    raw = json.loads((ROOT / shipped.measured["raw"]).read_text())  # type: ignore[index]
    fitted, errors = fit_device(raw, shipped)
    assert fitted.matmul == shipped.matmul
    assert fitted.attention == shipped.attention
    assert fitted.launch_s == shipped.launch_s and fitted.sustained_share == shipped.sustained_share
    assert fitted.memory.max_efficiency == shipped.memory.max_efficiency
    assert errors["matmul"] < 0.12 and errors["attention"] < 0.08


def test_the_sustained_share_puts_the_repeated_product_at_its_measured_hot_rate() -> None:
    """The hot rate of the 8192-cubed loop over the fitted curve's rate for it (0.953), not over the
    loop's first burst (0.832): the sweep the curve is fitted to ran partly warm, so the burst ratio
    counted the fall in clocks twice and put that product 13% under the rate it held for seconds."""
    shipped = load_device("h200")
    raw = json.loads((ROOT / shipped.measured["raw"]).read_text())  # type: ignore[index]
    hot, size = raw["sustained"], raw["sustained"]["m"]
    predicted = 2.0 * size**3 / shipped.matmul_s(size, size, size, precision="bf16")
    assert predicted == pytest.approx(hot["sustained_flops_per_s"], rel=1e-3)
    assert shipped.sustained_share > hot["sustained_flops_per_s"] / hot["burst_flops_per_s"] + 0.1
    assert load_device("h100").sustained_share == shipped.sustained_share  # the same die, the H200's figure


def test_the_fitted_curve_predicts_the_measured_products_within_ten_percent_at_the_median() -> None:
    shipped = load_device("h200")
    raw = json.loads((ROOT / shipped.measured["raw"]).read_text())  # type: ignore[index]
    burst = shipped.model_copy(update={"sustained_share": 1.0})  # the sweep ran in bursts
    ratios = sorted(burst.matmul_s(row["m"], row["n"], row["k"], precision="bf16") / row["seconds"]
                    for row in raw["gemm"] if row["seconds"] >= 40e-6)
    assert abs(ratios[len(ratios) // 2] - 1) < 0.03
    assert 0.85 < ratios[len(ratios) // 10] and ratios[9 * len(ratios) // 10] < 1.15


def test_device_is_a_frozen_model() -> None:
    assert isinstance(load_device("v100"), Device) and load_device("v100").default_precision == "fp16"


def collective_measurements(n: int, latency: float, bus: float) -> dict[str, Any]:
    """What ``linkbench.measure_collectives`` writes, timed exactly by pipesim's ring formulas."""
    sizes = [4 * n * 4**power for power in range(2, 12)]
    rows = {name: [{"bytes": size, "seconds": hops * (n - 1) * latency + hops * (n - 1) / n * size / bus}
                   for size in sizes] for name, hops in (("all_reduce", 2), ("reduce_scatter", 1), ("all_gather", 1))}
    return {"schema": "pipesim.collective-measurements/1", "backend": "nccl", "world_size": n,
            "machine": {"date": "2026-11-28", "host": "test", "gpu": "toy"}, **rows}


def test_fitting_collectives_recovers_the_in_node_tiers_latency_and_bus_rate() -> None:
    # Four GPUs of a dgx-h100 node, each all-reduce 2 (n-1) a + 2 (n-1)/n S / B and each reduce-scatter and
    # all-gather (n-1) a + (n-1)/n S / B with a = 3 us and B = 360 GB/s: the fit gives back a and B, B as the
    # NVLink tier's 450 GB/s x 0.8; the NIC tier is the base's.
    base = load_cluster("dgx-h100")
    fitted, error = fit_collectives(collective_measurements(4, 3e-6, 360e9), base)
    nvlink = fitted.tiers[0]
    assert nvlink.latency_s == pytest.approx(3e-6, rel=1e-6)
    assert nvlink.bandwidth_bytes_per_s == base.tiers[0].bandwidth_bytes_per_s
    assert nvlink.bus_efficiency == pytest.approx(0.8, rel=1e-6) and error < 1e-9
    assert fitted.tiers[1] == base.tiers[1]
    assert "measured" in fitted.sources["tiers[0].bus_efficiency"]
    # A bus faster than the datasheet's link (in-switch reduction) raises the link's rate, efficiency 1.
    faster = fit_collectives(collective_measurements(4, 3e-6, 600e9), base)[0].tiers[0]
    assert (faster.bandwidth_bytes_per_s, faster.bus_efficiency) == (pytest.approx(600e9, rel=1e-6), 1.0)


def test_collectives_over_more_gpus_than_a_node_or_of_another_schema_are_refused() -> None:
    with pytest.raises(ConfigError, match="world_size=16"):
        fit_collectives(collective_measurements(16, 3e-6, 360e9), load_cluster("dgx-h100"))
    with pytest.raises(ConfigError, match="collectives"):
        fit_collectives({"schema": "other"}, load_cluster("dgx-h100"))
