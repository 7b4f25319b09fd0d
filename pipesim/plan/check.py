"""The cost model proposes, the simulation decides: every candidate plan simulated, predicted beside simulated."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pipesim.errors import ConfigError
from pipesim.plan.candidates import Proposal, propose
from pipesim.plan.compat import levels_of, pipedream_optimizer, solve_work
from pipesim.plan.costs import Chain, CostModel, CostModelName, DeviceRow, Estimate, StageSpec, estimate
from pipesim.plan.partition import Partitioner, no_plan_error
from pipesim.plan.planner import Candidate, plan_2bw, scale_profile
from pipesim.simulation import EngineName, Result, simulate_plan
from pipesim.spec.plan import Plan
from pipesim.spec.profile import Profile
from pipesim.spec.topology import Topology
from pipesim.spec.validation import build

PlannerName = Literal["pipedream", "2bw"]
COMPAT_PROPOSAL_MAX_WORK = 1e8
"""The released optimizer's plan is also a candidate where its solve costs at most this much
(``compat.solve_work``: about 0.3 s; ResNet-50's 240 states on 2 servers of 8 are 2.2e8, nasnetalarge on 16
flat 2e8)."""
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


def describe_model(model: CostModel, name: CostModelName) -> dict[str, Any]:
    """The ``cost_model`` block of the planner's output: which formulas predicted the numbers."""
    combine = ("overlap: max(compute, all-reduce) / replicas, the SOSP'19 paper's T(i->j, m)" if model.overlap
               else "add: (compute + all-reduce) / replicas, as the engine runs a replicated stage's "
                    "update on its compute stream (and as PipeDream's released optimizer adds them)")
    versions = ("one per microbatch in flight (weight stashing)" if model.weight_versions == "stash"
                else "two (double buffering)")
    return {
        "name": name,
        "chosen_by": ("PipeDream's own estimate (the released optimizer's recurrence, optimizer_graph_hierarchical.py)"
                      if name == "pipedream" else "simulation of every candidate"),
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
class Simulated:
    """One candidate plan, predicted and simulated.

    Attributes:
        label: its kind (``"analytic optimum"``, ``"data parallelism"``, 2BW: ``"depth 2 x width 8"``).
        estimate: the cost model's view; plan: the Plan the engine ran; result: the simulation.
        profile: the profile it ran (2BW: at its microbatch size).
        extra: planner-specific fields of its JSON row (2BW: depth, width, microbatch size, ...).
    """

    label: str
    estimate: Estimate
    plan: Plan
    result: Result
    profile: Profile
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def time_per_sample_s(self) -> float:
        """Simulated seconds per sample."""
        return _time_per_sample(self.result)

    def to_dict(self, *, chosen: bool) -> dict[str, Any]:
        """One row of the planner's ``candidates`` list."""
        return {
            "label": self.label,
            "chosen": chosen,
            "replication": list(self.plan.replicas or [1] * self.plan.num_stages),
            "partition": [list(bounds) for bounds in self.result.plan.partition],
            "predicted": {"time_per_sample_s": self.estimate.time_per_sample_s,
                          "peak_memory_bytes": self.estimate.peak_memory_bytes,
                          "bottleneck": self.estimate.bottleneck},
            "simulated": {"time_per_sample_s": self.time_per_sample_s,
                          "throughput_samples_per_s": self.result.metrics.throughput_samples_per_s,
                          "peak_memory_bytes": self.result.metrics.peak_memory_bytes},
            **self.extra,
        }


def _time_per_sample(result: Result) -> float:
    throughput = result.metrics.throughput_samples_per_s
    return 1.0 / throughput if throughput > 0 else math.inf


@dataclass(frozen=True)
class CheckedPlan:
    """A planner's answer, the Plan that runs it, its simulation, and the candidates it beat.

    Attributes:
        planner: ``"pipedream"`` or ``"2bw"``.
        topology: the devices and links.
        chosen: the plan returned; candidates: every plan simulated (the chosen one included).
        model, cost_model: the cost model and its name.
        num_microbatches: microbatches as the planner counts them (2BW: per pipeline and step).
        configurations: 2BW's (depth, recomputation) configurations, fitting or not.
        batch_size: 2BW's samples per step.
    """

    planner: PlannerName
    topology: Topology
    chosen: Simulated
    candidates: tuple[Simulated, ...]
    model: CostModel
    cost_model: CostModelName
    num_microbatches: int
    configurations: tuple[Candidate, ...] = field(default=())
    batch_size: int | None = None

    @property
    def profile(self) -> Profile:
        """The profile the chosen plan runs (2BW: scaled to its microbatch size)."""
        return self.chosen.profile

    @property
    def plan(self) -> Plan:
        """The chosen Plan."""
        return self.chosen.plan

    @property
    def estimate(self) -> Estimate:
        """The cost model's view of the chosen plan."""
        return self.chosen.estimate

    @property
    def result(self) -> Result:
        """The simulation of the chosen plan."""
        return self.chosen.result

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
            "cost_model": describe_model(self.model, self.cost_model),
            "simulation_model": SIMULATION_MODEL,
            "stages": stages,
            "num_microbatches": self.num_microbatches,
            "microbatch_size": self.profile.microbatch_size,
            "recompute": self.plan.recompute,
            "predicted": self.estimate.to_dict(),
            "simulated": simulated,
            "gap": _gap(self.estimate, self.result),
            "candidates": [candidate.to_dict(chosen=candidate is self.chosen) for candidate in self.candidates],
            "plan": self.plan.model_dump(mode="json", by_alias=True, exclude_none=True),
        }
        parallel = [candidate for candidate in self.candidates if candidate.label == "data parallelism"]
        if parallel:
            dp = parallel[0]
            data["data_parallel"] = {
                "predicted": dp.estimate.to_dict(),
                "simulated": _simulated(dp.result, timings),
                "speedup_predicted": dp.estimate.time_per_sample_s / self.estimate.time_per_sample_s
                if self.estimate.time_s else math.inf,
                "speedup_simulated": dp.time_per_sample_s / self.chosen.time_per_sample_s,
            }
        if self.planner == "2bw":
            data["depth"] = self.plan.num_stages
            data["width"] = self.estimate.stages[0].replicas
            data["batch_size"] = self.batch_size
            data["configurations"] = [configuration.to_dict() for configuration in self.configurations]
        return data


