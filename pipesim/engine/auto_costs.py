"""The stage times and memory zb-auto places its ops by, taken as the engines will run them."""

from __future__ import annotations

from pipesim.engine.lowering import split_evenly
from pipesim.schedule.zb_auto import ZeroBubbleCosts
from pipesim.spec.plan import Plan
from pipesim.spec.profile import Profile
from pipesim.spec.stages import stage_costs
from pipesim.spec.topology import Topology


def zero_bubble_costs(profile: Profile, topology: Topology, plan: Plan) -> ZeroBubbleCosts:
    """The plan's F, I and W time per stage (I and W halves of B where the profile has no
    split, as ``lower`` runs them), each link's time between neighbouring stages in both
    directions and how long a send holds it (its bytes over the bandwidth: latency pipelines), and per stage the stash an F adds, the part of it that I frees and the U time.

    Raises:
        ConfigError: the plan does not fit the profile or the topology (``stage_costs``).
    """
    costs = stage_costs(profile, plan, topology)
    input_s, weight_s = split_evenly(costs)
    if costs.backward_input_s is not None and costs.backward_weight_s is not None:
        input_s, weight_s = costs.backward_input_s, costs.backward_weight_s
    devices = [plan.device_of(stage) for stage in range(plan.num_stages)]
    links = list(zip(devices, devices[1:], costs.output_bytes, strict=False))
    forward = [topology.send_s(src, dst, size) for src, dst, size in links]
    backward = [topology.send_s(dst, src, size) for src, dst, size in links]
    kept = costs.weight_stash_bytes or costs.stash_bytes
    return ZeroBubbleCosts(
        forward_s=costs.forward_s, backward_input_s=input_s, backward_weight_s=weight_s,
        forward_comm_s=tuple(transfer for transfer, _ in forward),
        backward_comm_s=tuple(transfer for transfer, _ in backward),
        forward_hold_s=tuple(hold for _, hold in forward),
        backward_hold_s=tuple(hold for _, hold in backward),
        forward_bytes=costs.stash_bytes,
        input_bytes=tuple(k - s for k, s in zip(kept, costs.stash_bytes, strict=True)),
        update_s=costs.update_s,
    )
