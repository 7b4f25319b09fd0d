"""The harness trains as each schedule says: flush schedules equal non-pipelined SGD, asynchronous ones their rules."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pipesim.engine.trace import Trace  # noqa: E402
from pipesim.harness.config import ModelSpec, RunConfig, TrainingOptions  # noqa: E402
from pipesim.harness.launch import launch  # noqa: E402
from pipesim.harness.rank.models import build_model  # noqa: E402
from pipesim.harness.rank.profile_rank import stash_attribution  # noqa: E402
from pipesim.harness.comparison import compare_versions  # noqa: E402
from pipesim.metrics import compute_metrics  # noqa: E402
from pipesim.simulation import simulate  # noqa: E402
from pipesim.spec.profile import Profile  # noqa: E402
from pipesim.spec.validation import build  # noqa: E402
from harness_reference import asynchronous_reference, flush_reference  # noqa: E402

SPEC = ModelSpec("mlp", depth=4, width=8, seed=7)
BATCH = 3
LR = 0.05
TWO_STAGES = ((0, 2), (2, 5))  # layers 0-1 | layers 2-3 and the loss
THREE_STAGES = ((0, 2), (2, 3), (3, 5))


def run(tmp_path: Path, schedule: str, partition: tuple[tuple[int, int], ...], m: int, k: int,
        training: TrainingOptions | None = None, pipemare_update: str = "minibatch",
        num_ranks: int = 0) -> list[torch.Tensor]:
    config = RunConfig(model=SPEC, schedule=schedule, num_stages=len(partition), num_microbatches=m,
                       num_minibatches=k, microbatch_size=BATCH, partition=partition,
                       training=training or TrainingOptions(learning_rate=LR), pipemare_update=pipemare_update,
                       weights_out=str(tmp_path / "weights"), trace_out=str(tmp_path / "trace.json"),
                       num_ranks=num_ranks)
    launch(config, op_timeout_s=60)
    check_against_simulation(config, Trace.from_json((tmp_path / "trace.json").read_text()))
    return [w for s in range(len(partition)) for w in torch.load(tmp_path / "weights" / f"stage{s}.pt")]


def check_against_simulation(config: RunConfig, measured: Trace) -> None:
    """Every op ran on the weight version the simulator predicts, and each stage's peak tracked memory
    (weights, gradients, versions, stashed activations) is the predicted one to the byte."""
    bundle = build_model(SPEC, BATCH)
    stash = stash_attribution(bundle, BATCH, torch.device("cpu"))
    # the harness's split backward keeps the whole graph from I to W, so W frees the whole stash
    layers = [{"name": name, "forward_s": 1e-3, "backward_s": 2e-3, "update_s": 1e-4, "stash_bytes": stash[i],
               "weight_stash_bytes": stash[i],
               "activation_bytes": 4.0 * BATCH * SPEC.width,
               "param_bytes": float(sum(p.numel() * 4 for p in bundle.layers[i].parameters()))}
              for i, name in enumerate(bundle.names)]
    profile = build(Profile, {"layers": layers, "microbatch_size": BATCH})
    predicted = simulate(profile, schedule=config.schedule, num_stages=config.num_stages,
                         num_microbatches=config.num_microbatches, num_minibatches=config.num_minibatches,
                         partition=config.partition, optimizer_state_multiplier=0.0,
                         pipemare_update=config.pipemare_update,
                         stages_per_rank=config.num_stages // config.num_ranks if config.num_ranks else 1)
    check = compare_versions(predicted.trace, measured)
    assert check.matches and check.num_ops == measured.num_spans - sum(1 for s in measured.iter_spans()
                                                                        if s.stream == "send"), check.mismatches
    peaks = [stage.peak_memory_bytes for stage in compute_metrics(measured).stages]
    assert peaks == [stage.peak_memory_bytes for stage in predicted.metrics.stages]


def stage_layers(partition: tuple[tuple[int, int], ...]) -> list[list[int]]:
    """Layer indices with weights (the loss has none) per stage."""
    return [[i for i in range(a, b) if i < SPEC.depth] for a, b in partition]


def assert_same(got: list[torch.Tensor], want: list[torch.Tensor], atol: float = 1e-6) -> None:
    assert len(got) == len(want)
    worst = max(float((a - b).abs().max()) for a, b in zip(got, want, strict=True))
    assert worst <= atol, f"largest weight difference {worst:.3g} > {atol}"


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_flush_schedules_equal_non_pipelined_training(tmp_path: Path, schedule: str) -> None:
    got = run(tmp_path, schedule, TWO_STAGES, m=4, k=2)
    want = flush_reference(build_model(SPEC, BATCH), m=4, k=2, batch=BATCH, lr=LR)
    assert_same(got, want)


def test_interleaved_1f1b_with_two_stages_per_rank_equals_non_pipelined_training(tmp_path: Path) -> None:
    four_stages = ((0, 1), (1, 2), (2, 3), (3, 5))
    got = run(tmp_path, "interleaved-1f1b", four_stages, m=2, k=2, num_ranks=2)
    want = flush_reference(build_model(SPEC, BATCH), m=2, k=2, batch=BATCH, lr=LR)
    assert_same(got, want)


@pytest.mark.parametrize(("schedule", "num_ranks"), [("zb-h1", 0), ("zb-h2", 0), ("zbv", 2), ("interleaved-zb", 2),
                                                    ("dualpipev", 2)])
def test_split_backward_schedules_equal_non_pipelined_training(tmp_path: Path, schedule: str, num_ranks: int) -> None:
    # I and W are separate autograd steps (the input gradient first, the weight gradients from the kept graph)
    partition = ((0, 1), (1, 2), (2, 3), (3, 5)) if num_ranks else TWO_STAGES
    got = run(tmp_path, schedule, partition, m=4, k=2, num_ranks=num_ranks)
    want = flush_reference(build_model(SPEC, BATCH), m=4, k=2, batch=BATCH, lr=LR)
    assert_same(got, want)


def one_f_one_b_forward_updates(stage: int, p: int, j: int, every: int) -> int:
    """Updates a stage has applied when microbatch j's forward runs in the continuous 1F1B order:
    after a warm-up of p-s-1 forwards, F(j) follows B(j-(p-s-1)-1), so floor((j-w)/every) updates."""
    warmup = p - stage - 1
    return max(0, j - warmup) // every


def test_pipedream_equals_weight_stashing_reference(tmp_path: Path) -> None:
    m, k, p = 2, 3, 2
    got = run(tmp_path, "pipedream", TWO_STAGES, m=m, k=k)

    def version(s: int, j: int) -> int:  # stashing: the backward uses the forward's version
        return one_f_one_b_forward_updates(s, p, j, 1)

    want = asynchronous_reference(build_model(SPEC, BATCH), stage_layers(TWO_STAGES), total=m * k, update_every=1,
                                  batch=BATCH, lr=LR, forward_version=version, backward_version=version)
    assert_same(got, want)


def test_2bw_equals_one_step_delayed_reference(tmp_path: Path) -> None:
    m, k = 2, 4
    got = run(tmp_path, "2bw", TWO_STAGES, m=m, k=k)

    def version(s: int, j: int) -> int:  # minibatch t runs on version max(0, t-1): W(t+1) = W(t) - lr grad(W(t-1))
        return max(0, j // m - 1)

    want = asynchronous_reference(build_model(SPEC, BATCH), stage_layers(TWO_STAGES), total=m * k, update_every=m,
                                  batch=BATCH, lr=LR, forward_version=version, backward_version=version)
    assert_same(got, want)


def test_pipemare_equals_its_reference_with_rescheduling_and_correction(tmp_path: Path) -> None:
    m, k, p, warmup_updates, decay = 2, 3, 3, 4, 0.5
    training = TrainingOptions(learning_rate=LR, pipemare_warmup_updates=warmup_updates, pipemare_correction=True,
                               pipemare_correction_decay=decay)
    got = run(tmp_path, "pipemare", THREE_STAGES, m=m, k=k, training=training, pipemare_update="microbatch")

    def forward(s: int, j: int) -> int:
        return one_f_one_b_forward_updates(s, p, j, 1)

    def backward(s: int, j: int) -> int:  # one version: the backward sees every update before it, j of them
        return j

    delays = [p - s - 1 for s in range(p)]  # forward delay with an update per microbatch

    def step_size(s: int, update: int) -> float:
        exponent = 1.0 - min(update / warmup_updates, 1.0)
        return LR / max(1, delays[s]) ** exponent

    want = asynchronous_reference(build_model(SPEC, BATCH), stage_layers(THREE_STAGES), total=m * k, update_every=1,
                                  batch=BATCH, lr=LR, forward_version=forward, backward_version=backward,
                                  step_size=step_size, correction_decay=decay)
    assert_same(got, want)
    assert not math.isclose(float(want[0].sum()), float(flush_reference(build_model(SPEC, BATCH), m=1, k=m * k,
                                                                        batch=BATCH, lr=LR)[0].sum()))


def test_pipemare_per_minibatch_matches_reference(tmp_path: Path) -> None:
    m, k, p = 2, 3, 2
    got = run(tmp_path, "pipemare", TWO_STAGES, m=m, k=k)
    want = asynchronous_reference(
        build_model(SPEC, BATCH), stage_layers(TWO_STAGES), total=m * k, update_every=m, batch=BATCH, lr=LR,
        forward_version=lambda s, j: one_f_one_b_forward_updates(s, p, j, m), backward_version=lambda s, j: j // m)
    assert_same(got, want)


def test_split_backward_of_transformer_blocks_trains_as_gpipe(tmp_path: Path) -> None:
    # W takes each Linear's and LayerNorm's weight gradients from that module's own output gradient
    spec = ModelSpec("transformer", depth=2, width=8, seq_len=4, heads=2, seed=3)
    weights = {}
    for schedule in ("gpipe", "zb-h1"):
        folder = tmp_path / schedule
        config = RunConfig(model=spec, schedule=schedule, num_stages=2, num_microbatches=4, num_minibatches=2,
                           microbatch_size=2, partition=((0, 2), (2, 3)), training=TrainingOptions(learning_rate=LR),
                           weights_out=str(folder))
        launch(config, op_timeout_s=60)
        weights[schedule] = [w for s in range(2) for w in torch.load(folder / f"stage{s}.pt")]
    initial = [p.detach() for layer in build_model(spec, 2).layers for p in layer.parameters()]
    assert_same(weights["zb-h1"], weights["gpipe"])
    assert max(float((a - b).abs().max()) for a, b in zip(weights["gpipe"], initial, strict=True)) > 1e-4
