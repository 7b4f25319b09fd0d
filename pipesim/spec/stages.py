"""Stage costs: the per-stage times and bytes an engine needs, cut from a Profile by a Plan."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipesim.errors import ConfigError
from pipesim.spec.partition import balance_partition as balance_partition  # where simulate and the harness import it
from pipesim.spec.parallel import overlapped_allreduce_tail_s, overlapped_gather_head_s, ring_allreduce_s
from pipesim.spec.plan import CUSTOM_SCHEDULE, SPLIT_BACKWARD_SCHEDULES, Plan
from pipesim.spec.profile import Layer, LayerColumns, Profile
from pipesim.spec.topology import Topology


@dataclass(frozen=True)
class StageCosts:
    """Per stage (index s), the cost of one microbatch's ops and the stage's memory sizes.

    Attributes:
        forward_s: F time, seconds (divided by the device's speed, and by the stage's replicas
            when they share its work: ``Plan.replica_model == "round-robin"``); the profile's
            per-op overheads are added once to every F, B (I) and U.
        backward_s: B time, seconds (including the recomputed forward when recompute is on).
        backward_input_s: I time when the profile splits backward, else None.
        backward_weight_s: W time when the profile splits backward, else None.
        update_s: U time: the optimizer step on the stage's weights (the layers' ``update_s``)
            plus the gradient all-reduce over the stage's replicas, seconds (see
            ``replica_allreduce_s``), plus what the layers' overlapped data-parallel all-reduces
            (``gradient_allreduce_s``) leave after the last backward and what their overlapped
            weight all-gathers (``param_gather_s``) hold back the next step's first forward.
        output_bytes: bytes of stage s's output, sent to s+1 (its gradient comes back the same size).
        stash_bytes: bytes one microbatch keeps on stage s between its F and its B.
        param_bytes: bytes of stage s's weights.
        forward_std_s, backward_std_s: spread of the F and B times, seconds (0 when unknown).
        weight_stash_bytes: with split backward, bytes one microbatch keeps on stage s from its
            I's end to its W's end (I frees ``stash_bytes`` and keeps these); ``None``: all of
            ``stash_bytes`` (I frees nothing).
        recompute_s: per stage, the forward time re-run in the backward (included in
            ``backward_s`` and ``backward_input_s``); ``None``: no recomputation.
        working_bytes: per stage, the activations a microbatch's B (or I) re-creates and holds
            while it runs, on top of ``stash_bytes`` (recomputation's working memory);
            ``None``: nothing re-created.
        gradient_bytes, optimizer_bytes: per stage, its layers' ``gradient_bytes`` and
            ``optimizer_bytes`` summed; ``None`` where the profile leaves them to their defaults.
        gathered_bytes: per stage, the two largest ``gathered_bytes`` of its layers (ZeRO-3:
            the layer computing and the one prefetched); ``None`` where no layer gathers.
    """

    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    backward_input_s: tuple[float, ...] | None
    backward_weight_s: tuple[float, ...] | None
    update_s: tuple[float, ...]
    output_bytes: tuple[float, ...]
    stash_bytes: tuple[float, ...]
    param_bytes: tuple[float, ...]
    forward_std_s: tuple[float, ...]
    backward_std_s: tuple[float, ...]
    weight_stash_bytes: tuple[float, ...] | None = None
    recompute_s: tuple[float, ...] | None = None
    working_bytes: tuple[float, ...] | None = None
    gradient_bytes: tuple[float, ...] | None = None
    optimizer_bytes: tuple[float, ...] | None = None
    gathered_bytes: tuple[float, ...] | None = None

    @property
    def num_stages(self) -> int:
        """Number of stages."""
        return len(self.forward_s)


def replica_allreduce_s(topology: Topology, first_device: int, replicas: int, param_bytes: float) -> float:
    """Seconds of a ring all-reduce of ``param_bytes`` over ``replicas`` devices from ``first_device``.

    ``2 (r-1)/r * param_bytes`` over the ring's slowest link (``Topology.ring_bandwidth_bytes_per_s``
    of ``first_device .. first_device + r - 1``); a ring that would run past the last device uses
    the topology's default bandwidth. 0 for one replica.
    """
    if replicas <= 1:
        return 0.0
    last = first_device + replicas - 1
    if last < topology.num_devices:
        bandwidth = topology.ring_bandwidth_bytes_per_s(first_device, last)
    else:
        bandwidth = topology.bandwidth_bytes_per_s
    return ring_allreduce_s(param_bytes, replicas, bandwidth)


def updates_per_microbatch(plan: Plan) -> bool:
    """True when the plan's schedule updates weights after every microbatch (pipedream, pipemare per microbatch)."""
    return plan.schedule == "pipedream" or (plan.schedule == "pipemare" and plan.pipemare_update == "microbatch")


