"""Every plan checked by simulation: the planners' answers as Plans, simulated, predicted beside simulated."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from pipesim.errors import ConfigError
from pipesim.plan.costs import CostModel, Estimate, StageSpec
from pipesim.plan.partition import partition
from pipesim.plan.planner import Candidate, plan_2bw, scale_profile
from pipesim.simulation import EngineName, Result, simulate_plan
from pipesim.spec.plan import Plan
from pipesim.spec.profile import Profile
from pipesim.spec.topology import Topology
from pipesim.spec.validation import build

PlannerName = Literal["pipedream", "2bw"]
PLANNERS: tuple[PlannerName, ...] = ("pipedream", "2bw")

SIMULATION_MODEL = (
    "a stage with r replicas runs as one pipeline stage on its first device with its compute divided "
    "by r (PipeDream's own approximation of microbatches dealt round-robin to replicas); its update "
    "carries a ring all-reduce, 2(r-1)/r x weight bytes over the ring's slowest link (1/r of it per "
    "update when weights update after every microbatch); activations and gradients cross one link per "
    "direction between the stages' first devices. The memory it reports for a replicated stage is that "
    "stage's: p-s microbatches in flight on one device, where the cost model gives each replica "
    "ceil(devices to the end / r)"
)


def describe_model(model: CostModel) -> dict[str, Any]:
    """The ``cost_model`` block of the planner's output: which formulas predicted the numbers."""
    combine = ("overlap: max(compute, all-reduce) / replicas, the SOSP'19 paper's T(i->j, m)" if model.overlap
               else "add: (compute + all-reduce) / replicas, as PipeDream's released optimizer "
                    "(optimizer_graph_hierarchical.py) computes it")
    versions = ("one per microbatch in flight (weight stashing)" if model.weight_versions == "stash"
                else "two (double buffering)")
    return {
        "compute_and_allreduce": "overlap" if model.overlap else "add",
        "stage_time": combine,
        "allreduce": f"{model.allreduce_factor:g} (r-1)/r x stage weight bytes / ring bandwidth"
                     + (f", once per {model.microbatches_per_allreduce} microbatches"
                        if model.microbatches_per_allreduce > 1 else ""),
        "transfer": f"{model.transfer_factor:g} x activation bytes / link bandwidth between the stages' first devices",
        "memory": f"weights x versions ({versions}) + one gradient buffer + optimizer state "
                  f"({model.optimizer_state_multiplier:g} x weights) + stashed activations x "
                  "ceil(devices to the pipeline's end / replicas) microbatches in flight",
    }


@dataclass(frozen=True)
class CheckedPlan:
    """A planner's answer, the Plan that runs it, and its simulation.

    Attributes:
        planner: ``"pipedream"`` or ``"2bw"``.
        profile: the profile the plan runs (2BW: scaled to its microbatch size).
        topology: the devices and links.
        plan: the Plan (``pipesim.plan/1``) the engine ran.
        estimate: the cost model's prediction; model: the cost model.
        result: the simulation of ``plan``.
        num_microbatches: microbatches as the planner counts them (2BW: per pipeline and step).
        data_parallel, data_parallel_result: data parallelism on all devices, predicted and simulated.
        candidates: 2BW's configurations; batch_size: 2BW's samples per step.
    """

    planner: PlannerName
    profile: Profile
    topology: Topology
    plan: Plan
    estimate: Estimate
    model: CostModel
    result: Result
    num_microbatches: int
    data_parallel: Estimate | None = None
    data_parallel_result: Result | None = None
    candidates: tuple[Candidate, ...] = field(default=())
    batch_size: int | None = None

    def to_dict(self, *, timings: bool = True) -> dict[str, Any]:
        """The ``pipesim plan --json`` object; ``timings=False`` drops engine wall times (for files)."""
        simulated = _simulated(self.result, timings)
        metrics = self.result.metrics
        stages = []
        for stage, sim in zip(self.estimate.stages, metrics.stages, strict=True):
            stages.append({
                "layers": [stage.start, stage.end],
                "replicas": stage.replicas,
                "devices": [stage.first_device, stage.first_device + stage.replicas - 1],
                "predicted": {
                    "time_s": stage.time_s, "compute_s": stage.compute_s, "allreduce_s": stage.allreduce_s,
                    "transfer_s": stage.transfer_s, "inflight_microbatches": stage.inflight,
                    "memory_bytes": stage.memory_bytes,
                },
                "simulated": {"utilization": sim.utilization, "peak_memory_bytes": sim.peak_memory_bytes,
                              "max_inflight_microbatches": sim.max_inflight_microbatches},
            })
        data: dict[str, Any] = {
            "planner": self.planner,
            "profile": self.profile.name,
            "num_devices": self.topology.num_devices,
            "cost_model": describe_model(self.model),
            "simulation_model": SIMULATION_MODEL,
            "stages": stages,
            "num_microbatches": self.num_microbatches,
            "microbatch_size": self.profile.microbatch_size,
            "recompute": self.plan.recompute,
            "predicted": self.estimate.to_dict(),
            "simulated": simulated,
            "gap": _gap(self.estimate, self.result),
            "plan": self.plan.model_dump(mode="json", by_alias=True, exclude_none=True),
        }
        if self.data_parallel is not None and self.data_parallel_result is not None:
            sim_dp = self.data_parallel_result.metrics.throughput_samples_per_s
            data["data_parallel"] = {
                "predicted": self.data_parallel.to_dict(),
                "simulated": _simulated(self.data_parallel_result, timings),
                "speedup_predicted": self.data_parallel.time_s / self.estimate.time_s if self.estimate.time_s else math.inf,
                "speedup_simulated": metrics.throughput_samples_per_s / sim_dp if sim_dp else math.inf,
            }
        if self.planner == "2bw":
            data["depth"] = self.plan.num_stages
            data["width"] = self.estimate.stages[0].replicas
            data["batch_size"] = self.batch_size
            data["candidates"] = [candidate.to_dict() for candidate in self.candidates]
        return data


