"""Where the drain starts: the first minibatch with an op after its device's last forward, in both
forms of the kernel, against orders worked by hand."""

from __future__ import annotations

import pytest

import pipesim
from pipesim.metrics import kernels


def run(schedule: str, p: int, m: int, k: int, **options: object) -> pipesim.Result:
    profile = pipesim.uniform_profile(num_layers=p, forward_s=2e-3, backward_s=1e-3, activation_bytes=1e3)
    return pipesim.simulate(profile, pipesim.Topology.uniform(num_devices=p), schedule=schedule, num_stages=p,
                            num_microbatches=m, num_minibatches=k, **options)


@pytest.mark.parametrize(
    ("schedule", "p", "m", "k", "options", "expected"),
    [
        # A flush: every device's last forwards are the last minibatch's, and its backwards follow them.
        ("1f1b", 4, 4, 4, {}, 3),
        # PipeDream, m = 1: stage 0 runs F(i + 3), B(i) in turn and ends F(7), B(4), B(5), B(6), B(7):
        # B(4), of minibatch 4, is the first op after its last forward.
        ("pipedream", 4, 1, 8, {}, 4),
        # PipeMare's paper pipeline, m = 4: stage 0 runs B(i) beside F(i + 7) while i + 7 <= 15, so
        # B(9) (minibatch 2) is its first backward alone, after the step of F(15) and B(8).
        ("pipemare", 4, 4, 4, {"pipemare_model": "paper"}, 2),
    ],
)
def test_the_drain_starts_where_the_order_says(schedule: str, p: int, m: int, k: int, options: dict[str, object],
                                               expected: int) -> None:
    s = run(schedule, p, m, k, **options).trace.spans
    for compiled in (False, True):
        found = kernels.first_drained(s["stream"], s["device"], s["kind"], s["minibatch"], s["end_s"], k,
                                      compiled=compiled)
        assert found == expected, compiled


@pytest.mark.skipif(not pipesim.jit.AVAILABLE, reason="numba is not installed")
def test_the_compiled_form_is_numbas() -> None:
    s = run("1f1b", 2, 2, 3).trace.spans
    kernels.first_drained(s["stream"], s["device"], s["kind"], s["minibatch"], s["end_s"], 3, compiled=True)
    assert kernels._first_drained.dispatcher().signatures  # type: ignore[attr-defined]
