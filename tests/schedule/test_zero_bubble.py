"""Split backward: the zero-bubble paper's closed forms, and W freeing what I keeps."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipesim import Topology, simulate, uniform_profile
from pipesim.metrics import memory_over_time


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)


def split_profile(p: int, tf: float, ti: float, tw: float, **kwargs: float):  # type: ignore[no-untyped-def]
    return uniform_profile(num_layers=p, forward_s=tf, backward_s=ti + tw, backward_input_s=ti,
                           backward_weight_s=tw, activation_bytes=1e6, param_bytes=4e6, **kwargs)


def iteration(name: str, p: int, m: int, k: int, times: tuple[float, float, float]) -> float:
    result = simulate(split_profile(p, *times), Topology.uniform(num_devices=p), schedule=name, num_stages=p,
                      num_microbatches=m, num_minibatches=k)
    return result.metrics.iteration_time_s


# tW <= min(tF, tI): the W of the handcrafted schedules fit the gaps they are placed in.
times = st.tuples(st.floats(0.5, 2.0), st.floats(0.5, 2.0), st.floats(0.05, 1.0)).map(
    lambda t: (t[0] * 1e-3, t[1] * 1e-3, t[2] * min(t[0], t[1]) * 1e-3))


@given(p=st.integers(1, 6), extra=st.integers(0, 6), k=st.sampled_from([1, 3]), t=times)
def test_zb_h1_bubble_is_p_minus_1_times_tf_plus_ti_minus_tw(p: int, extra: int, k: int,
                                                            t: tuple[float, float, float]) -> None:
    tf, ti, tw = t
    m = p + extra
    assert close(iteration("zb-h1", p, m, k, t) - m * (tf + ti + tw), (p - 1) * (tf + ti - tw))


@given(p=st.integers(1, 5), extra=st.integers(0, 5), t=times)
def test_zb_h2_steady_bubble_is_p_minus_1_times_tf_plus_ti_minus_2tw(p: int, extra: int,
                                                                     t: tuple[float, float, float]) -> None:
    tf, ti, tw = t
    m = 2 * p - 1 + extra
    assert close(iteration("zb-h2", p, m, 3, t) - m * (tf + ti + tw), (p - 1) * (tf + ti - 2 * tw))


def test_1f1b_on_a_split_profile_runs_b_as_i_plus_w() -> None:
    tf, ti, tw = 1e-3, 1.5e-3, 0.5e-3
    for p in range(1, 7):
        for m in (1, p, 2 * p + 1):
            bubble = iteration("1f1b", p, m, 1, (tf, ti, tw)) - m * (tf + ti + tw)
            assert close(bubble, (p - 1) * (tf + ti + tw)), (p, m)


def test_zb_h2_has_zero_bubble_when_f_i_w_are_equal() -> None:
    for p in (2, 4, 6):
        result = simulate(split_profile(p, 1e-3, 1e-3, 1e-3), schedule="zb-h2", num_stages=p,
                          num_microbatches=2 * p, num_minibatches=4)
        assert result.metrics.bubble_fraction < 1e-9


@pytest.mark.parametrize(("name", "in_flight"), [("1f1b", lambda p, s: p - s), ("zb-h1", lambda p, s: p),
                                                 ("zb-h2", lambda p, s: 2 * p - 1)])
def test_microbatches_held_from_f_to_w(name: str, in_flight) -> None:  # type: ignore[no-untyped-def]
    for p in (2, 3, 5):
        result = simulate(split_profile(p, 1e-3, 1e-3, 1e-3), schedule=name, num_stages=p, num_microbatches=3 * p)
        assert [s.max_inflight_microbatches for s in result.metrics.stages] == [in_flight(p, s) for s in range(p)]


def test_zb_h1_peak_memory_equals_1f1bs() -> None:
    for p in (2, 4, 6):
        profile = split_profile(p, 1e-3, 1e-3, 1e-3)
        peaks = [simulate(profile, schedule=name, num_stages=p, num_microbatches=2 * p).metrics.peak_memory_bytes
                 for name in ("1f1b", "zb-h1")]
        assert peaks[0] == peaks[1]


def test_w_frees_what_i_keeps() -> None:
    # One stage, one microbatch: F stashes 3 MB, I frees all but the 1 MB W needs, W frees that.
    profile = uniform_profile(num_layers=1, forward_s=1.0, backward_s=3.0, backward_input_s=2.0, backward_weight_s=1.0,
                              activation_bytes=3e6, param_bytes=5e6, weight_stash_bytes=1e6)
    result = simulate(profile, schedule="zb-h1", num_stages=1, num_microbatches=1)
    activations = memory_over_time(result.trace)[["time_s", "activations"]].values.tolist()
    assert activations == [[0.0, 0.0], [1.0, 3e6], [3.0, 1e6], [4.0, 0.0]]
    assert result.metrics.stages[0].max_inflight_microbatches == 1


def test_weight_stash_defaults_to_the_stash_with_weights_and_to_nothing_without() -> None:
    for params, kept_after_i in ((5e6, 3e6), (0.0, 0.0)):
        profile = uniform_profile(num_layers=1, forward_s=1.0, backward_s=3.0, backward_input_s=2.0,
                                  backward_weight_s=1.0, activation_bytes=3e6, param_bytes=params)
        frame = memory_over_time(simulate(profile, schedule="zb-h1", num_stages=1, num_microbatches=1).trace)
        assert frame.loc[frame["time_s"] <= 3.0, "activations"].tolist()[-1] == kept_after_i


def test_a_profile_without_split_gives_i_and_w_half_the_backward_each() -> None:
    profile = uniform_profile(num_layers=2, forward_s=1.0, backward_s=2.0)
    for recompute, (i_s, w_s) in ((False, (1.0, 1.0)), (True, (2.0, 1.0))):
        frame = simulate(profile, schedule="zb-h1", num_stages=2, num_microbatches=2, recompute=recompute).trace.to_frame()
        compute = frame[frame["stream"] == "compute"]
        assert set(compute.loc[compute["kind"] == "I", "duration_s"]) == {i_s}
        assert set(compute.loc[compute["kind"] == "W", "duration_s"]) == {w_s}
