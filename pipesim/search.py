"""The configuration search: the best layout, schedule and memory settings for a model on N GPUs, in seconds.

The space is ``pipesim.plan.search_space``'s (TP x CP x PP x DP with EP, microbatch size,
schedule and V, sequence parallelism, recomputation, ZeRO). Each candidate is decided by the
cheapest proof that settles it (``pipesim.plan.search_bounds``), in this order:

1. memory: its weights, gradients and optimizer state as ZeRO shards them, plus a microbatch's
   stash, already over the budget (from a profile built once per op shape);
2. time: candidates run best bound first; one whose lower bound on the step time exceeds the
   k-th best simulated step that fits is pruned, and once one is, so is every later one;
3. the same two bounds on the candidate's exact stage costs (its update, ZeRO's collectives,
   and the in-flight microbatches of its schedule's order);
4. otherwise it is simulated on the analytic engine, and fits or not by its simulated peak.

Every bound is at most what simulation would give, so the top k equal the exhaustive search's
(``prune=False`` simulates everything; the property tests compare the two). Profiles are built
once per op shape and kept; schedule orders once per pipeline shape. Placement is Megatron's
unless told otherwise (``pipesim.spec.layout``). With ``workers`` or ``scheduler`` the
candidates still to simulate go to Dask in rounds, best bound first.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pipesim.errors import ConfigError, PipesimError
from pipesim.jit import JitSetting, setting_from_environment
from pipesim.plan.search_bounds import (
    InFlight,
    LayerSums,
    ShapeMemory,
    StageMemory,
    StageTimes,
    peak_lower_bound,
    step_lower_bound,
)
from pipesim.plan.search_breakdown import stage_sums, step_breakdown
from pipesim.plan.search_space import (
    MICROBATCH_SIZES as MICROBATCH_SIZES,
    SEARCH_SCHEDULES as SEARCH_SCHEDULES,
    SPLIT_BACKWARD,
    Candidate as Candidate,
    Outcome as Outcome,
    beaten,
    enumerate_candidates as enumerate_candidates,
    held_over,
    order_key,
    rank_key,
    search_counts as search_counts,
    stage_ranks,
)
from pipesim.reuse import Reuse
from pipesim.schedule.registry import build_schedule, default_num_minibatches
from pipesim.simulation import make_plan, simulate_plan
from pipesim.spec.cluster import Cluster, load_cluster
from pipesim.spec.device import Device, load_device
from pipesim.spec.model_files import load_model
from pipesim.spec.opcost import tp_overlap_applies
from pipesim.spec.parallel import zero_optimizer_multiplier
from pipesim.spec.partition import balance_partition, megatron_cut
from pipesim.spec.plan import Plan
from pipesim.spec.profile import Profile
from pipesim.spec.stages import stage_costs
from pipesim.spec.topology import Topology
from pipesim.spec.transformer import TransformerConfig, forward_flops_per_token
from pipesim.spec.transformer_profile import (
    ADAM_STATE_MULTIPLIER,
    Parallelism,
    default_cluster,
    pipeline_bandwidth_bytes_per_s,
    pipeline_latency_s,
    pipeline_topology,
    transformer_profile,
)
from pipesim.sweep.batches import plan_batches, run_cost
from pipesim.sweep.dask_cluster import DaskCluster, fork_server_kept
from pipesim.training import model_throughput

# GPUs N: past the largest clusters built; bounds the candidates enumerated from N's divisors.
MAX_GPUS = 1_000_000
# Candidates sent to Dask per round (with ``workers`` or ``scheduler``), per worker thread.
DASK_ROUND_PER_WORKER = 4
# A search runs dozens of simulations: numba's kernels (loaded from its disk cache after the first
# run) unless PIPESIM_JIT or PIPESIM_NO_JIT says otherwise.
_KERNELS: JitSetting = "always" if setting_from_environment() == "auto" and "PIPESIM_JIT" not in os.environ \
    else setting_from_environment()


@dataclass(frozen=True)
class _Setting:
    """What every candidate of one search shares (sent to Dask workers with their batches);
    ``threshold``: the k-th best step that fits so far (a candidate whose bound exceeds it is pruned)."""

    config: TransformerConfig
    spec: Device
    cluster: Cluster
    placement: str
    seq_len: int
    budget: float
    flops: float
    dp_overlap: bool
    allow_uneven: bool = False
    tp_overlap: bool = False
    precision: str | None = None
    prune: bool = True
    top: int = 10
    threshold: float = math.inf


@dataclass(frozen=True)
class _Shape:
    """One op shape's cut and bounds: ``bound`` on the step, ``memory`` per rank, ``lightest`` stash."""

    bound: float
    partition: tuple[tuple[int, int], ...]
    memory: ShapeMemory
    lightest: Any
    text: str