def _simulated(result: Result, timings: bool) -> dict[str, Any]:
    data = result.to_dict()
    data["time_per_sample_s"] = _time_per_sample(result)
    if not timings:
        for timing in Result.TIMINGS:
            data.pop(timing, None)
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
    cost_model: CostModelName = "simulated",
    memory_bytes: float = math.inf,
    straight: bool = False,
    overlap: bool = False,
    optimizer_state_multiplier: float = 1.0,
    batch_size: int | None = None,
    num_minibatches: int = 4,
    engine: EngineName = "auto",
) -> CheckedPlan:
    """Plan ``profile`` on every device of ``topology``: the cost model proposes, the simulation decides.

    PipeDream: the cost model's best plan of each kind (``pipesim.plan.candidates.propose``) runs
    the ``pipedream`` schedule with 2p microbatches per reported minibatch (at least 4;
    PipeDream updates after every microbatch and has no minibatch); the fastest simulated wins,
    ties to the better prediction. With ``cost_model="pipedream"`` the released optimizer's own
    choice (``pipesim.plan.compat``) is returned, and the other kinds are simulated beside it.
    2BW: every fitting (depth, recomputation) configuration runs the ``2bw`` schedule with the
    m x w microbatches of one step over all pipelines, on the profile scaled to its microbatch.

    Raises:
        ConfigError: an unknown planner or cost model, an optimizer state multiplier that is not
            a finite number >= 0, a batch size for PipeDream, a profile whose layers take no time,
            or no plan exists or fits.
    """
    if not (math.isfinite(optimizer_state_multiplier) and optimizer_state_multiplier >= 0):
        raise ConfigError("optimizer_state_multiplier", optimizer_state_multiplier, "must be a finite number >= 0")
    if not any(layer.forward_s or layer.backward_s for layer in profile.layers):
        raise ConfigError("layers[*].forward_s+backward_s", 0.0,
                          "must be > 0 on some layer: a plan balances the layers' compute")
    if planner == "pipedream":
        if batch_size is not None:
            raise ConfigError("batch_size", batch_size, "applies to --planner 2bw only (PipeDream updates after "
                              "every microbatch: it has no minibatch)")
        return _plan_pipedream(profile, topology, cost_model=cost_model, memory_bytes=memory_bytes, straight=straight,
                               overlap=overlap, multiplier=optimizer_state_multiplier,
                               num_minibatches=num_minibatches, engine=engine)
    if planner == "2bw":
        configured = plan_2bw(profile, topology, batch_size=batch_size, straight=straight, overlap=overlap,
                              memory_bytes=memory_bytes, optimizer_state_multiplier=optimizer_state_multiplier)
        runs = []
        for candidate in configured.configurations_that_fit():
            assert candidate.estimate is not None
            scaled = scale_profile(profile, candidate.microbatch_size)
            proposal = Proposal(f"depth {candidate.depth} x width {candidate.width}"
                                + (", recompute" if candidate.recompute else ""), candidate.stages, candidate.estimate)
            runs.append(_simulate(scaled, topology, proposal, "2bw", engine, num_minibatches,
                                  optimizer_state_multiplier, num_microbatches=candidate.num_microbatches * candidate.width,
                                  recompute=candidate.recompute, extra=candidate.to_dict()))
        best = min(runs, key=lambda run: run.time_per_sample_s)
        return CheckedPlan(planner=planner, topology=topology, chosen=best, candidates=tuple(runs),
                           model=configured.model, cost_model=cost_model,
                           num_microbatches=int(best.extra["num_microbatches"]),
                           configurations=configured.candidates, batch_size=configured.batch_size)
    raise ConfigError("planner", planner, f"must be one of {', '.join(PLANNERS)}")


