"""The stage executor's split backward: W frees what the forward and I kept."""

from __future__ import annotations

import weakref

import pytest

torch = pytest.importorskip("torch")

from pipesim.harness.config import ModelSpec, TrainingOptions  # noqa: E402
from pipesim.harness.rank.models import build_model  # noqa: E402
from pipesim.harness.rank.stage import StageExecutor  # noqa: E402
from pipesim.schedule.ir import WeightPolicy  # noqa: E402


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_w_frees_the_graph_that_i_kept(name: str) -> None:
    """After W nothing holds the microbatch's graph: every weighted module's output and the stage's
    output are freed by reference counting alone (ReLU and softmax save their own results, which
    must not tie the graph to itself)."""
    spec = ModelSpec(name, depth=3, width=16, seq_len=4, heads=2)
    bundle = build_model(spec, 2)
    stage = StageExecutor(bundle, 0, bundle.num_layers - 1, WeightPolicy.FLUSH, TrainingOptions(),
                          split_backward=True)
    inputs, _ = bundle.microbatch(0, 2)
    result = stage.forward(0, 0, inputs, None)
    assert result.send is not None
    stashed = stage.stash[0]
    kept = [weakref.ref(t) for t in (stashed.output, *stashed.leaf_outputs.values())]
    assert len(kept) > 3
    del stashed
    stage.backward_input(0, torch.ones_like(result.send))
    assert all(ref() is not None for ref in kept)  # I keeps the graph for W
    stage.backward_weight(0)
    del result
    assert [ref() is None for ref in kept] == [True] * len(kept)


@pytest.mark.parametrize("split", [True, False])
def test_the_warm_up_runs_the_backward_the_schedule_will(split: bool) -> None:
    """A split schedule times I and W, so its warm-up runs them (and leaves nothing behind); else B."""
    spec = ModelSpec("mlp", depth=3, width=16)
    bundle = build_model(spec, 2)
    stage = StageExecutor(bundle, 0, bundle.num_layers - 1, WeightPolicy.FLUSH, TrainingOptions(), split_backward=split)
    ran: list[str] = []
    for name in ("backward", "backward_input", "backward_weight"):
        real = getattr(stage, name)
        setattr(stage, name, lambda *args, _real=real, _name=name: (ran.append(_name), _real(*args))[1])
    inputs, target = bundle.microbatch(0, 2)
    stage.warm_up(inputs, target if stage.has_loss else None)
    assert ran == (["backward_input", "backward_weight"] if split else ["backward"])
    assert stage.stash == {} and all(float(buffer.abs().sum()) == 0.0 for buffer in stage.store.grads)