class _GroupRunner:
    """Decides candidates: keeps the profiles it builds (with their running sums), each op shape's
    cut and bounds, the in-flight counts of each schedule order and the orders themselves
    (``Reuse``) between candidates."""

    def __init__(self, setting: _Setting) -> None:
        self.setting = setting
        self.reuse = Reuse()
        self.profiles: dict[tuple[Any, ...], tuple[Profile, LayerSums, list[float], list[float]]] = {}
        self.inflight: dict[tuple[Any, ...], InFlight] = {}
        self.links: dict[tuple[Any, ...], tuple[float, float, Topology]] = {}
        self.shapes: dict[tuple[Any, ...], _Shape] = {}
        self.cuts: dict[tuple[Any, ...], StageMemory] = {}

    def profile(self, item: Candidate, *, exact: bool) -> tuple[Profile, LayerSums, list[float], list[float]]:
        """The candidate's profile (``exact``) or, for the first bounds, the one of its op shape:
        no ZeRO and no update (its pipeline depth only where placement or a tied embedding needs it);
        with its running sums, and per layer its collectives' and its update's communication seconds."""
        setting = self.setting
        pp = item.pp if exact or setting.placement == "pp-in-node" else min(item.pp, 2)
        dp, zero = (item.dp, item.zero) if exact else (item.ep, 0)
        key = (item.tp, item.sequence_parallel, item.cp, item.ep, item.microbatch_size, item.recompute, pp, dp, zero)
        if key not in self.profiles:
            collectives: list[float] = []
            communication: list[float] = []
            profile = transformer_profile(
                setting.config, device=setting.spec, cluster=setting.cluster, microbatch_size=item.microbatch_size,
                seq_len=setting.seq_len, tp=item.tp, sequence_parallel=item.sequence_parallel,
                tp_overlap=setting.tp_overlap and tp_overlap_applies(item.sequence_parallel, item.tp),
                recompute=item.recompute,
                pp=pp, dp=dp, zero=zero, cp=item.cp, ep=item.ep, precision=setting.precision,
                dp_overlap=setting.dp_overlap and exact, placement=setting.placement,
                collectives=collectives if exact else None, update_communication=communication)
            self.profiles[key] = (profile, LayerSums.of(profile), collectives, communication)
        return self.profiles[key]

    def link(self, item: Candidate) -> tuple[float, float, Topology]:
        """``(latency, bandwidth, topology)`` of the candidate's pipeline links."""
        key = (item.tp, item.pp, item.dp, item.cp, item.ep, item.sequence_parallel)
        if key not in self.links:
            setting = self.setting
            layout = Parallelism(tp=item.tp, pp=item.pp, dp=item.dp, placement=setting.placement, cp=item.cp,
                                 ep=item.ep)
            # The bounds take the fastest hop's link for every hop; the simulation each hop's own.
            bandwidth = pipeline_bandwidth_bytes_per_s(setting.cluster, layout, sequence_parallel=item.sequence_parallel)
            latency = pipeline_latency_s(setting.cluster, layout)
            self.links[key] = (latency, bandwidth, pipeline_topology(setting.cluster, layout, memory_bytes=setting.budget,
                                                                     sequence_parallel=item.sequence_parallel))
        return self.links[key]

    def shape(self, item: Candidate) -> _Shape:
        """The op shape's cut, step bound and memory (stage 1), shared by its ZeRO stages."""
        key = (item.tp, item.sequence_parallel, item.cp, item.ep, item.microbatch_size, item.recompute, item.pp,
               item.dp, item.schedule, item.stages_per_rank)
        known = self.shapes.get(key)
        if known is None:
            profile, sums, _, _ = self.profile(item, exact=False)
            num_stages = item.num_stages
            partition = _megatron_cut(self.setting.config.num_layers, num_stages) \
                or balance_partition(profile, num_stages)
            ranks = stage_ranks(item.schedule, item.pp, num_stages)
            latency, bandwidth, _ = self.link(item)
            bound = step_lower_bound(sums.stages(partition), ranks, item.num_microbatches,
                                     split=item.schedule in SPLIT_BACKWARD, latency_s=latency,
                                     bandwidth_bytes_per_s=bandwidth)
            cut = (key[:6], key[6] if self.setting.placement == "pp-in-node" else min(item.pp, 2), partition)
            if cut not in self.cuts:
                self.cuts[cut] = StageMemory.of(profile, sums, partition)
            memory = ShapeMemory.of(self.cuts[cut], ranks)
            known = self.shapes[key] = _Shape(bound, partition, memory, memory.lightest(), _cut_text(partition))
        return known

    def first_bounds(self, item: Candidate) -> tuple[float, float, tuple[tuple[int, int], ...]]:
        """``(step bound, memory bound, partition)`` from the op shape's profile (stage 1)."""
        shape = self.shape(item)
        static = shape.memory.static(replicas=item.dp * item.cp, zero=item.zero)
        return shape.bound, float((static + shape.lightest).max()), shape.partition

    def order(self, item: Candidate) -> InFlight:
        """The in-flight counts of the candidate's schedule order (built once per pipeline shape)."""
        key = (item.schedule, item.num_stages, item.num_microbatches, item.pp)
        if key not in self.inflight:
            self.inflight[key] = InFlight.of(self.reuse.order(
                (item.schedule, item.num_stages, item.num_microbatches, 1, item.pp, ()),
                lambda: build_schedule(item.schedule, item.num_stages, item.num_microbatches, num_ranks=item.pp)))
        return self.inflight[key]

    def held_bound(self, item: Candidate) -> float:
        """The op shape's memory bound with its schedule's in-flight microbatches."""
        shape = self.shape(item)
        static = shape.memory.static(replicas=item.dp * item.cp, zero=item.zero)
        return float((static + shape.memory.activations(self.order(item))).max())

    def decide(self, item: Candidate, partition: tuple[tuple[int, int], ...]) -> Outcome:
        """Stage 2 (the exact stage costs' bounds) and, if neither prunes it, the simulation."""
        setting, cut = self.setting, self.shape(item).text
        latency, bandwidth, topology = self.link(item)
        try:
            if setting.prune and (held := self.held_bound(item)) > setting.budget:
                return held_over(item, held, setting.budget, cut)
            profile = self.profile(item, exact=True)[0]
            plan = self.plan(item, profile, partition)
            ranks = stage_ranks(item.schedule, item.pp, item.num_stages)
            costs = stage_costs(profile, plan, topology, stage_devices=ranks)
            bound = step_lower_bound(StageTimes.of_costs(costs), ranks, item.num_microbatches,
                                     split=item.schedule in SPLIT_BACKWARD, latency_s=latency,
                                     bandwidth_bytes_per_s=bandwidth)
            if bound > setting.threshold:
                return beaten(item, bound, setting.threshold, setting.top, cut)
            held = peak_lower_bound(costs, self.order(item), plan.optimizer_state_multiplier)
            if held > setting.budget and setting.prune:
                return held_over(item, held, setting.budget, cut, step_bound_s=bound)
            result = simulate_plan(profile, topology, plan, engine="auto", reuse=self.reuse, kernels=_KERNELS)
        except PipesimError as error:
            return Outcome(item, "dropped", str(error).splitlines()[0], partition=cut)
        metrics = result.metrics
        peak = max(metrics.device_peak_memory_bytes)
        tokens, mfu = model_throughput(metrics.throughput_samples_per_s, dp=item.dp, seq_len=setting.seq_len,
                                       forward_flops_per_token=setting.flops,
                                       num_gpus=item.tp * item.cp * item.pp * item.dp,
                                       peak_flops=setting.spec.peak(setting.precision or setting.spec.default_precision))
        fits = peak <= setting.budget
        return Outcome(item, "simulated", "fits" if fits else "over budget", tokens_per_s=tokens, mfu=mfu,
                       iteration_time_s=metrics.iteration_time_s, peak_memory_bytes=peak, fits=fits, partition=cut,
                       step_bound_s=bound, memory_bound_bytes=held)

    def explain(self, outcome: Outcome) -> Outcome:
        """The outcome with its step split into parts (``pipesim.plan.search_breakdown``)."""
        item = outcome.candidate
        profile, _, collectives, communication = self.profile(item, exact=True)
        partition = self.shape(item).partition
        plan = self.plan(item, profile, partition)
        ranks = stage_ranks(item.schedule, item.pp, item.num_stages)
        costs = stage_costs(profile, plan, self.link(item)[2], stage_devices=ranks)
        free = simulate_plan(profile, Topology.uniform(num_devices=item.pp), plan, engine="auto", reuse=self.reuse,
                             kernels=_KERNELS)
        steps = [(layer.update_s or 0.0) - comm for layer, comm in zip(profile.layers, communication, strict=True)]
        parts = step_breakdown(costs, ranks, item.num_microbatches, step_s=outcome.iteration_time_s,
                               free_links_step_s=free.metrics.iteration_time_s,
                               collectives_s=stage_sums(collectives, partition), optimizer_s=stage_sums(steps, partition))
        return replace(outcome, step_breakdown_s=parts)

    def plan(self, item: Candidate, profile: Profile, partition: tuple[tuple[int, int], ...]) -> Plan:
        return make_plan(profile, schedule=item.schedule, num_stages=item.num_stages,
                         num_microbatches=item.num_microbatches, stages_per_rank=item.stages_per_rank,
                         optimizer_state_multiplier=zero_optimizer_multiplier(ADAM_STATE_MULTIPLIER, item.dp * item.cp,
                                                                              item.zero), partition=partition)

    def run(self, group: Sequence[Candidate]) -> list[Outcome]:
        return [self.decide(item, self.first_bounds(item)[2]) for item in group]


