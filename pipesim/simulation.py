"""``simulate``: profile + topology + plan in, Trace and Metrics out (or seeded samples); the API the CLI wraps."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from pipesim import jit
from pipesim.jit import JitSetting
from pipesim.engine.analytic import analytic_unsupported, run_analytic, span_ends
from pipesim.engine.assemble import shared_span_columns
from pipesim.engine.lowering import Program, lower
from pipesim.engine.noise import Distribution, check_cv, check_seed, draw_op_durations
from pipesim.engine.trace import Trace
from pipesim.errors import ConfigError
from pipesim.metrics import Metrics, compute_metrics, seconds_per_minibatch, stage_staleness, window_of
from pipesim.reuse import Reuse
from pipesim.schedule.ir import Schedule
from pipesim.schedule.registry import build_schedule, default_num_minibatches
from pipesim.spec.plan import Plan
from pipesim.spec.profile import Profile
from pipesim.spec.stages import balance_partition, stage_costs
from pipesim.spec.topology import Topology

EngineName = Literal["des", "analytic", "auto"]
# Every op's duration: per rank, per op in order (as ``draw_durations`` gives them), or one array in
# the op table's order.
Durations = Sequence[Sequence[float]] | np.typing.NDArray[np.float64]
FloatArray = np.typing.NDArray[np.float64]

# Peak bytes a run holds per op, by engine (op table, trace columns, memory events, metrics and the
# engine's own state): benchmarks/bench_memory_per_op.py, "Memory per op" in benchmarks/RESULTS.md.
BYTES_PER_OP: dict[str, int] = {"analytic": 469, "des": 486}
# The default --max-ops: about 4 GiB on the engine that needs more, in whole hundred thousands.
DEFAULT_MAX_OPS = (4 << 30) // max(BYTES_PER_OP.values()) // 100_000 * 100_000
# The latest time a run may reach: 2**63 microseconds, the integer clock of a Perfetto trace.
MAX_MAKESPAN_S = 2**63 / 1e6
# The most stochastic runs one call takes: their seeds and iteration times are held at once.
MAX_SAMPLES = 100_000


def count_ops(schedule: str, num_stages: int, num_microbatches: int, num_minibatches: int, *,
              split_backward: bool = False, pipemare_update: str = "minibatch") -> int:
    """Ops a schedule will have: F and B (or F, I and W, where the schedule or the profile splits
    the backward) per stage and microbatch, plus updates (one per minibatch, or per microbatch)."""
    from pipesim.schedule.registry import SPLIT_BACKWARD

    per_microbatch = 3 if schedule in SPLIT_BACKWARD or split_backward else 2
    microbatches = num_minibatches * num_microbatches
    per_update = schedule == "pipedream" or (schedule == "pipemare" and pipemare_update == "microbatch")
    updates = microbatches if per_update else num_minibatches
    return num_stages * (per_microbatch * microbatches + updates)


def estimate_num_ops(plan: Plan, profile: Profile) -> int:
    """Ops a plan's schedule will have on ``profile`` (``count_ops``)."""
    return count_ops(plan.schedule, plan.num_stages, plan.num_microbatches, plan.num_minibatches,
                     split_backward=profile.has_split_backward, pipemare_update=plan.pipemare_update)


def check_size(plan: Plan, profile: Profile, max_ops: int = DEFAULT_MAX_OPS) -> int:
    """Refuse, before building anything, a run whose op count would exceed ``max_ops``.

    Returns:
        the estimated op count.

    Raises:
        ConfigError: naming the estimate, the memory it would take and how to raise the limit.
    """
    return check_num_ops(estimate_num_ops(plan, profile), max_ops)


def check_num_ops(estimate: int, max_ops: int = DEFAULT_MAX_OPS) -> int:
    """Refuse an estimated op count (``count_ops``) above ``max_ops``; return it otherwise.

    Raises:
        ConfigError: naming the estimate, the memory a run would take and how to raise the limit.
    """
    if estimate > max_ops:
        gib = {engine: estimate * size / 2**30 for engine, size in BYTES_PER_OP.items()}
        raise ConfigError(
            "num_ops", estimate,
            f"the run would need about {gib['analytic']:.1f} GiB (analytic engine) or {gib['des']:.1f} GiB (des), "
            f"more than the limit of {max_ops:,} ops allows; use fewer stages, microbatches or minibatches, "
            "or raise --max-ops",
        )
    return estimate


