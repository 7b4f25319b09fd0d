"""Proven lower bounds on a pipeline's step time and per-device peak memory, for pruning a search.

Step time. On one rank ops run one at a time, each for at least its duration, and a stage's
optimizer step (U) comes after its last backward. Let head(s) be the forward of one
microbatch from stage 0 to the input of stage s (the stages' F and the sends between ranks),
tail_B(s) (tail_I(s)) the backward from stage s's output gradient back through stage 0 (B, or
I when the backward is split). Rank r, whose first stage is s_r, cannot start before head(s_r),
then runs all its work: step >= head(s_r) + M sum(F + B) + U_r. With a fused backward its last
op but U is some stage's B (s >= s_r), after which the gradient must still cross stages s-1..0
and stage 0 then steps: step >= head(s_r) + M sum(F + B) + tail_B(s_r) + U(stage 0).
With a split backward (I, W) the rank's last I comes after all its F and I: step >= head(s_r) +
M sum(F + I) + tail_I(s_r) + U(stage 0). The bound is the largest of these over ranks; with equal
stages it is the 1F1B bubble (p-1)(F+B) exactly, and it leaves out only what contention and
the schedule's own waits add.

Memory. A rank holds its stages' weights, gradients and optimizer state throughout (and under
ZeRO-3 the two largest layers gathered), and at the end of each F the stash of every microbatch
whose F has ended and whose B (or I) has not; at the start of a B or I also what its
recomputation re-creates. The counts follow the rank's op order alone (``InFlight``), so the
bound is the engine's peak exactly for fused backward and a lower bound for split backward
(where W still holds part of a stash after I).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pipesim.schedule.ir import B_CODE, F_CODE, I_CODE, Schedule
from pipesim.spec.profile import Profile
from pipesim.spec.sharding import ADAM_STATE_MULTIPLIER
from pipesim.spec.stages import StageCosts, stage_memory
from pipesim.spec.topology import Topology

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class StageTimes:
    """Per stage: forward, backward (B = I + W), input and weight gradient, update seconds, and
    the bytes its output sends."""

    forward: FloatArray
    backward: FloatArray
    input_grad: FloatArray
    update: FloatArray
    output_bytes: FloatArray

    @classmethod
    def of_costs(cls, costs: StageCosts) -> StageTimes:
        """The stage costs the engine runs on, exactly."""
        backward = np.asarray(costs.backward_s, dtype=np.float64)
        return cls(forward=np.asarray(costs.forward_s, dtype=np.float64), backward=backward,
                   input_grad=backward if costs.backward_input_s is None
                   else np.asarray(costs.backward_input_s, dtype=np.float64),
                   update=np.asarray(costs.update_s, dtype=np.float64),
                   output_bytes=np.asarray(costs.output_bytes, dtype=np.float64))

    @classmethod
    def of_profile(cls, profile: Profile, partition: Sequence[tuple[int, int]]) -> StageTimes:
        """A transformer profile's stage sums without its updates (zero: a lower bound on them)."""
        return LayerSums.of(profile).stages(partition)


@dataclass(frozen=True)
class LayerSums:
    """A profile's layer columns as running sums, so that any stage's sum is one subtraction."""

    forward: FloatArray
    backward: FloatArray
    input_grad: FloatArray
    params: FloatArray
    activation_bytes: FloatArray

    @classmethod
    def of(cls, profile: Profile) -> LayerSums:
        columns = profile.columns

        def running(values: Sequence[float]) -> FloatArray:
            return np.concatenate(([0.0], np.cumsum(np.asarray(values, dtype=np.float64))))

        backward = running(columns.backward_s)
        return cls(forward=running(columns.forward_s), backward=backward,
                   input_grad=running(columns.backward_input_s) if profile.has_split_backward else backward,
                   params=running(columns.param_bytes),
                   activation_bytes=np.asarray(columns.activation_bytes, dtype=np.float64))

    def stages(self, partition: Sequence[tuple[int, int]]) -> StageTimes:
        starts = np.array([start for start, _ in partition])
        ends = np.array([end for _, end in partition])
        return StageTimes(forward=self.forward[ends] - self.forward[starts],
                          backward=self.backward[ends] - self.backward[starts],
                          input_grad=self.input_grad[ends] - self.input_grad[starts],
                          update=np.zeros(len(partition)), output_bytes=self.activation_bytes[ends - 1])


