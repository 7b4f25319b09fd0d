"""Plan: how a model is cut into stages and which schedule runs it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pipesim.spec.validation import FrozenModel

PLAN_SCHEMA = "pipesim.plan/1"


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
        recompute: activation recomputation: keep only a stage's input per microbatch and
            re-run its forward before its backward.
        optimizer_state_multiplier: optimizer state bytes per weight byte (SGD+momentum 1, Adam 2).
        pipemare_update: PipeMare's update cadence, once per ``"minibatch"`` or per ``"microbatch"``.
    """

    schema_: str = Field(default=PLAN_SCHEMA, alias="schema")
    schedule: str
    num_stages: int = Field(ge=1)
    num_microbatches: int = Field(ge=1)
    num_minibatches: int = Field(default=1, ge=1)
    partition: tuple[tuple[int, int], ...] = ()
    replicas: tuple[int, ...] = ()
    placement: tuple[int, ...] = ()
    recompute: bool = False
    optimizer_state_multiplier: float = Field(default=1.0, ge=0)
    pipemare_update: Literal["minibatch", "microbatch"] = "minibatch"
    replica_model: Literal["allreduce-only", "round-robin"] = "allreduce-only"

    model_config = FrozenModel.model_config | {"populate_by_name": True}

    @model_validator(mode="after")
    def _check(self) -> Plan:
        if self.schema_ != PLAN_SCHEMA:
            raise ValueError(f"schema must be {PLAN_SCHEMA!r}")
        for name in ("partition", "replicas", "placement"):
            given = getattr(self, name)
            if given and len(given) != self.num_stages:
                raise ValueError(
                    f"{name} must have one entry per stage ({name}: {len(given)}, num_stages: {self.num_stages})"
                )
        if any(r < 1 for r in self.replicas):
            raise ValueError(f"replicas must all be >= 1, got {list(self.replicas)}")
        if any(d < 0 for d in self.placement):
            raise ValueError(f"placement must hold device indices >= 0, got {list(self.placement)}")
        expected_start = 0
        for index, (start, end) in enumerate(self.partition):
            if start != expected_start or end <= start:
                raise ValueError(
                    f"partition must be contiguous non-empty ranges from layer 0; stage {index} is "
                    f"[{start}, {end}) but should start at {expected_start}"
                )
            expected_start = end
        return self

    def replicas_of(self, stage: int) -> int:
        """Data-parallel replicas of ``stage`` (1 when not given)."""
        return self.replicas[stage] if self.replicas else 1

    def device_of(self, stage: int) -> int:
        """Device index that runs ``stage``."""
        return self.placement[stage] if self.placement else stage