@dataclass(frozen=True)
class Result:
    """One simulation: the plan it ran, the schedule, the trace, its metrics, and engine timing.

    Attributes:
        plan: the plan, with the partition filled in.
        schedule: the schedule that ran.
        trace: what the engine recorded.
        metrics: ``compute_metrics(trace)``.
        engine_wall_s: seconds the engine itself took (lowering, metrics and numba's start-up
            excluded).
        startup_s: seconds this call spent starting numba (its import and loading the compiled
            kernels; 0 when they were loaded before or the plain-Python kernels ran).
    """

    plan: Plan
    schedule: Schedule
    trace: Trace
    metrics: Metrics
    engine_wall_s: float
    startup_s: float = 0.0

    #: The keys of ``to_dict`` measured on the wall clock: the only values in which two runs of
    #: the same inputs differ (files meant to be reproduced leave them out).
    TIMINGS: ClassVar[tuple[str, ...]] = ("engine_wall_s", "startup_s")

    def __repr__(self) -> str:
        m = self.metrics
        return (f"<Result {m.schedule} p={m.num_stages} m={m.num_microbatches} K={m.num_minibatches}, {m.engine} "
                f"engine: iteration time {m.iteration_time_s * 1e3:.4g} ms, {m.throughput_samples_per_s:.4g} "
                f"samples/s, bubble {m.bubble_fraction:.1%}, peak memory {m.peak_memory_bytes / 1e9:.4g} GB>")

    def _repr_html_(self) -> str:
        """A summary table for notebooks; ``import pipesim.plots`` adds the timeline under it."""
        m = self.metrics
        rows = [("schedule", m.schedule), ("stages p / ranks", f"{m.num_stages} / {m.num_ranks}"),
                ("microbatches m, minibatches K", f"{m.num_microbatches}, {m.num_minibatches}"),
                ("engine", m.engine), ("iteration time", f"{m.iteration_time_s * 1e3:.4g} ms"),
                ("throughput", f"{m.throughput_samples_per_s:.4g} samples/s"),
                ("bubble fraction", f"{m.bubble_fraction:.1%}"),
                ("peak memory", f"{m.peak_memory_bytes / 1e9:.4g} GB")]
        cells = "".join(f"<tr><th style='text-align:left'>{k}</th><td>{v}</td></tr>" for k, v in rows)
        return f"<table>{cells}</table>"

    def to_dict(self) -> dict[str, Any]:
        """The ``simulate --json`` object: the metrics, the partition and the engine timing."""
        data = self.metrics.to_dict()
        data["num_ops"] = self.metrics.num_ops
        data["engine_wall_s"] = self.engine_wall_s
        data["startup_s"] = self.startup_s
        data["partition"] = [list(r) for r in self.plan.partition]
        data["microbatch_size"] = self.trace.info.microbatch_size
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

    check_num_stages(profile, num_stages)
    data = {
        "schedule": schedule,
        "num_stages": num_stages,
        "num_microbatches": num_microbatches,
        "num_minibatches": num_minibatches if num_minibatches is not None else default_num_minibatches(schedule),
        "partition": partition or balance_partition(profile, num_stages) if num_stages >= 1 else (),
        **options,
    }
    return build(Plan, data)


def check_num_stages(profile: Profile, num_stages: int, source: str | None = None) -> None:
    """Refuse more stages than the profile has layers, before anything is built for them (a
    topology of one device per stage); ``source``: the file that gave the count.

    Raises:
        ConfigError: naming the stage count and the profile's layer count.
    """
    if num_stages > profile.num_layers:
        raise ConfigError("num_stages", num_stages, f"must be <= the number of layers ({profile.num_layers})",
                          source=source)


def rank_devices(schedule: Schedule, plan: Plan) -> tuple[int, ...]:
    """The device of each rank: from the plan's per-stage placement, else rank r on device r.

    Raises:
        ConfigError: the placement puts two stages of one rank on different devices.
    """
    if not plan.placement:
        return tuple(range(schedule.num_ranks))
    devices: dict[int, int] = {}
    for stage, rank in enumerate(schedule.stage_to_rank):
        device = devices.setdefault(rank, plan.placement[stage])
        if device != plan.placement[stage]:
            raise ConfigError("placement", list(plan.placement),
                              f"stages on rank {rank} of {schedule.name} must share a device "
                              f"(stage {stage} is on {plan.placement[stage]}, another on {device})")
    return tuple(devices[rank] for rank in range(schedule.num_ranks))