def step_lower_bound(times: StageTimes, stage_to_rank: Sequence[int], num_microbatches: int, *, split: bool,
                     latency_s: float, bandwidth_bytes_per_s: float) -> float:
    """A step time no run of this schedule beats (module docstring): rank r on device r, every
    pair of devices joined at one latency and bandwidth (``Topology.uniform``)."""
    ranks = np.asarray(stage_to_rank, dtype=np.int64)
    num_stages = len(ranks)
    remote = ranks[1:] != ranks[:-1]
    hop = np.where(remote, latency_s + times.output_bytes[:-1] / bandwidth_bytes_per_s, 0.0)
    hops_forward = hops_backward = hop
    head = np.concatenate(([0.0], np.cumsum(times.forward[:-1] + hops_forward)))
    back = times.input_grad if split else times.backward
    tail = np.concatenate(([0.0], np.cumsum(back[:-1] + hops_backward)))
    num_ranks = int(ranks.max()) + 1
    first = np.full(num_ranks, num_stages)
    np.minimum.at(first, ranks, np.arange(num_stages))
    work = np.bincount(ranks, times.forward + times.backward, minlength=num_ranks) * num_microbatches
    update = np.bincount(ranks, times.update, minlength=num_ranks)
    closing = times.update[0]  # stage 0's own step; the first rank's other stages may step earlier
    whole = head[first] + work + update
    if split:
        until_input = np.bincount(ranks, times.forward + times.input_grad, minlength=num_ranks) * num_microbatches
        chained = head[first] + until_input + tail[first] + closing
    else:
        chained = head[first] + work + tail[first] + closing
    return float(max(whole.max(), chained.max()))


@dataclass(frozen=True)
class InFlight:
    """Per rank, the microbatches each of its stages holds at the moments its memory can peak:
    ``at_forward[r]`` rows (one column per local stage) at each F's end; ``at_backward[r]``
    (rows, the local stage starting) at each B's or I's start."""

    local_stages: tuple[tuple[int, ...], ...]
    stage_to_rank: tuple[int, ...]
    at_forward: tuple[FloatArray, ...]
    at_backward: tuple[tuple[npt.NDArray[np.int64], FloatArray], ...]

    @classmethod
    def of(cls, schedule: Schedule) -> InFlight:
        table = schedule.table
        offsets = table.rank_offsets
        locals_, forwards, backwards = [], [], []
        for rank in range(schedule.num_ranks):
            stage = table.stage[offsets[rank]:offsets[rank + 1]]
            kind = table.kind[offsets[rank]:offsets[rank + 1]]
            mine = tuple(int(s) for s in np.unique(stage))
            column = np.searchsorted(np.asarray(mine), stage)
            delta = np.zeros((stage.shape[0], len(mine)), dtype=np.int64)
            rows = np.arange(stage.shape[0])
            delta[rows, column] = np.where(kind == F_CODE, 1, np.where((kind == B_CODE) | (kind == I_CODE), -1, 0))
            held = np.cumsum(delta, axis=0)
            is_forward = kind == F_CODE
            is_backward = (kind == B_CODE) | (kind == I_CODE)
            before = held[is_backward] - delta[is_backward]  # at its start, its own microbatch still held
            locals_.append(mine)
            forwards.append(np.ascontiguousarray(held[is_forward], dtype=np.float64))
            backwards.append((column[is_backward], np.ascontiguousarray(before, dtype=np.float64)))
        return cls(local_stages=tuple(locals_), stage_to_rank=tuple(int(r) for r in schedule.stage_to_rank),
                   at_forward=tuple(forwards), at_backward=tuple(backwards))


def static_bytes(costs: StageCosts, optimizer_state_multiplier: float) -> FloatArray:
    """Per stage, what it holds throughout: weights (and gathered weights), gradients, optimizer state."""
    params = np.asarray(costs.param_bytes, dtype=np.float64)
    gathered = np.zeros_like(params) if costs.gathered_bytes is None else np.asarray(costs.gathered_bytes)
    gradients = params if costs.gradient_bytes is None else np.asarray(costs.gradient_bytes, dtype=np.float64)
    optimizer = params * optimizer_state_multiplier if costs.optimizer_bytes is None \
        else np.asarray(costs.optimizer_bytes, dtype=np.float64)
    return np.asarray(params + gathered + gradients + optimizer, dtype=np.float64)