def stage_costs(
    profile: Profile,
    plan: Plan,
    topology: Topology,
    *,
    stage_devices: tuple[int, ...] | None = None,
) -> StageCosts:
    """Per-stage costs of ``profile`` cut by ``plan`` and run on ``topology``.

    Times are divided by the speed of the stage's device: ``stage_devices[s]`` when given
    (several stages per rank), else ``plan.device_of(s)``. Recomputation (``plan.recompute_of``):
    ``"full"`` keeps only the stage's input and re-runs its whole forward in the backward;
    ``"selective"`` drops the stash of the layers marked ``selective_recompute`` and re-runs
    their forward. The re-run time is added to B and, split, to I. With split backward W keeps
    the stage's ``weight_stash_bytes`` (re-materialized by I when recomputed).

    Memory (``stash_bytes``, ``working_bytes``): stage 0 also keeps the model's input
    (``profile.input_bytes``, and the stash of its leading layers that neither compute nor hold
    weights, such as PipeDream's ``Input`` node: data, not re-creatable), the last stage the loss
    buffer (``profile.loss_bytes``), both whatever the recomputation and both kept until W. The
    backward of a recomputed stage holds what it re-creates (GPipe's O(L/K x N/M) term, Huang et
    al. 2019): under ``"full"`` the whole stage's stash at once, under ``"selective"`` the largest
    dropped layer's (each re-runs just before its own backward), plus the largest
    ``recomputed_bytes`` of a layer (recomputation the profile already holds).

    A stage with ``r`` replicas adds to its U op the ring all-reduce of its weights,
    ``2 (r-1)/r * weight bytes``. By default (``replica_model="allreduce-only"``) that is all, at
    the topology's default bandwidth. With ``"round-robin"`` (PipeDream's replicated stage) the
    stage runs as one pipeline stage on its first device (the plan's placement), r times as
    fast: its compute times are divided by ``r``, PipeDream's own approximation of microbatches
    dealt round-robin to the replicas; its all-reduce runs over devices ``placement ..
    placement + r - 1`` (``replica_allreduce_s``), and with a schedule that updates after every
    microbatch the replicas all-reduce once per ``r`` microbatches, so each U carries ``1/r``.

    Raises:
        ConfigError: the partition does not cover the profile, a stage is placed on a device
            the topology lacks.
    """
    partition = plan.partition or balance_partition(profile, plan.num_stages)
    if partition[-1][1] != profile.num_layers:
        raise ConfigError(
            "partition", [list(r) for r in partition],
            f"must end at the number of layers ({profile.num_layers}), ends at {partition[-1][1]}",
        )
    forward, backward, b_input, b_weight, update = [], [], [], [], []
    output, stash, params, f_std, b_std = [], [], [], [], []
    weight_stash, recomputed, working = [], [], []
    split = profile.has_split_backward
    per_microbatch = updates_per_microbatch(plan)
    round_robin = plan.replica_model == "round-robin"
    forward_overhead = profile.forward_overhead_s or 0.0
    backward_overhead = profile.backward_overhead_s or 0.0
    update_overhead = profile.update_overhead_s or 0.0
    columns = profile.columns
    for stage, (start, end) in enumerate(partition):
        device = stage_devices[stage] if stage_devices is not None else plan.device_of(stage)
        if device >= topology.num_devices:
            raise ConfigError(
                "placement", device, f"stage {stage} is placed on a device the topology lacks "
                f"({topology.num_devices} devices)",
            )
        replicas = plan.replicas_of(stage)
        speed = topology.devices[device].speed * (replicas if round_robin else 1)
        f = sum(columns.forward_s[start:end]) / speed
        mode = plan.recompute_of(stage)
        stage_stash, stage_kept, stage_working = stage_memory(profile, start, end, mode)
        stash.append(stage_stash)
        weight_stash.append(stage_kept)
        working.append(stage_working)
        if mode == "full":
            recompute_s = f
        elif mode == "selective":
            recompute_s = sum(time for time, dropped in zip(columns.forward_s[start:end], columns.selective[start:end],
                                                            strict=True) if dropped) / speed
        else:
            recompute_s = 0.0
        recomputed.append(recompute_s)
        forward.append(f + forward_overhead)
        backward.append(sum(columns.backward_s[start:end]) / speed + recompute_s + backward_overhead)
        if split:
            b_input.append(sum(columns.backward_input_s[start:end]) / speed + recompute_s + backward_overhead)
            b_weight.append(sum(columns.backward_weight_s[start:end]) / speed)
        output.append(columns.activation_bytes[end - 1])
        stage_params = sum(columns.param_bytes[start:end])
        params.append(stage_params)
        # The optimizer step on the stage's weights (each replica steps its own copy at once), after
        # whatever of the data-parallel all-reduce outlasts the last backward.
        step = sum(columns.update_s[start:end]) / topology.devices[device].speed + update_overhead
        if any(columns.gradient_allreduce_s[start:end]):
            # A layer's gradient is ready after its W where the schedule runs W apart (a split
            # backward, or a custom schedule of a split profile), else after its whole backward.
            apart = split and (plan.schedule in SPLIT_BACKWARD_SCHEDULES or plan.schedule == CUSTOM_SCHEDULE)
            gradients = (columns.backward_weight_s if apart else columns.backward_s)[start:end]
            step += overlapped_allreduce_tail_s([time / speed for time in gradients],
                                                columns.gradient_allreduce_s[start:end])
        if any(columns.param_gather_s[start:end]):
            # ZeRO-1's gathers of the updated weights run before the next step's first forward of
            # the stage; what they hold it back is counted here, at the step's end (the same step time).
            step += overlapped_gather_head_s([time / speed for time in columns.forward_s[start:end]],
                                             columns.param_gather_s[start:end])
        if round_robin:
            allreduce_s = replica_allreduce_s(topology, device, replicas, stage_params)
            update.append(step + (allreduce_s / replicas if per_microbatch else allreduce_s))
        else:
            update.append(step + ring_allreduce_s(stage_params, replicas, topology.bandwidth_bytes_per_s))
        f_std.append((sum(columns.forward_var[start:end]) ** 0.5) / speed)
        b_std.append((sum(columns.backward_var[start:end]) ** 0.5) / speed)
    return StageCosts(
        forward_s=tuple(forward),
        backward_s=tuple(backward),
        backward_input_s=tuple(b_input) if split else None,
        backward_weight_s=tuple(b_weight) if split else None,
        update_s=tuple(update),
        output_bytes=tuple(output),
        stash_bytes=tuple(stash),
        param_bytes=tuple(params),
        forward_std_s=tuple(f_std),
        backward_std_s=tuple(b_std),
        weight_stash_bytes=tuple(weight_stash),
        recompute_s=tuple(recomputed) if any(recomputed) else None,
        working_bytes=tuple(working) if any(working) else None,
        **_held_bytes(columns, partition),
    )