def prepare(
    profile: Profile,
    topology: Topology,
    plan: Plan,
    *,
    schedule: Schedule | None = None,
    max_ops: int = DEFAULT_MAX_OPS,
    reuse: Reuse | None = None,
) -> Program:
    """Build the plan's schedule (or take ``schedule``) and lower it onto the profile's costs
    and the topology.

    A schedule built here comes from the registry, whose generators are held valid by the
    property tests, so it is lowered without re-validating it (validation is O(ops) in Python
    and dominated simulate() at large p); a schedule passed in is validated. ``reuse`` keeps
    registry schedules (with the order facts they derive) and stage costs for later calls
    (``pipesim.reuse``).

    Raises:
        ConfigError: a given schedule disagrees with the plan's counts, too few devices, a run
            larger than ``max_ops``, or an input breaks a rule.
    """
    check_size(plan, profile, max_ops)
    is_given = schedule is not None
    if schedule is None:
        options: dict[str, Any] = {"update": plan.pipemare_update, "model": plan.pipemare_model} \
            if plan.schedule == "pipemare" else {}
        if plan.schedule == "zb-auto":  # its order follows the stage and link times
            from pipesim.engine.auto_costs import zero_bubble_costs  # noqa: PLC0415

            options = {"costs": zero_bubble_costs(profile, topology, plan), "memory_limit": plan.zb_memory_limit}

        def make_schedule() -> Schedule:
            return build_schedule(plan.schedule, plan.num_stages, plan.num_microbatches,
                                  num_minibatches=plan.num_minibatches, num_ranks=plan.num_ranks, **options)

        key = (plan.schedule, plan.num_stages, plan.num_microbatches, plan.num_minibatches, plan.num_ranks,
               tuple(options.items()))
        schedule = make_schedule() if reuse is None else reuse.order(key, make_schedule)
    elif (schedule.num_stages, schedule.num_microbatches) != (plan.num_stages, plan.num_microbatches):
        raise ConfigError("schedule", schedule.name, f"has {schedule.num_stages} stages and "
                          f"{schedule.num_microbatches} microbatches but the plan {plan.num_stages} and "
                          f"{plan.num_microbatches}")
    if schedule.num_ranks > topology.num_devices and not plan.placement:
        raise ConfigError(
            "num_ranks", schedule.num_ranks,
            f"needs a device per rank but the topology has {topology.num_devices}",
        )
    devices = rank_devices(schedule, plan)
    stage_devices = tuple(devices[rank] for rank in schedule.stage_to_rank)
    if reuse is None:
        costs = stage_costs(profile, plan, topology, stage_devices=stage_devices)
    else:
        costs = reuse.stage_costs(profile, plan, topology, stage_devices,
                                  lambda: stage_costs(profile, plan, topology, stage_devices=stage_devices))
    return lower(schedule, costs, topology, check=is_given, rank_devices=devices,
                 microbatch_size=profile.microbatch_size, optimizer_state_multiplier=plan.optimizer_state_multiplier,
                 fb_chunks=plan.fb_chunks, fb_overlap=plan.fb_overlap, pipemare_model=plan.pipemare_model)