def _simulated(result: Result, timings: bool) -> dict[str, Any]:
    data = result.to_dict()
    if not timings:
        data.pop("engine_wall_s", None)
    return data


def _gap(predicted: Estimate, result: Result) -> dict[str, float]:
    sim = result.metrics
    return {
        "throughput_simulated_over_predicted": sim.throughput_samples_per_s / predicted.throughput_samples_per_s,
        "peak_memory_simulated_over_predicted": sim.peak_memory_bytes / predicted.peak_memory_bytes
        if predicted.peak_memory_bytes else math.nan,
    }


def make_pipeline_plan(
    stages: tuple[StageSpec, ...],
    *,
    schedule: str,
    num_devices: int,
    num_microbatches: int,
    num_minibatches: int,
    recompute: bool = False,
    optimizer_state_multiplier: float = 1.0,
) -> Plan:
    """The Plan of ``stages`` (``(start, end, replicas)``) on consecutive devices ending at the last one.

    Replicated stages are PipeDream's (``replica_model="round-robin"``): r times as fast, all-reducing
    over their own devices.
    """
    first = num_devices - sum(replicas for _, _, replicas in stages)
    placement = []
    for _, _, replicas in stages:
        placement.append(first)
        first += replicas
    return build(Plan, {
        "schedule": schedule,
        "num_stages": len(stages),
        "num_microbatches": num_microbatches,
        "num_minibatches": num_minibatches,
        "partition": [[start, end] for start, end, _ in stages],
        "replicas": [replicas for _, _, replicas in stages],
        "placement": placement,
        "recompute": recompute,
        "optimizer_state_multiplier": optimizer_state_multiplier,
        "replica_model": "round-robin",
    })


def plan_and_check(
    profile: Profile,
    topology: Topology,
    *,
    planner: PlannerName = "pipedream",
    memory_bytes: float = math.inf,
    straight: bool = False,
    overlap: bool = False,
    optimizer_state_multiplier: float = 1.0,
    batch_size: int | None = None,
    num_minibatches: int = 4,
    engine: EngineName = "auto",
) -> CheckedPlan:
    """Plan ``profile`` on every device of ``topology``, then simulate the plan.

    PipeDream plans run the ``pipedream`` schedule with 2p microbatches per reported minibatch
    (PipeDream itself updates after every microbatch and has no minibatch) and are compared with
    data parallelism on all devices. 2BW plans run the ``2bw`` schedule with the m x w
    microbatches of one step over all pipelines, on the profile scaled to the chosen microbatch.

    Raises:
        ConfigError: an unknown planner, or no plan exists or fits (see the planners).
    """
    n = topology.num_devices
    if planner == "pipedream":
        found = partition(profile, topology, straight=straight, overlap=overlap, memory_bytes=memory_bytes,
                          optimizer_state_multiplier=optimizer_state_multiplier)
        m = max(4, 2 * len(found.stages))
        plan = make_pipeline_plan(found.stages, schedule="pipedream", num_devices=n, num_microbatches=m,
                                  num_minibatches=num_minibatches, optimizer_state_multiplier=optimizer_state_multiplier)
        dp_plan = make_pipeline_plan(((0, profile.num_layers, n),), schedule="pipedream", num_devices=n,
                                     num_microbatches=4, num_minibatches=num_minibatches,
                                     optimizer_state_multiplier=optimizer_state_multiplier)
        return CheckedPlan(
            planner=planner, profile=profile, topology=topology, plan=plan, estimate=found.estimate,
            model=found.model, result=simulate_plan(profile, topology, plan, engine=engine), num_microbatches=m,
            data_parallel=found.data_parallel,
            data_parallel_result=simulate_plan(profile, topology, dp_plan, engine=engine),
        )
    if planner == "2bw":
        chosen = plan_2bw(profile, topology, batch_size=batch_size, straight=straight, overlap=overlap,
                          memory_bytes=memory_bytes, optimizer_state_multiplier=optimizer_state_multiplier)
        best = chosen.best
        assert best.estimate is not None
        scaled = scale_profile(profile, best.microbatch_size)
        plan = make_pipeline_plan(best.stages, schedule="2bw", num_devices=n,
                                  num_microbatches=best.num_microbatches * best.width, num_minibatches=num_minibatches,
                                  recompute=best.recompute, optimizer_state_multiplier=optimizer_state_multiplier)
        return CheckedPlan(
            planner=planner, profile=scaled, topology=topology, plan=plan, estimate=best.estimate,
            model=chosen.model, result=simulate_plan(scaled, topology, plan, engine=engine),
            num_microbatches=best.num_microbatches, candidates=chosen.candidates, batch_size=chosen.batch_size,
        )
    raise ConfigError("planner", planner, f"must be one of {', '.join(PLANNERS)}")