def _held_bytes(columns: LayerColumns, partition: Sequence[tuple[int, int]]) -> dict[str, tuple[float, ...]]:
    """The stage sums of the profile's per-layer gradient and optimizer bytes, and each stage's two
    largest gathered weights, where the profile gives them (``StageCosts``)."""
    held: dict[str, tuple[float, ...]] = {}
    for name in ("gradient_bytes", "optimizer_bytes"):
        values = getattr(columns, name)
        if values is not None:
            held[name] = tuple(sum(values[start:end]) for start, end in partition)
    if columns.gathered_bytes is not None:
        held["gathered_bytes"] = tuple(sum(sorted(columns.gathered_bytes[start:end])[-2:]) for start, end in partition)
    return held


def stage_memory(profile: Profile, start: int, end: int, mode: str = "none") -> tuple[float, float, float]:
    """``(stash, weight_stash, working)`` bytes of one microbatch on the stage of layers
    ``[start, end)`` under recomputation ``mode`` (see ``stage_costs``): what it keeps from F to
    B (or I), what W keeps after I, and what its backward re-creates and holds while it runs."""
    columns = profile.columns
    first = start + (input_layers(profile.layers[start:end]) if start == 0 else 0)  # layers [first, end) compute
    stashed = columns.stashed_bytes
    # Bytes kept whatever the recomputation: the model's input on stage 0, the loss buffer on the last.
    fixed = (profile.input_bytes or 0.0 if start == 0 else 0.0) + sum(stashed[start:first])
    fixed += profile.loss_bytes or 0.0 if end == profile.num_layers else 0.0
    per_layer = max(columns.recomputed_bytes[start:end], default=0.0)
    if mode == "full":
        kept = columns.activation_bytes[start - 1] if start > 0 else 0.0
        again = sum(stashed[first:end]) + per_layer
    elif mode == "selective":
        dropped = columns.selective[first:end]
        kept = sum(size for size, drop in zip(stashed[first:end], dropped, strict=True) if not drop)
        again = max((size * drop + extra for size, drop, extra
                     in zip(stashed[first:end], dropped, columns.recomputed_bytes[first:end], strict=True)), default=0.0)
    else:
        kept = sum(stashed[first:end])
        again = per_layer
    return fixed + kept, sum(columns.weight_stashed_bytes[first:end]) + fixed, again


def input_layers(layers: Sequence[Layer]) -> int:
    """How many leading layers are the model's input as a profile may give it (PipeDream's
    ``Input`` node): no forward or backward time and no weights. Nothing re-creates them."""
    count = 0
    for layer in layers:
        if layer.forward_s or layer.backward_s or layer.param_bytes:
            break
        count += 1
    return count