def simulate_plan(
    profile: Profile,
    topology: Topology,
    plan: Plan,
    *,
    engine: EngineName = "des",
    jitter: float = 0.0,
    seed: int = 0,
    schedule: Schedule | None = None,
    max_ops: int = DEFAULT_MAX_OPS,
    reuse: Reuse | None = None,
    kernels: JitSetting | None = None,
) -> Result:
    """Simulate a complete Plan (with ``schedule`` in place of the registry's, when given).

    ``max_ops`` bounds the run's size (see ``check_size``). ``reuse`` carries schedules,
    stage costs and staleness over to later calls (``pipesim.reuse``; a sweep's points share them).
    ``kernels`` (auto, always or never; default ``PIPESIM_JIT``) chooses numba's kernels or their
    plain-Python form for the engine and the metrics (``pipesim.jit.use_compiled``).

    Raises:
        ConfigError: an input breaks a rule; ScheduleError: the schedule cannot run.
    """
    if engine not in ("des", "analytic", "auto"):
        raise ConfigError("engine", engine, "must be one of des, analytic, auto")
    if not plan.partition:  # the Result says which layers each stage ran
        plan = plan.model_copy(update={"partition": balance_partition(profile, plan.num_stages)})
    # Times and bytes that add up past the largest float are refused (check_finite_*), not warned about.
    with np.errstate(over="ignore", invalid="ignore"):
        program = prepare(profile, topology, plan, schedule=schedule, max_ops=max_ops, reuse=reuse)
        compiled = jit.use_compiled(program.ops.num_ops, kernels)
        startup = jit.startup_s()
        started = time.perf_counter()
        trace = _run(program, engine, compiled, jitter=jitter, seed=seed)
        wall = time.perf_counter() - started
        check_finite_times(trace)
        engine_startup = jit.startup_s() - startup
        known = None if reuse is None else reuse.staleness(program.schedule,
                                                           lambda: stage_staleness(trace, compiled=compiled))
        metrics = compute_metrics(trace, staleness=known, compiled=compiled)
    check_finite_memory(metrics)
    return Result(plan=plan, schedule=program.schedule, trace=trace, metrics=metrics,
                  engine_wall_s=wall - engine_startup, startup_s=jit.startup_s() - startup)


def check_finite_times(trace: Trace) -> None:
    """Refuse a run whose clock overflowed, or ran past ``MAX_MAKESPAN_S``: times that are finite
    alone (a latency of 1e308 s, op times near the largest float) can add up to infinity, and
    metrics over it are not numbers; a trace's Perfetto file counts integer microseconds.

    Raises:
        ConfigError: naming the last span end and what to make smaller.
    """
    makespan = trace.makespan_s  # the largest end: inf, or NaN, where any end is
    if not math.isfinite(makespan):
        raise ConfigError("makespan_s", makespan, "overflows a float: the run's op times, latencies or "
                          "transfers add up past 1.8e308 s; give smaller times or sizes, or faster speeds")
    if makespan > MAX_MAKESPAN_S:
        raise ConfigError("makespan_s", makespan, f"must be at most {MAX_MAKESPAN_S:.3g} s (292,000 "
                          "years, what a trace's microsecond clock holds); give smaller times or sizes, or faster "
                          "speeds")


def check_finite_memory(metrics: Metrics) -> None:
    """Refuse a run whose memory overflowed: byte counts that are finite alone (1e308 bytes of
    parameters, an optimizer multiplier of 1e308) can add up to infinity.

    Raises:
        ConfigError: naming the peak and what to make smaller.
    """
    if not math.isfinite(metrics.peak_memory_bytes):
        raise ConfigError("peak_memory_bytes", metrics.peak_memory_bytes, "overflows a float: the run's byte counts "
                          "add up past 1.8e308 B; give smaller sizes or a smaller optimizer-state multiplier")


def _run(program: Program, engine: EngineName, compiled: bool | None, *, jitter: float = 0.0, seed: int = 0,
         durations: Durations | None = None) -> Trace:
    """Run the chosen engine with the ops' durations (drawn with ``jitter`` and ``seed``, or
    given); ``"auto"`` takes the analytic one wherever it applies: durations are known up front,
    so it gives the DES engine's bits without events."""
    if engine != "des":
        reason = analytic_unsupported(program)
        if engine == "analytic" and reason is not None:
            raise ConfigError("engine", engine, reason)
        if reason is None:
            return run_analytic(program, jitter=jitter, seed=seed, durations=durations, compiled=compiled)
    from pipesim.engine.des import run_des  # noqa: PLC0415 - SimPy is imported only for a DES run

    return run_des(program, jitter=jitter, seed=seed, durations=durations, compiled=compiled)