def run_groups(setting: _Setting, groups: Sequence[Sequence[Candidate]]) -> list[Outcome]:
    """The Dask task: a batch of groups on one worker, in order."""
    runner = _GroupRunner(setting)
    return [outcome for group in groups for outcome in runner.run(group)]


def search(model: str | TransformerConfig, *, device: str | Device, num_gpus: int, global_batch: int,
           seq_len: int | None = None, memory_bytes: float | None = None, zero: int | None = None,
           placement: str = "tp-in-node", dp_overlap: bool = False, cluster: str | Cluster | None = None,
           allow_uneven: bool = False, top: int = 10, prune: bool = True, workers: int | None = None,
           tp_overlap: bool = False, precision: str | None = None,
           scheduler: str | None = None, progress: Callable[[int, int], None] | None = None) -> list[Outcome]:
    """Every candidate's outcome: the simulated ones that fit first by tokens/s, then the others.

    Args:
        zero: only this ZeRO stage (default every stage the space allows).
        dp_overlap: the data-parallel all-reduce overlapped with the last backward (``simulate
            --dp-overlap``) rather than after it.
        tp_overlap: in candidates with sequence parallelism, its all-gathers and reduce-scatters
            beside the GEMMs next to them (``simulate --tp-overlap``).
        precision: the matrix precision (``simulate --precision``; default the device's 16-bit type).
        allow_uneven: also stage counts Megatron cannot cut into whole equal stages.
        top: the k whose places are proven: a candidate is simulated only while its bound could
            beat the k-th best that fits.
        prune: False simulates every candidate that can be formed (the exhaustive search).
        workers, scheduler: simulate on Dask (the sweep's ``dask_client``): an embedded cluster of
            ``workers`` processes on 127.0.0.1, or the scheduler at that address. The outcomes are the same.
        progress: called with (candidates decided, candidates in all).

    Raises:
        ConfigError: a count or sequence length below 1, more than ``MAX_GPUS`` GPUs, an unknown
            placement or an unreachable scheduler.
    """
    config = load_model(model) if isinstance(model, str) else model
    spec = load_device(device) if isinstance(device, str) else device
    wiring = default_cluster(spec) if cluster is None else load_cluster(cluster) if isinstance(cluster, str) else cluster
    s = config.seq_len if seq_len is None else seq_len
    for field, value in (("gpus", num_gpus), ("global_batch", global_batch), ("seq_len", s), ("top", top)):
        if value < 1:
            raise ConfigError(field, value, "must be >= 1")
    if num_gpus > MAX_GPUS:
        raise ConfigError("gpus", num_gpus, f"must be <= {MAX_GPUS:,}")
    if zero is not None and zero not in (0, 1, 2, 3):
        raise ConfigError("zero", zero, "must be 0, 1, 2 or 3")
    Parallelism(placement=placement)  # refuses an unknown placement before any work
    if precision is not None:
        spec.peak(precision)  # refuses a precision the card lacks before any work
    setting = _Setting(config=config, spec=spec, cluster=wiring, placement=placement, seq_len=s,
                       budget=spec.memory_bytes if memory_bytes is None else memory_bytes,
                       flops=forward_flops_per_token(config, s), dp_overlap=dp_overlap, allow_uneven=allow_uneven,
                       tp_overlap=tp_overlap, precision=precision, prune=prune, top=top)
    space = list(enumerate_candidates(config, wiring, num_gpus=num_gpus, global_batch=global_batch, seq_len=s,
                                      placement=placement, allow_uneven=allow_uneven, zero=zero,
                                      dp_overlap=dp_overlap))
    outcomes = [item for item in space if isinstance(item, Outcome)]
    runner = _GroupRunner(setting)
    queue: list[tuple[float, tuple[Any, ...], Candidate, tuple[tuple[int, int], ...]]] = []
    total = len(space)
    tick = _Ticker(progress, total)
    tick(bounded=len(outcomes), decided=len(outcomes))
    for index, item in enumerate(space):
        if isinstance(item, Candidate):
            bound, memory, partition = runner.first_bounds(item)
            if memory > setting.budget and prune:
                outcomes.append(Outcome(item, "pruned", f"its weights, gradients, optimizer state and a "
                                        f"microbatch's stash need at least {memory / 1e9:.1f} GB > "
                                        f"{setting.budget / 1e9:.1f} GB", peak_memory_bytes=memory,
                                        partition=runner.shape(item).text, step_bound_s=bound))
            else:
                queue.append((bound, order_key(item), item, partition))
        tick(bounded=index + 1, decided=len(outcomes))
    queue.sort(key=lambda entry: (entry[0], entry[1]))
    done = len(outcomes)
    best: list[tuple[float, tuple[Any, ...]]] = []  # the k best fitting steps, as a max-heap
    position = 0
    # An embedded cluster a round: their workers fork from one preloaded server for the whole search.
    with fork_server_kept() if workers is not None and scheduler is None else contextlib.nullcontext():
        while position < len(queue):
            threshold = -best[0][0] if prune and len(best) >= top else math.inf
            if queue[position][0] > threshold:
                outcomes += [beaten(item, bound, threshold, top, runner.shape(item).text)
                             for bound, _, item, _ in queue[position:]]
                break
            runner.setting = replace(setting, threshold=threshold)
            if workers is None and scheduler is None:
                decided = [runner.decide(queue[position][2], queue[position][3])]
            else:  # a round at this threshold; then settled one by one as in one process
                batch = queue[position:position + _round_size(workers)]
                decided = _on_dask(DaskCluster(workers=workers, scheduler=scheduler, shared=runner.setting),
                                   runner.setting, [[entry[2]] for entry in batch], progress=None, done=done, total=total)
            for (bound, _, item, _), outcome in zip(queue[position:], decided, strict=False):
                threshold = -best[0][0] if prune and len(best) >= top else math.inf
                if bound > threshold:
                    break
                if outcome.status != "dropped" and outcome.step_bound_s > threshold:
                    outcome = beaten(item, outcome.step_bound_s, threshold, top, outcome.partition)
                outcomes.append(outcome)
                position += 1
                done += 1
                if outcome.fits:
                    heapq.heappush(best, (-outcome.iteration_time_s, order_key(outcome.candidate)))
                    if len(best) > top:
                        heapq.heappop(best)
            tick(bounded=total, decided=done)
    tick(bounded=total, decided=total)
    outcomes.sort(key=rank_key)
    explained = 0
    for index, outcome in enumerate(outcomes):
        if not outcome.fits or explained >= top:
            break
        outcomes[index] = runner.explain(outcome)
        explained += 1
    return outcomes