def peak_lower_bound(costs: StageCosts, inflight: InFlight, optimizer_state_multiplier: float) -> float:
    """The largest device peak no run of this order goes below (module docstring)."""
    static = static_bytes(costs, optimizer_state_multiplier)
    stash = np.asarray(costs.stash_bytes, dtype=np.float64)
    working = np.zeros_like(stash) if costs.working_bytes is None else np.asarray(costs.working_bytes)
    ranks = np.asarray(inflight.stage_to_rank)
    held = np.bincount(ranks, static, minlength=len(inflight.local_stages))
    return float((held + activation_peaks(stash, working, inflight)).max())


def activation_peaks(stash: FloatArray, working: FloatArray, inflight: InFlight) -> FloatArray:
    """Per rank, the most its in-flight stashes (and a backward's re-created bytes) hold, from
    per-stage stash and working bytes."""
    held = np.zeros(len(inflight.local_stages))
    for rank, (mine, forward, (stage_column, backward)) in enumerate(zip(
            inflight.local_stages, inflight.at_forward, inflight.at_backward, strict=True)):
        local = np.asarray(mine)
        if forward.size:
            held[rank] = float((forward @ stash[local]).max())
        if backward.size:
            held[rank] = max(held[rank], float((backward @ stash[local] + working[local[stage_column]]).max()))
    return held


@dataclass(frozen=True)
class StageMemory:
    """One cut of a profile: per stage its weights, one microbatch's stash and what its backward
    re-creates (``stage_memory``); shared by every schedule that cuts the profile so."""

    weights: FloatArray
    stash: FloatArray
    working: FloatArray

    @classmethod
    def of(cls, profile: Profile, sums: LayerSums, partition: Sequence[tuple[int, int]]) -> StageMemory:
        starts = np.array([start for start, _ in partition])
        ends = np.array([end for _, end in partition])
        memory = [stage_memory(profile, start, end) for start, end in partition]
        return cls(weights=np.asarray(sums.params[ends] - sums.params[starts], dtype=np.float64),
                   stash=np.array([held[0] for held in memory]), working=np.array([held[2] for held in memory]))


@dataclass(frozen=True)
class ShapeMemory:
    """What one cut of an op shape's profile (built without ZeRO) holds per rank: its weights, and
    per stage one microbatch's stash and what its backward re-creates (``stage_memory``)."""

    weights: FloatArray
    stash: FloatArray
    working: FloatArray
    stage_to_rank: tuple[int, ...]

    @classmethod
    def of(cls, stages: StageMemory, stage_to_rank: Sequence[int]) -> ShapeMemory:
        ranks = np.asarray(stage_to_rank, dtype=np.int64)
        return cls(weights=np.asarray(np.bincount(ranks, stages.weights, minlength=int(ranks.max()) + 1),
                                      dtype=np.float64),
                   stash=stages.stash, working=stages.working, stage_to_rank=tuple(int(rank) for rank in ranks))

    def static(self, *, replicas: int, zero: int) -> FloatArray:
        """Per rank, weights, gradients and Adam state as ZeRO stage ``zero`` shards them over at
        most ``replicas`` ranks (experts shard over fewer, ZeRO-3 also gathers: a lower bound)."""
        share = [1.0 / replicas if zero >= level else 1.0 for level in (3, 2, 1)]
        return np.asarray(self.weights * (share[0] + share[1] + ADAM_STATE_MULTIPLIER * share[2]), dtype=np.float64)

    def lightest(self) -> FloatArray:
        """Per rank, one microbatch's stash of its lightest stage (held at the end of its first F)."""
        ranks = np.asarray(self.stage_to_rank)
        least = np.full(self.weights.shape[0], np.inf)
        np.minimum.at(least, ranks, self.stash)
        return least

    def activations(self, inflight: InFlight) -> FloatArray:
        """Per rank, the most its in-flight stashes (and a backward's re-created bytes) hold."""
        return activation_peaks(self.stash, self.working, inflight)
