"""Tensor and data parallelism around a pipeline: the overlapped gradient all-reduce, and placements on nodes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipesim.search import Candidate, enumerate_candidates
from pipesim.spec.cluster import load_cluster
from pipesim.spec.collectives import Group, group_path
from pipesim.spec.transformer_profile import Parallelism
from pipesim.spec.parallel import data_parallel_profile, overlapped_allreduce_tail_s, overlapped_gather_head_s
from pipesim.spec.plan import Plan
from pipesim.spec.profile import Profile, uniform_profile
from pipesim.spec.stages import stage_costs
from pipesim.spec.topology import Topology
from pipesim.spec.transformer import preset


def test_the_tail_is_what_outlasts_the_backward() -> None:
    # Backward runs layer 1 then layer 0, 2 ms each. Layer 1's all-reduce (3 ms) runs 2-5; layer
    # 0's gradient is ready at 4 but the NIC is busy until 5: 5-6. The backward ends at 4: tail 2.
    assert overlapped_allreduce_tail_s([2.0, 2.0], [1.0, 3.0]) == 2.0
    # Small all-reduces hide behind the backward except the last layer's own.
    assert overlapped_allreduce_tail_s([2.0, 2.0], [0.5, 0.5]) == 0.5
    assert overlapped_allreduce_tail_s([], []) == 0.0


def test_the_head_is_how_long_the_gathers_hold_back_the_first_forward() -> None:
    # Forward runs layer 0 then layer 1, 2 ms each; the gathers run in the same order from the step's
    # start. Layer 0's (1 ms) ends at 1, its forward runs 1-3; layer 1's (3 ms) ends at 4, its forward 4-6:
    # 2 ms later than the 4 ms of forward alone.
    assert overlapped_gather_head_s([2.0, 2.0], [1.0, 3.0]) == 2.0
    # Small gathers hide behind the forward except the first layer's own.
    assert overlapped_gather_head_s([2.0, 2.0], [0.5, 0.5]) == 0.5
    assert overlapped_gather_head_s([], []) == 0.0


@given(st.lists(st.tuples(st.floats(0, 10), st.floats(0, 10)), max_size=8))
def test_the_head_lies_between_the_first_gather_and_all_of_them(layers: list[tuple[float, float]]) -> None:
    # Its first layer's gather is never hidden; at worst none is.
    forward, gather = [f for f, _ in layers], [g for _, g in layers]
    head = overlapped_gather_head_s(forward, gather)
    assert (gather[0] if gather else 0.0) - 1e-9 <= head <= sum(gather) + 1e-9


def test_a_weight_gather_delays_the_update_by_what_the_stages_first_forward_does_not_hide() -> None:
    # One stage of two layers, F = 1 s, B = 2 s each; reduce-scatters of 1.5 s after each layer's
    # backward (tail 1.5, as above) and gathers of 1.5 s before each forward: layer 0's ends at 1.5, its
    # forward 1.5-2.5, layer 1's gather ends at 3, its forward 3-4: the forward ends 2 s late. U = 1.5 + 2.
    layers = [{"name": f"l{index}", "forward_s": 1.0, "backward_s": 2.0, "activation_bytes": 0.0,
               "param_bytes": 0.0, "gradient_allreduce_s": 1.5, "param_gather_s": 1.5} for index in range(2)]
    profile = Profile.model_validate({"name": "zero1", "layers": layers})
    topology = Topology.uniform(num_devices=1, bandwidth=1e12)
    costs = stage_costs(profile, Plan(schedule="1f1b", num_stages=1, num_microbatches=2), topology)
    assert costs.update_s == pytest.approx((3.5,), rel=1e-12)
    # Over two stages, a layer each, each stage's gather waits on its own layer's forward: 1.5 s before it,
    # nothing to hide behind; its reduce-scatter outlasts its 2 s backward by all 1.5 s.
    two = stage_costs(profile, Plan(schedule="1f1b", num_stages=2, num_microbatches=2),
                      Topology.uniform(num_devices=2, bandwidth=1e12))
    assert two.update_s == pytest.approx((3.0, 3.0), rel=1e-12)


def test_overlap_moves_the_all_reduce_out_of_the_update() -> None:
    profile = uniform_profile(num_layers=4, forward_s=1e-3, backward_s=2e-3, param_bytes=1e8)
    topology = Topology.uniform(num_devices=2, bandwidth=1e12)
    plan = Plan(schedule="1f1b", num_stages=2, num_microbatches=2)
    after = stage_costs(data_parallel_profile(profile, 2, 50e9), plan, topology)
    overlapped_profile = data_parallel_profile(profile, 2, 50e9, overlap=True)
    overlapped = stage_costs(overlapped_profile, plan, topology)
    assert after.update_s == pytest.approx((4e-3, 4e-3), rel=1e-12)  # 2 layers x 2 ms
    assert overlapped.update_s == pytest.approx((2e-3, 2e-3), rel=1e-12)  # the last layer's 2 ms
    assert [layer.gradient_allreduce_s for layer in overlapped_profile.layers] == [pytest.approx(2e-3)] * 4
    assert data_parallel_profile(profile, 1, 50e9, overlap=True) is profile


def test_a_fused_backward_overlaps_the_all_reduce_with_all_of_it_a_split_one_with_its_w() -> None:
    # Two layers on one stage, I = W = 1 s each, all-reduces of 1.5 s. 1F1B runs each layer's I and W
    # together: layer 1's gradient at 2 (1.5 s: to 3.5), layer 0's at 4 (to 5.5); its backward ends at 4:
    # tail 1.5. ZB-H1 runs W apart: layer 1's gradient after its W at 1 (to 2.5), layer 0's at 2 (the
    # NIC busy to 2.5: to 4); the Ws end at 2: tail 2.
    layers = [{"name": f"l{index}", "forward_s": 1.0, "backward_s": 2.0, "backward_input_s": 1.0,
               "backward_weight_s": 1.0, "activation_bytes": 0.0, "param_bytes": 0.0, "gradient_allreduce_s": 1.5}
              for index in range(2)]
    profile = Profile.model_validate({"name": "split", "layers": layers})
    topology = Topology.uniform(num_devices=1, bandwidth=1e12)
    fused = stage_costs(profile, Plan(schedule="1f1b", num_stages=1, num_microbatches=2), topology)
    apart = stage_costs(profile, Plan(schedule="zb-h1", num_stages=1, num_microbatches=2), topology)
    assert fused.update_s == pytest.approx((1.5,), rel=1e-12)
    assert apart.update_s == pytest.approx((2.0,), rel=1e-12)


def test_pp_in_node_bounds_the_pipeline_by_a_node_and_lets_tp_span_nodes() -> None:
    config, cluster = preset("llama3-70b"), load_cluster("dgx-h100")
    megatron = [item for item in enumerate_candidates(config, cluster, num_gpus=64, global_batch=64)
                if isinstance(item, Candidate)]
    pipelines_in_nodes = [item for item in enumerate_candidates(config, cluster, num_gpus=64, global_batch=64,
                                                                placement="pp-in-node") if isinstance(item, Candidate)]
    # 80 layers: 16 stages cut them evenly, 32 and 64 do not (nor 82 = 80 plus embedding and head)
    assert max(item.tp for item in megatron) == 8 and max(item.pp for item in megatron) == 16
    assert max(item.pp for item in pipelines_in_nodes) == 8 and max(item.tp for item in pipelines_in_nodes) == 64
    # pp-in-node with pp = 8: a TP group of 16 is 8 GPUs apart, one per node: the NIC's rate (50 GB/s x 0.92).
    tp_stride = Parallelism(tp=16, pp=8, dp=1, placement="pp-in-node").strides[0]
    assert tp_stride == 8
    assert group_path(cluster, Group(16, tp_stride)).bus_bytes_per_s == pytest.approx(50e9 * 0.92)
