"""The configuration search's pruning (issue 33): on small generated spaces the pruned search
returns exactly the exhaustive search's top 5, and every bound it prunes by is at most what
simulation gives."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesim.plan.search_space import SPLIT_BACKWARD, Candidate, enumerate_candidates
from pipesim.search import _GroupRunner, _Setting, search, search_counts
from pipesim.spec.device import load_device
from pipesim.spec.transformer import TransformerConfig, forward_flops_per_token
from pipesim.spec.transformer_profile import default_cluster


def tiny(layers: int, *, moe: bool, tied: bool, kv_heads: int) -> TransformerConfig:
    """A small Llama-shaped model (a mixture of experts past its first layer when ``moe``)."""
    experts: dict[str, Any] = {"num_experts": 4, "num_experts_per_token": 2, "num_dense_layers": 1} if moe else {}
    return TransformerConfig(name="tiny", num_layers=layers, hidden_size=512, ffn_hidden_size=1536, num_heads=8,
                             num_kv_heads=kv_heads, vocab_size=8000, seq_len=2048, is_gated_ffn=True, norm="rmsnorm",
                             has_dropout=False, has_rotary=True, ffn_activation="swiglu", has_tied_embeddings=tied,
                             **experts)


SPACES = st.fixed_dictionaries({
    "layers": st.sampled_from([4, 6, 8]),
    "moe": st.booleans(),
    "tied": st.booleans(),
    "kv_heads": st.sampled_from([2, 8]),
    "gpus": st.sampled_from([2, 4, 8]),
    "batch": st.sampled_from([8, 16]),
    "memory_gb": st.floats(0.3, 3.0),
    "device": st.sampled_from(["h100", "a100-80gb"]),
})


@settings(max_examples=6)
@given(space=SPACES)
def test_pruned_search_returns_the_exhaustive_top_five(space: dict[str, object]) -> None:
    config = tiny(space["layers"], moe=space["moe"], tied=space["tied"], kv_heads=space["kv_heads"])  # type: ignore[arg-type]
    kwargs = {"device": space["device"], "num_gpus": space["gpus"], "global_batch": space["batch"],
              "memory_bytes": space["memory_gb"] * 1e9, "top": 5}  # type: ignore[operator]
    every = search(config, prune=False, **kwargs)  # type: ignore[arg-type]
    pruned = search(config, **kwargs)  # type: ignore[arg-type]
    top = [(o.candidate, o.iteration_time_s) for o in every if o.fits][:5]
    assert [(o.candidate, o.iteration_time_s) for o in pruned if o.fits][:5] == top
    assert search_counts(pruned)["num_candidates"] == search_counts(every)["num_candidates"]
    simulated = {o.candidate: o for o in every if o.status == "simulated"}
    fifth = top[-1][1] if len(top) == 5 else float("inf")
    for outcome in pruned:
        if outcome.status != "pruned":
            continue
        truth = simulated[outcome.candidate]
        if outcome.peak_memory_bytes:  # pruned by memory: it cannot fit
            assert not truth.fits and truth.peak_memory_bytes >= outcome.peak_memory_bytes * (1 - 1e-12)
        else:  # pruned by its bound: no faster than the fifth best
            assert truth.iteration_time_s >= outcome.step_bound_s * (1 - 1e-12)
            assert outcome.step_bound_s > fifth * (1 - 1e-12) or len(top) < 5


@settings(max_examples=6)
@given(space=SPACES)
def test_every_bound_is_at_most_what_simulation_gives(space: dict[str, object]) -> None:
    config = tiny(space["layers"], moe=space["moe"], tied=space["tied"], kv_heads=space["kv_heads"])  # type: ignore[arg-type]
    spec = load_device(str(space["device"]))
    every = search(config, device=spec, num_gpus=space["gpus"], global_batch=space["batch"],  # type: ignore[arg-type]
                   memory_bytes=1e15, prune=False)
    runner = _GroupRunner(_Setting(config=config, spec=spec, cluster=default_cluster(spec), placement="tp-in-node",
                                   seq_len=config.seq_len, budget=1e15, flops=forward_flops_per_token(config, 2048),
                                   dp_overlap=False))
    simulated = [o for o in every if o.status == "simulated"]
    assert simulated
    for outcome in simulated:
        c, step, peak = outcome.candidate, outcome.iteration_time_s, outcome.peak_memory_bytes
        first_step, first_memory, _ = runner.first_bounds(c)
        assert first_step <= outcome.step_bound_s * (1 + 1e-12) and outcome.step_bound_s <= step * (1 + 1e-12)
        assert first_memory <= peak * (1 + 1e-12) and runner.held_bound(c) <= peak * (1 + 1e-12)
        assert outcome.memory_bound_bytes <= peak * (1 + 1e-12)
        if c.schedule not in SPLIT_BACKWARD:  # with a fused backward the peak follows from the order exactly
            assert outcome.memory_bound_bytes == pytest.approx(peak, rel=1e-9)
        if c.pp == 1:  # one stage: nothing but its own work, so the step bound is the step
            assert outcome.step_bound_s == pytest.approx(step, rel=1e-9)


def test_the_space_holds_what_experts_run() -> None:
    """Sequence parallelism, every V that cuts a 126-layer model evenly (with Llama 3's one-fewer
    ends), CP and ZeRO-1, and no V that leaves stages uneven."""
    from pipesim.spec.model_files import load_model

    config = load_model("llama3-405b")
    space = [c for c in enumerate_candidates(config, default_cluster(load_device("h100")), num_gpus=16384,
                                             global_batch=2048, seq_len=8192) if isinstance(c, Candidate)]
    llama = Candidate(tp=8, pp=16, dp=128, microbatch_size=1, num_microbatches=16, schedule="interleaved-1f1b",
                      stages_per_rank=8, recompute="none", sequence_parallel=True, cp=1, ep=1, zero=1)
    assert llama in space
    assert {c.stages_per_rank for c in space if c.schedule == "interleaved-1f1b" and c.pp == 16} == {2, 4, 8}
    assert {c.cp for c in space} == {1, 2, 4, 8} and {c.zero for c in space if c.pp == 1} == {0, 1, 2, 3}
    assert not any(c.sequence_parallel for c in space if c.tp == 1)
    assert all((126 % c.num_stages == 0) or (128 % c.num_stages == 0) for c in space)