def _span_ends(program: Program, runs: Iterable[FloatArray], compiled: bool) -> Iterator[FloatArray]:
    """Every span's end for each run's durations: the analytic engine over one kernel state
    wherever it applies, else a DES run each."""
    if analytic_unsupported(program) is None:
        yield from span_ends(program, runs, compiled=compiled)
        return
    from pipesim.engine.des import run_des  # noqa: PLC0415 - SimPy is imported only for a DES run

    for durations in runs:
        yield run_des(program, durations=durations, compiled=compiled).spans["end_s"]


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
    max_ops: int = DEFAULT_MAX_OPS,
    kernels: JitSetting | None = None,
    **plan_options: Any,
) -> Result:
    """Simulate ``schedule`` on ``profile`` cut into ``num_stages`` stages.

    Args:
        profile: the model's measured layers.
        topology: devices and links; default: the devices the plan occupies (``Plan.num_devices``)
            with free communication.
        schedule: registry key: gpipe, 1f1b, pipedream, 2bw, pipemare, interleaved-1f1b,
            looped-bfs, interleaved-zb, zbv, dualpipev, zb-h1, zb-h2 or zb-auto.
        num_stages, num_microbatches: p (all model stages) and m.
        num_minibatches: K; default 1 for flush schedules and 4 for asynchronous ones.
        partition: per stage ``(start, end)`` layer ranges; default balances compute.
        engine: ``"des"`` (SimPy), ``"analytic"`` or ``"auto"``.
        jitter, seed: per-op duration noise for the DES engine (coefficient of variation).
        max_ops: refuse runs estimated to have more ops than this (see ``check_size``).
        kernels: ``"auto"``, ``"always"`` or ``"never"``: numba's kernels or their plain-Python
            form (default ``PIPESIM_JIT``, else auto: by the run's size; ``pipesim.jit``).
        plan_options: further Plan fields (stages_per_rank, recompute, recompute_stages,
            replicas, placement, zb_memory_limit, ...); ``stages_per_rank=V`` runs p stages on
            p / V ranks.

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
    topology = topology or Topology.uniform(num_devices=plan.num_devices)
    return simulate_plan(profile, topology, plan, engine=engine, jitter=jitter, seed=seed, max_ops=max_ops,
                         kernels=kernels)


def simulate_schedule(
    profile: Profile,
    topology: Topology | None,
    schedule: Schedule,
    *,
    partition: tuple[tuple[int, int], ...] | None = None,
    engine: EngineName = "des",
    jitter: float = 0.0,
    seed: int = 0,
    max_ops: int = DEFAULT_MAX_OPS,
    **plan_options: Any,
) -> Result:
    """Simulate a given Schedule (e.g. read with ``from_csv``) instead of a registry one.

    The profile is cut into ``schedule.num_stages`` stages; rank r runs on device r unless
    ``placement`` says otherwise.

    Raises:
        ConfigError: an input breaks a rule; ScheduleError: the schedule is invalid or deadlocks.
    """
    per_rank, uneven = divmod(schedule.num_stages, schedule.num_ranks)
    plan = make_plan(
        profile, schedule=schedule.name, num_stages=schedule.num_stages,
        num_microbatches=schedule.num_microbatches, num_minibatches=schedule.num_minibatches,
        partition=partition, stages_per_rank=per_rank if not uneven else 1, **plan_options,
    )
    topology = topology or Topology.uniform(num_devices=schedule.num_ranks)
    return simulate_plan(profile, topology, plan, engine=engine, jitter=jitter, seed=seed, schedule=schedule,
                         max_ops=max_ops)


@dataclass(frozen=True)
class SampleSummary:
    """Iteration time over ``num_samples`` seeded stochastic runs of one Program.

    Attributes:
        num_samples, seed, distribution: how the samples were drawn; ``cv`` is the coefficient
            of variation used for every op, or None for the profile's measured spread.
        deterministic_iteration_time_s: the run with every op at its mean duration.
        iteration_times_s: one steady-state iteration time per sample, in sample order.
        median_s, p5_s, p95_s, mean_s: their median, 5th and 95th percentiles (linear
            interpolation) and mean.
        straggler_slowdown: the relative slow-down given to one device at a time.
        straggler_sensitivity: per device, ``(T_slow / T - 1) / straggler_slowdown`` of the
            deterministic iteration time T: 1 when the whole pipeline waits for that device,
            0 when its slack hides it.
    """

    num_samples: int
    seed: int
    distribution: str
    cv: float | None
    deterministic_iteration_time_s: float
    iteration_times_s: tuple[float, ...]
    median_s: float
    p5_s: float
    p95_s: float
    mean_s: float
    straggler_slowdown: float
    straggler_sensitivity: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        return asdict(self)


def check_num_samples(num_samples: int) -> None:
    """Refuse a sample count below 1 or above ``MAX_SAMPLES``.

    Raises:
        ConfigError: naming ``samples``, the count and the range.
    """
    if not 1 <= num_samples <= MAX_SAMPLES:
        raise ConfigError("samples", num_samples, f"must be an integer from 1 to {MAX_SAMPLES:,}")


def sample_program(
    program: Program,
    *,
    num_samples: int,
    seed: int = 0,
    distribution: Distribution = "normal",
    cv: float | None = None,
    straggler_slowdown: float = 0.1,
) -> SampleSummary:
    """Run ``program`` ``num_samples`` times with drawn op durations (the analytic engine where
    it applies).

    Sample i draws from ``numpy.random.default_rng(SeedSequence(seed).spawn(N)[i])``, so a
    sample does not depend on how many are taken, and the same seed gives the same numbers.
    With no spread every sample equals the deterministic run exactly.

    Raises:
        ConfigError: ``num_samples`` outside 1..MAX_SAMPLES, a negative seed, a slow-down <= 0, or a bad
            distribution or cv.
    """
    check_num_samples(num_samples)
    check_seed(seed)
    if cv is not None:
        check_cv("cv", cv)
    if not straggler_slowdown > 0:
        raise ConfigError("straggler_slowdown", straggler_slowdown, "must be > 0")
    base = program.ops.duration_s
    num_runs = 1 + num_samples + program.ops.num_ranks
    compiled = jit.use_compiled(program.ops.num_ops * num_runs)
    runs = itertools.chain(
        [base],
        (draw_op_durations(program, np.random.default_rng(child), distribution=distribution, cv=cv)
         for child in np.random.SeedSequence(seed).spawn(num_samples)),
        (np.where(program.ops.rank == rank, base * (1 + straggler_slowdown), base)
         for rank in range(program.ops.num_ranks)))
    spans = shared_span_columns(program)
    num_minibatches = program.info.num_minibatches
    iterations = [seconds_per_minibatch(window_of(spans, ends, num_minibatches, compiled=compiled), num_minibatches)
                  for ends in _span_ends(program, runs, compiled)]
    deterministic, times = iterations[0], iterations[1: 1 + num_samples]
    sensitivity = [(slow / deterministic - 1) / straggler_slowdown if deterministic > 0 else 0.0
                   for slow in iterations[1 + num_samples:]]
    values = np.asarray(times)
    return SampleSummary(
        num_samples=num_samples,
        seed=seed,
        distribution=distribution,
        cv=cv,
        deterministic_iteration_time_s=deterministic,
        iteration_times_s=tuple(times),
        median_s=float(np.median(values)),
        p5_s=float(np.percentile(values, 5)),
        p95_s=float(np.percentile(values, 95)),
        mean_s=float(values.mean()),
        straggler_slowdown=straggler_slowdown,
        straggler_sensitivity=tuple(sensitivity),
    )


def simulate_samples(
    profile: Profile,
    topology: Topology,
    plan: Plan,
    *,
    num_samples: int,
    seed: int = 0,
    distribution: Distribution = "normal",
    cv: float | None = None,
    schedule: Schedule | None = None,
) -> SampleSummary:
    """Build and lower the plan's schedule (or ``schedule``), then ``sample_program`` it.

    Raises:
        ConfigError: an input breaks a rule; ScheduleError: the schedule cannot run.
    """
    program = prepare(profile, topology, plan, schedule=schedule)
    return sample_program(program, num_samples=num_samples, seed=seed, distribution=distribution, cv=cv)


# A lowered run, as ``prepare`` returns it: the op table (rank, stage, kind, microbatch, position,
# duration_s, ...) and the links, ready for an engine. Its public name for callers outside the engine.
PreparedRun = Program


def run_program(program: PreparedRun, *, durations_s: np.typing.NDArray[np.float64] | None = None) -> Trace:
    """Run a prepared program, each op lasting ``durations_s[i]`` (one per op, in the op table's
    order) instead of its lowered duration when given: a replay of measured op times, or op times
    drawn from a spread.

    Raises:
        ScheduleError: the schedule cannot run.
    """
    return _run(program, "auto", None, durations=durations_s)
