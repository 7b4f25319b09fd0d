"""Plan: how a model is cut into stages and which schedule runs it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pipesim.errors import ConfigError
from pipesim.spec.validation import Bool, Float, FrozenModel, Int

PLAN_SCHEMA = "pipesim.plan/1"
#: Schedules that split every backward into I and W ops run apart (three compute ops per stage and
#: microbatch); the registry's SPLIT_BACKWARD. Here because stage costs need it (spec imports no schedule).
SPLIT_BACKWARD_SCHEDULES = frozenset({"interleaved-zb", "zbv", "dualpipev", "zb-h1", "zb-h2", "zb-auto"})
#: The name a schedule read from a CSV file runs under (``schedule.csv_format``): its ops say whether W
#: runs apart.
CUSTOM_SCHEDULE = "custom"


class Plan(FrozenModel):
    """Everything about a run that is neither the model's profile nor the hardware.

    Attributes:
        schema_: ``"pipesim.plan/1"`` (``"schema"`` in JSON).
        schedule: registry key of the schedule, e.g. ``"1f1b"``.
        num_stages: pipeline stages.
        num_microbatches: microbatches per minibatch (one optimizer step).
        num_minibatches: minibatches (steps) to run.
        partition: per stage, the half-open layer range ``[start, end)``; empty = balance compute.
        replicas: per stage, data-parallel replicas (empty = 1 each); they add a gradient
            all-reduce before the stage's update, and more with ``replica_model``.
        replica_model: what a replicated stage is. ``"allreduce-only"`` (default): the
            simulated stage is one of its replicas (as one of several identical pipelines); the
            replicas only add the all-reduce, at the topology's default bandwidth.
            ``"round-robin"``: PipeDream's replicated stage, microbatches dealt round-robin to the
            replicas on devices ``placement .. placement + r - 1``: the stage runs r times as fast
            on its first device and all-reduces over that ring (see
            ``pipesim.spec.stages.stage_costs``); ``num_microbatches`` counts the microbatches of
            all replicas together.
        placement: per stage, the device index it runs on (empty = stage s on device s).
        stages_per_rank: model stages on each rank (device); ``num_stages`` counts them all,
            so the pipeline has ``num_stages / stages_per_rank`` ranks. Where they go (loop or V)
            is the schedule's business.
        recompute: activation recomputation on every stage: keep only a stage's input per
            microbatch and re-run its forward before its backward (``"full"``).
        recompute_stages: per stage, ``"none"``, ``"full"`` or ``"selective"`` (drop the stash of
            the layers marked for selective recomputation and re-run only their forward);
            overrides ``recompute`` when given.
        optimizer_state_multiplier: optimizer state bytes per weight byte (SGD+momentum 1, Adam 2).
        pipemare_update: PipeMare's update cadence, once per ``"minibatch"`` or per ``"microbatch"``.
        zb_memory_limit: zb-auto's memory limit, the activations a stage may hold in microbatches
            (units of the most one microbatch keeps on any stage); None: ``num_stages`` (ZB-1p).
            ``2 * num_stages`` is ZB-2p.
        pipemare_model: PipeMare's device: ``"1f1b"``, a stage alternating F and B on a 1F1B
            order, or ``"paper"``, the PipeMare paper's pipeline, a stage running one forward
            and one backward at once in every time step.
        fb_chunks: how dualpipev runs its paired forward and backward: ``"dualpipe"``, one
            overlapped chunk that waits for both inputs (deepseek-ai/DualPipe), or ``"torch"``,
            one after the other (torch's runtime for OVERLAP_F_B).
        fb_overlap: share of the shorter op of a ``"dualpipe"`` chunk hidden under the longer:
            the chunk takes F + B - fb_overlap x min(F, B) (0: F + B).
    """

    schema_: str = Field(default=PLAN_SCHEMA, alias="schema")
    schedule: str
    num_stages: Int = Field(ge=1)
    num_microbatches: Int = Field(ge=1)
    num_minibatches: Int = Field(default=1, ge=1)
    partition: tuple[tuple[Int, Int], ...] = ()
    replicas: tuple[Int, ...] = ()
    placement: tuple[Int, ...] = ()
    stages_per_rank: Int = Field(default=1, ge=1)
    recompute: Bool = False
    recompute_stages: tuple[Literal["none", "full", "selective"], ...] = ()
    optimizer_state_multiplier: Float = Field(default=1.0, ge=0)
    pipemare_update: Literal["minibatch", "microbatch"] = "minibatch"
    pipemare_model: Literal["1f1b", "paper"] = "1f1b"
    fb_chunks: Literal["dualpipe", "torch"] = "dualpipe"
    fb_overlap: Float = Field(default=0.0, ge=0, le=1)
    replica_model: Literal["allreduce-only", "round-robin"] = "allreduce-only"
    zb_memory_limit: Float | None = Field(default=None, gt=0)

    model_config = FrozenModel.model_config | {"populate_by_name": True}

    @model_validator(mode="after")
    def _check(self) -> Plan:
        if self.schema_ != PLAN_SCHEMA:
            raise ConfigError("schema", self.schema_, f"must be {PLAN_SCHEMA!r}")
        if self.num_stages % self.stages_per_rank:
            raise ConfigError("num_stages", self.num_stages,
                              f"must be a multiple of stages_per_rank ({self.stages_per_rank})")
        for name in ("partition", "replicas", "placement", "recompute_stages"):
            given = getattr(self, name)
            if given and len(given) != self.num_stages:
                raise ConfigError(name, [list(item) if isinstance(item, tuple) else item for item in given],
                                  f"must have one entry per stage ({len(given)} entries, num_stages: "
                                  f"{self.num_stages})")
        for index, replicas in enumerate(self.replicas):
            if replicas < 1:
                raise ConfigError(f"replicas[{index}]", replicas, "must be >= 1")
        for index, device in enumerate(self.placement):
            if device < 0:
                raise ConfigError(f"placement[{index}]", device, "must be a device index >= 0")
        expected_start = 0
        for index, (start, end) in enumerate(self.partition):
            if start != expected_start or end <= start:
                raise ConfigError(f"partition[{index}]", [start, end],
                                  f"must be a non-empty layer range starting at {expected_start}: stages cut "
                                  "the layers into contiguous ranges from layer 0")
            expected_start = end
        self._one_rank_per_device()
        return self

    def _one_rank_per_device(self) -> None:
        """Refuse a placement that puts two ranks on one device: a device takes ``stages_per_rank``
        stages (the ranks' stages share a device, ``pipesim.simulation.rank_devices``), and a
        ``"round-robin"`` stage's replicas take devices ``placement .. placement + r - 1``."""
        holders: dict[int, list[int]] = {}
        for stage, first in enumerate(self.placement):
            width = self.replicas_of(stage) if self.replica_model == "round-robin" else 1
            for device in range(first, first + width):
                holders.setdefault(device, []).append(stage)
                if len(holders[device]) > self.stages_per_rank:
                    others = ", ".join(map(str, holders[device][:-1]))
                    raise ConfigError(f"placement[{stage}]", first,
                                      f"device {device} already runs stage{'s' if len(holders[device]) > 2 else ''} "
                                      f"{others}: a device runs one rank ({self.stages_per_rank} "
                                      f"stage{'s' if self.stages_per_rank > 1 else ''})")

    def replicas_of(self, stage: int) -> int:
        """Data-parallel replicas of ``stage`` (1 when not given)."""
        return self.replicas[stage] if self.replicas else 1

    @property
    def num_devices(self) -> int:
        """Devices the plan occupies: one per rank, and one per replica of a ``"round-robin"`` stage."""
        if self.replica_model == "round-robin" and self.stages_per_rank == 1:
            return sum(self.replicas_of(stage) for stage in range(self.num_stages))
        return self.num_ranks

    @property
    def num_ranks(self) -> int:
        """Ranks (devices) of the pipeline: ``num_stages / stages_per_rank``."""
        return self.num_stages // self.stages_per_rank

    def recompute_of(self, stage: int) -> Literal["none", "full", "selective"]:
        """Recomputation mode of ``stage``: from ``recompute_stages``, else ``recompute``."""
        if self.recompute_stages:
            return self.recompute_stages[stage]
        return "full" if self.recompute else "none"

    def device_of(self, stage: int) -> int:
        """Device index that runs ``stage`` with one stage per rank (placement, else stage s on
        device s); with several stages per rank the schedule's placement decides (see
        ``pipesim.simulation.stage_devices``)."""
        return self.placement[stage] if self.placement else stage