def _plan_pipedream(profile: Profile, topology: Topology, *, cost_model: CostModelName, memory_bytes: float,
                    straight: bool, overlap: bool, multiplier: float, num_minibatches: int,
                    engine: EngineName) -> CheckedPlan:
    """PipeDream's planner: propose (``propose``), simulate every proposal, choose (see ``plan_and_check``)."""
    model = CostModel.named(cost_model, overlap=overlap, optimizer_state_multiplier=multiplier)
    first: tuple[str, tuple[StageSpec, ...]] | None = None
    others: tuple[tuple[str, tuple[StageSpec, ...]], ...] = ()
    if cost_model == "pipedream":
        found = pipedream_optimizer(profile, levels_of(topology), straight=straight,
                                    memory_bytes=None if math.isinf(memory_bytes) else memory_bytes)
        first = ("PipeDream's optimizer", found.stages)
        profile = found.profile  # its layers in the order its stages cut (a DAG may need another order)
    else:
        others = _released_choice(profile, topology, straight)
    chain, row = Chain.from_profile(profile), DeviceRow.from_topology(topology)
    proposals = propose(chain, row, model, memory_bytes=memory_bytes, straight=straight, first=first, others=others)
    if not proposals:
        solver = Partitioner(chain, row, model, replicas="straight" if straight else "free")
        least = solver.smallest()
        raise no_plan_error(memory_bytes, solver.memory_of(least) if least else None,
                            "straight" if straight else "PipeDream")
    if cost_model == "pipedream":
        head = proposals[0]
        objective = replace(head.estimate, time_s=found.time_per_minibatch_s,
                                        bottleneck="PipeDream's objective A[0][S-1][M-1]")
        proposals[0] = Proposal(head.label, head.stages, objective)
    simulated = tuple(_simulate(profile, topology, proposal, "pipedream", engine, num_minibatches, multiplier)
                      for proposal in proposals)
    chosen = simulated[0] if cost_model == "pipedream" else min(simulated, key=lambda c: c.time_per_sample_s)
    return CheckedPlan(planner="pipedream", topology=topology, chosen=chosen, candidates=simulated, model=model,
                       cost_model=cost_model, num_microbatches=chosen.plan.num_microbatches)


def _released_choice(profile: Profile, topology: Topology, straight: bool) -> tuple[tuple[str, tuple[StageSpec, ...]], ...]:
    """The released optimizer's plan as one more candidate; none where it finds none, the topology
    has no PipeDream levels, the solve would cost more than ``COMPAT_PROPOSAL_MAX_WORK``, or its
    stages cut a DAG where the profile's layer order has no boundary."""
    try:
        levels = levels_of(topology)
        if solve_work(profile, levels) > COMPAT_PROPOSAL_MAX_WORK:
            return ()
        found = pipedream_optimizer(profile, levels, straight=straight)
    except ConfigError:
        return ()
    if found.profile is not profile:
        return ()
    return (("PipeDream's optimizer", found.stages),)


def check_stages(profile: Profile, topology: Topology, stages: tuple[StageSpec, ...], *, label: str,
                 cost_model: CostModelName = "simulated", num_minibatches: int = 4,
                 engine: EngineName = "auto") -> Simulated:
    """Any PipeDream plan, predicted and simulated as the planner's candidates are.

    ``stages`` are ``(start, end, replicas)`` on consecutive devices ending at the last one.
    """
    model = CostModel.named(cost_model)
    proposal = Proposal(label, stages, estimate(Chain.from_profile(profile), DeviceRow.from_topology(topology),
                                                model, stages))
    return _simulate(profile, topology, proposal, "pipedream", engine, num_minibatches, 1.0)


def _simulate(profile: Profile, topology: Topology, proposal: Proposal, schedule: str, engine: EngineName,
              num_minibatches: int, optimizer_state_multiplier: float, *, num_microbatches: int | None = None,
              recompute: bool = False, extra: dict[str, Any] | None = None) -> Simulated:
    m = num_microbatches if num_microbatches is not None else max(4, 2 * len(proposal.stages))
    plan = make_pipeline_plan(proposal.stages, schedule=schedule, num_devices=topology.num_devices,
                              num_microbatches=m, num_minibatches=num_minibatches, recompute=recompute,
                              optimizer_state_multiplier=optimizer_state_multiplier)
    return Simulated(label=proposal.label, estimate=proposal.estimate, plan=plan,
                     result=simulate_plan(profile, topology, plan, engine=engine), profile=profile,
                     extra=extra or {})