class _Ticker:
    """Progress as (candidates done, candidates in all): a candidate counts half once its first
    bounds are known and whole once it is decided; at most about 100 calls."""

    def __init__(self, progress: Callable[[int, int], None] | None, total: int) -> None:
        self.progress, self.total, self.last = progress, total, -1

    def __call__(self, *, bounded: int, decided: int) -> None:
        done = (bounded + decided) // 2
        if self.progress is not None and (done == self.total or done - self.last >= max(1, self.total // 100)) \
                and done > self.last:
            self.last = done
            self.progress(done, self.total)


def _round_size(workers: int | None) -> int:
    return DASK_ROUND_PER_WORKER * max(1, workers or 4)


def _on_dask(cluster: DaskCluster, setting: _Setting, groups: list[list[Candidate]], *,
             progress: Callable[[int, int], None] | None, done: int, total: int) -> list[Outcome]:
    """``run_groups`` on Dask, the outcomes in the groups' order: while ``cluster`` starts in the
    background, groups are evaluated here, cheapest first; the rest go in batches by predicted
    cost, heaviest first (``pipesim.sweep.batches``), groups that share a schedule order together
    where they fit. The cluster is closed at the end."""
    from distributed import as_completed

    cluster.start()
    found: dict[int, list[Outcome]] = {}
    try:
        runner = _GroupRunner(setting)
        cheapest = sorted(range(len(groups)), key=lambda index: _group_cost(groups[index]))
        while cheapest and not cluster.is_ready():  # the cheapest groups run here while the cluster starts
            index = cheapest.pop(0)
            found[index] = runner.run(groups[index])
            done += len(groups[index])
            if progress is not None:
                progress(done, total)
        client = cluster.client()
        families: list[list[list[int]]] = []
        for index in sorted(cheapest):
            if families and _order_key(groups[families[-1][-1][0]][0]) == _order_key(groups[index][0]):
                families[-1].append([index])
            else:
                families.append([[index]])
        batches = plan_batches(families, lambda index: _group_cost(groups[index]),
                               max(1, sum(client.nthreads().values())), split_groups=False)
        futures = [client.submit(run_groups, cluster.shared, [groups[index] for index in batch], pure=False,
                                 priority=len(batches) - position)
                   for position, batch in enumerate(batches)]
        position_of = {future.key: position for position, future in enumerate(futures)}
        for future in as_completed(futures):  # type: ignore[no-untyped-call]
            outcomes = iter(future.result())
            for index in batches[position_of[future.key]]:
                found[index] = [next(outcomes) for _ in groups[index]]
                done += len(groups[index])
            if progress is not None:
                progress(done, total)
    finally:
        cluster.close()
    return [outcome for index in range(len(groups)) for outcome in found[index]]


def _order_key(item: Candidate) -> tuple[Any, ...]:
    """What decides a candidate's schedule order: its neighbours with the same one share it (``Reuse``)."""
    return (item.schedule, item.pp * item.stages_per_rank, item.num_microbatches)


def _group_cost(group: Sequence[Candidate]) -> int:
    """Predicted work of a group of candidates, in ops (``pipesim.sweep.batches.run_cost``)."""
    return sum(run_cost(item.schedule, item.pp * item.stages_per_rank, item.num_microbatches,
                        default_num_minibatches(item.schedule)) for item in group)


_megatron_cut = functools.lru_cache(maxsize=4096)(megatron_cut)


@functools.lru_cache(maxsize=4096)
def _cut_text(partition: tuple[tuple[int, int], ...]) -> str:
    return _text(partition)


def _text(partition: tuple[tuple[int, int], ...]) -> str:
    """``0:10,10:20,...``, as ``simulate --partition`` takes it."""
    return ",".join(f"{start}:{end}" for start, end in partition)
