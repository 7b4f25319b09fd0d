"""``simulate``: profile + topology + plan in, Trace and Metrics out; the API the CLI wraps."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from pipesim.engine.analytic import analytic_unsupported, run_analytic
from pipesim.engine.des import run_des
from pipesim.engine.lowering import Program, lower
from pipesim.engine.trace import Trace
from pipesim.errors import ConfigError
from pipesim.metrics import Metrics, compute_metrics
from pipesim.schedule.ir import Schedule
from pipesim.schedule.registry import build_schedule, default_num_minibatches
from pipesim.spec.plan import Plan
from pipesim.spec.profile import Profile
from pipesim.spec.stages import balance_partition, stage_costs
from pipesim.spec.topology import Topology

EngineName = Literal["des", "analytic", "auto"]


@dataclass(frozen=True)
class Result:
    """One simulation: the plan it ran, the schedule, the trace, its metrics, and engine timing.

    Attributes:
        plan: the plan, with the partition filled in.
        schedule: the schedule that ran.
        trace: what the engine recorded.
        metrics: ``compute_metrics(trace)``.
        engine_wall_s: seconds the engine itself took (lowering and metrics excluded).
    """

    plan: Plan
    schedule: Schedule
    trace: Trace
    metrics: Metrics
    engine_wall_s: float

    def to_dict(self) -> dict[str, Any]:
        """The ``simulate --json`` object: the metrics, the partition and the engine timing."""
        data = self.metrics.to_dict()
        data["num_ops"] = self.metrics.num_ops
        data["engine_wall_s"] = self.engine_wall_s
        data["partition"] = [list(r) for r in self.plan.partition]
        data["microbatch_size"] = int(self.trace.meta["microbatch_size"])
        return data


def make_plan(
    profile: Profile,
    *,
    schedule: str,
    num_stages: int,
    num_microbatches: int,
    num_minibatches: int | None = None,
    partition: tuple[tuple[int, int], ...] | None = None,
    **options: Any,
) -> Plan:
    """A Plan with defaults filled in: K by schedule and a compute-balanced partition.

    Raises:
        ConfigError: bad counts, an unknown schedule, or more stages than layers.
    """
    from pipesim.spec.validation import build

    if num_stages > profile.num_layers:
        raise ConfigError("num_stages", num_stages, f"must be <= the number of layers ({profile.num_layers})")
    data = {
        "schedule": schedule,
        "num_stages": num_stages,
        "num_microbatches": num_microbatches,
        "num_minibatches": num_minibatches if num_minibatches is not None else default_num_minibatches(schedule),
        "partition": partition or balance_partition(profile, num_stages) if num_stages >= 1 else (),
        **options,
    }
    return build(Plan, data)


def prepare(profile: Profile, topology: Topology, plan: Plan) -> Program:
    """Build the plan's schedule and lower it onto the profile's costs and the topology."""
    options: dict[str, Any] = {}
    if plan.schedule == "pipemare":
        options["update"] = plan.pipemare_update
    schedule = build_schedule(
        plan.schedule, plan.num_stages, plan.num_microbatches,
        num_minibatches=plan.num_minibatches, **options,
    )
    if plan.num_stages > topology.num_devices and not plan.placement:
        raise ConfigError(
            "num_stages", plan.num_stages,
            f"needs a device per stage but the topology has {topology.num_devices}",
        )
    costs = stage_costs(profile, plan, topology)
    rank_devices = tuple(plan.device_of(stage) for stage in range(plan.num_stages))
    return lower(
        schedule, costs, topology,
        rank_devices=rank_devices,
        microbatch_size=profile.microbatch_size,
        optimizer_state_multiplier=plan.optimizer_state_multiplier,
    )


def simulate_plan(
    profile: Profile,
    topology: Topology,
    plan: Plan,
    *,
    engine: EngineName = "des",
    jitter: float = 0.0,
    seed: int = 0,
) -> Result:
    """Simulate a complete Plan.

    Raises:
        ConfigError: an input breaks a rule; ScheduleError: the schedule cannot run.
    """
    if engine not in ("des", "analytic", "auto"):
        raise ConfigError("engine", engine, "must be one of des, analytic, auto")
    program = prepare(profile, topology, plan)
    started = time.perf_counter()
    trace = _run(program, engine, jitter, seed)
    wall = time.perf_counter() - started
    return Result(plan=plan, schedule=program.schedule, trace=trace, metrics=compute_metrics(trace),
                  engine_wall_s=wall)


def _run(program: Program, engine: EngineName, jitter: float, seed: int) -> Trace:
    """Run the chosen engine; ``"auto"`` takes the analytic one wherever it applies."""
    if engine == "des":
        return run_des(program, jitter=jitter, seed=seed)
    reason = analytic_unsupported(program, jitter=jitter)
    if reason is None:
        return run_analytic(program)
    if engine == "analytic":
        raise ConfigError("engine", engine, reason)
    return run_des(program, jitter=jitter, seed=seed)


def simulate(
    profile: Profile,
    topology: Topology | None = None,
    *,
    schedule: str,
    num_stages: int,
    num_microbatches: int,
    num_minibatches: int | None = None,
    partition: tuple[tuple[int, int], ...] | None = None,
    engine: EngineName = "des",
    jitter: float = 0.0,
    seed: int = 0,
    **plan_options: Any,
) -> Result:
    """Simulate ``schedule`` on ``profile`` cut into ``num_stages`` stages.

    Args:
        profile: the model's measured layers.
        topology: devices and links; default: ``num_stages`` devices with free communication.
        schedule: registry key: gpipe, 1f1b, pipedream, 2bw or pipemare.
        num_stages, num_microbatches: p and m.
        num_minibatches: K; default 1 for flush schedules and 4 for asynchronous ones.
        partition: per stage ``(start, end)`` layer ranges; default balances compute.
        engine: ``"des"`` (SimPy), ``"analytic"`` or ``"auto"``.
        jitter, seed: per-op duration noise for the DES engine (coefficient of variation).
        plan_options: further Plan fields (recompute, replicas, placement, ...).

    Returns:
        a Result with the trace and the metrics.

    Raises:
        ConfigError: an input breaks a rule (the message names field, value and rule).
        ScheduleError: the schedule cannot run (the message carries the marked grid).
    """
    plan = make_plan(
        profile, schedule=schedule, num_stages=num_stages, num_microbatches=num_microbatches,
        num_minibatches=num_minibatches, partition=partition, **plan_options,
    )
    topology = topology or Topology.uniform(num_devices=num_stages)
    return simulate_plan(profile, topology, plan, engine=engine, jitter=jitter, seed=seed)
