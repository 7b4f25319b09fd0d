"""The capacity study's headline numbers (tokens/s, MFU, the memory verdict and headroom) against
arithmetic written out in the test, through the real entry point, with a microbatch size above 1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Llama 3 8B (Llama 3 Herd of Models, Table 3): 32 layers, hidden 4096, FFN 14336 (gated: three
# matrices), 32 heads of 128, 8 KV heads (K and V are 8 x 128 = 1024 wide), vocabulary 128256.
LAYERS, HIDDEN, FFN, KV, VOCAB = 32, 4096, 14336, 1024, 128256
H100_PEAK_FLOPS = 989.4e12  # H100 SXM, dense BF16: half the datasheet's 1,978.9 TFLOP/s with sparsity


def simulate_json(*args: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-m", "pipesim", "simulate", *args, "--json"], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    data: dict[str, object] = json.loads(done.stdout)
    return data


def llama3_8b_forward_flops_per_token(seq_len: int) -> float:
    """Narayanan et al.'s count: 2 FLOPs per weight of the layers' matrices, 2 x 2 s h for the
    attention scores and their product with V (no saving for the causal mask), 2 h V for the logits."""
    weights = HIDDEN * (HIDDEN + 2 * KV) + HIDDEN * HIDDEN + 3 * HIDDEN * FFN  # QKV, output, gated MLP
    return LAYERS * (2 * weights + 4 * seq_len * HIDDEN) + 2 * HIDDEN * VOCAB


def test_tokens_per_second_and_mfu_equal_hand_arithmetic() -> None:
    # Global batch 32 = M x b x D = 8 microbatches of 2 samples on each of 2 pipelines of 4 stages.
    data = simulate_json("--model", "llama3-8b", "--device", "h100", "--stages", "4", "--global-batch", "32",
                         "--microbatch-size", "2", "--dp", "2", "--seq-len", "2048", "--schedule", "1f1b")
    seconds = data["iteration_time_s"]
    assert isinstance(seconds, float) and seconds > 0
    assert data["num_microbatches"] == 8 and data["num_gpus"] == 4 * 1 * 2
    # Every step trains 32 samples of 2048 tokens, in one iteration time.
    assert data["throughput_samples_per_s"] == pytest.approx(8 * 2 / seconds, rel=1e-12)
    assert data["global_throughput_samples_per_s"] == pytest.approx(32 / seconds, rel=1e-12)
    tokens_per_s = 32 * 2048 / seconds
    assert data["tokens_per_s"] == pytest.approx(tokens_per_s, rel=1e-12)
    # MFU: 3 x forward FLOPs per token (forward, and a backward of twice its work) over 8 GPUs' peak.
    flops = llama3_8b_forward_flops_per_token(2048)
    # 32 x (2 x 218,103,808 weights + 33,554,432 for attention) + 1,050,673,152 for the logits
    assert flops == 16_083_058_688
    assert data["mfu"] == pytest.approx(3 * flops * tokens_per_s / (8 * H100_PEAK_FLOPS), rel=1e-12)


UNIFORM = ("--uniform", "layers=4,forward_ms=4,backward_ms=8,activation_bytes=9e8,param_bytes=1e9", "--stages", "2",
           "--partition", "0:1,1:4", "--microbatches", "4", "--schedule", "gpipe")


def test_memory_verdict_and_headroom_equal_hand_arithmetic() -> None:
    # GPipe holds all 4 microbatches' stashes at its peak (each layer stashes its 9e8-byte output),
    # beside weights, one gradient buffer and optimizer state of 1 x the weights (the default).
    # Stage 0 (layer 0):     3 x 1e9 + 4 x 9e8     =  6.6e9 bytes.
    # Stage 1 (layers 1-3):  3 x 3e9 + 4 x 2.7e9   = 19.8e9 bytes.
    peaks = [6.6e9, 19.8e9]
    loose = simulate_json(*UNIFORM, "--memory", "20GB")
    assert loose["device_peak_memory_bytes"] == peaks
    assert loose["memory_budget_bytes"] == 20e9
    assert loose["device_memory_headroom_bytes"] == [13.4e9, 0.2e9]
    assert loose["fits"] is True
    # A budget of exactly the larger peak still fits (headroom 0); 10 GB leaves stage 1 short by 9.8 GB.
    exact = simulate_json(*UNIFORM, "--memory", "19.8GB")
    assert exact["device_memory_headroom_bytes"] == [13.2e9, 0.0] and exact["fits"] is True
    tight = simulate_json(*UNIFORM, "--memory", "10GB")
    assert tight["device_memory_headroom_bytes"] == [3.4e9, -9.8e9] and tight["fits"] is False
    # ZeRO-1 over 2 pipelines halves the optimizer state: stage 1 needs 3e9 x 2.5 + 10.8e9 = 18.3e9.
    sharded = simulate_json(*UNIFORM, "--memory", "19.8GB", "--dp", "2", "--zero", "1")
    assert sharded["device_peak_memory_bytes"] == [1e9 * 2.5 + 3.6e9, 3e9 * 2.5 + 10.8e9]
    assert sharded["device_memory_headroom_bytes"] == [19.8e9 - 6.1e9, 19.8e9 - 18.3e9]


# The shipped dgx-h100 cluster: a 400 Gbit/s NDR NIC per GPU (50 GB/s, 0.92 of it reached, 5 us a hop)
# and NVLink 4 at 450 GB/s a direction (0.8 of it, 1 us).
@pytest.mark.parametrize(("placement", "bandwidth_bytes_per_s", "latency_s"),
                         [("tp-in-node", 400e9 / 8 * 0.92, 5e-6), ("pp-in-node", 450e9 * 0.8, 1e-6)])
def test_a_pipeline_hop_crosses_the_link_its_placement_puts_it_on(tmp_path: Path, placement: str,
                                                                   bandwidth_bytes_per_s: float, latency_s: float) -> None:
    # A stage of Llama 3 8B hands on one microbatch's hidden states: b s h values of 2 bytes,
    # 1 x 2048 x 4096 x 2 = 16,777,216 bytes. With 8 data-parallel pipelines, Megatron's placement
    # (tp-in-node) numbers the DP ranks first, so pipeline neighbours sit 8 GPUs apart, on other
    # nodes, over the NIC; pp-in-node keeps them on NVLink. A send lasts its link's latency and its
    # bytes over the link's rate.
    from pipesim.engine.trace import Trace

    simulate_json("--model", "llama3-8b", "--device", "h100", "--stages", "2", "--dp", "8", "--global-batch", "8",
                  "--seq-len", "2048", "--schedule", "1f1b", "--placement", placement, "--out", str(tmp_path))
    trace = Trace.from_json((tmp_path / "trace.json").read_text(encoding="utf-8"))
    sends = [span for span in trace.iter_spans() if span.stream == "send"]
    assert [span.op for span in sends] == ["0F0", "1B0"]
    for span in sends:
        assert span.end_s - span.start_s == pytest.approx(latency_s + 2048 * 4096 * 2 / bandwidth_bytes_per_s,
                                                          rel=1e-9)


def test_searchs_memory_lower_bound_is_what_every_stage_must_hold_and_no_more() -> None:
    # search prunes a candidate without simulating it when this bound already exceeds the budget,
    # so it must never exceed the simulated peak. Two stages of layers with 1e9 weight bytes and
    # 2e8 stash bytes each, Adam's state (multiplier 2): a stage holds at least its weights,
    # gradients and optimizer state, 1e9 x (1 + 1 + 2) per layer, and its in-flight stashes.
    from pipesim import Topology, simulate, uniform_profile
    from pipesim.plan.search_bounds import InFlight, peak_lower_bound
    from pipesim.spec.stages import stage_costs

    profile = uniform_profile(num_layers=3, forward_s=1e-3, backward_s=2e-3, activation_bytes=2e8,
                              param_bytes=1e9)
    partition = ((0, 1), (1, 3))
    topology = Topology.uniform(num_devices=2)
    for schedule in ("1f1b", "gpipe"):
        for microbatches in (1, 4):
            result = simulate(profile, topology, schedule=schedule, num_stages=2, num_microbatches=microbatches,
                              partition=partition, optimizer_state_multiplier=2.0)
            costs = stage_costs(profile, result.plan, topology)
            bound = peak_lower_bound(costs, InFlight.of(result.schedule), 2.0)
            if microbatches == 1:
                assert bound == 2 * (4 * 1e9 + 2e8)
            assert bound == result.metrics.peak_memory_bytes  # a fused backward: the bound is the peak itself


def test_search_calls_a_candidate_whose_peak_is_exactly_the_budget_one_that_fits() -> None:
    from pipesim.search import Candidate, Outcome, search

    def outcome_of(memory_bytes: float | None, wanted: Candidate | None = None) -> Outcome:
        found = search("llama3-8b", device="h100", num_gpus=4, global_batch=8, seq_len=1024, memory_bytes=memory_bytes)
        return found[0] if wanted is None else next(o for o in found if o.candidate == wanted)

    best = outcome_of(None)
    assert best.status == "simulated" and best.fits
    at_budget = outcome_of(best.peak_memory_bytes, best.candidate)
    assert (at_budget.fits, at_budget.reason) == (True, "fits")
    assert outcome_of(best.peak_memory_bytes - 1.0, best.candidate).fits is False
