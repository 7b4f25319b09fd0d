"""A simulated configuration search: TP x PP x DP, microbatch size, schedule and recomputation for a model on N GPUs.

Each candidate is either dropped by arithmetic (degrees that do not divide the GPUs, heads or
batch; more stages than layers) or by a lower bound on its memory that already exceeds the
budget (the weights, gradients and optimizer state of its heaviest stage plus one microbatch's
stash), or simulated on the analytic engine, which then decides whether it fits from the
simulated per-device peak. Large spaces run on Dask (the sweep's cluster). Placement is
Megatron's unless told otherwise: TP ranks neighbours (inside a node), then data-parallel peers,
then pipeline stages, each group's traffic on the cluster tier it spans; ``pp-in-node`` makes a
pipeline's stages neighbours instead (their hops inside a node, TP groups across nodes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pipesim.errors import ConfigError, PipesimError
from pipesim.reuse import Reuse
from pipesim.schedule.registry import default_num_minibatches
from pipesim.simulation import make_plan, simulate_plan
from pipesim.spec.cluster import Cluster, load_cluster
from pipesim.spec.device import Device, load_device
from pipesim.spec.parallel import divisors, zero_optimizer_multiplier
from pipesim.spec.profile import Profile
from pipesim.spec.stages import balance_partition
from pipesim.spec.topology import Topology
from pipesim.spec.model_files import load_model
from pipesim.spec.transformer import RECOMPUTE_MODES, Recompute, TransformerConfig, forward_flops_per_token
from pipesim.training import model_throughput
from pipesim.spec.transformer_profile import (
    ADAM_STATE_MULTIPLIER,
    PLACEMENTS,
    Parallelism,
    default_cluster,
    pipeline_bandwidth_bytes_per_s,
    pipeline_latency_s,
    transformer_profile,
)
from pipesim.sweep.batches import plan_batches, run_cost
from pipesim.sweep.dask_cluster import DaskCluster

# (schedule, stages per rank): the flush schedules a training job would pick, with their V forms.
SEARCH_SCHEDULES: tuple[tuple[str, int], ...] = (("1f1b", 1), ("interleaved-1f1b", 2), ("zb-h1", 1), ("zbv", 2))
MICROBATCH_SIZES = (1, 2, 4)
# GPUs N: past the largest clusters built; bounds the candidates enumerated from N's divisors.
MAX_GPUS = 1_000_000
# Above this many candidates left to evaluate (about 0.1 s each here), search goes to Dask by
# itself: Llama-3 70B on 512 GPUs has 924 and stays in process.
DASK_MIN_CANDIDATES = 1000
# Least stash first: a peak over budget rules out the modes after it (see ``search``).
RECOMPUTE_ORDER: tuple[Recompute, ...] = ("full", "selective", "none")


@dataclass(frozen=True)
class Candidate:
    """One configuration: degrees, microbatch size and count, schedule and recomputation."""

    tp: int
    pp: int
    dp: int
    microbatch_size: int
    num_microbatches: int
    schedule: str
    stages_per_rank: int
    recompute: Recompute


@dataclass(frozen=True)
class Outcome:
    """A candidate and what became of it.

    Attributes:
        candidate: the configuration.
        status: ``"simulated"`` or ``"dropped"``.
        reason: why it was dropped, or ``"fits"`` / ``"over budget"`` after simulation.
        tokens_per_s, mfu, iteration_time_s: simulated throughput (0 when dropped).
        peak_memory_bytes: simulated per-device peak, or the lower bound that dropped it.
        fits: simulated and within the budget.
        partition: the stages' layer ranges, ``0:10,10:20,...`` ("" when not cut).
    """

    candidate: Candidate
    status: str
    reason: str
    tokens_per_s: float = 0.0
    mfu: float = 0.0
    iteration_time_s: float = 0.0
    peak_memory_bytes: float = 0.0
    fits: bool = False
    partition: str = ""

    def to_dict(self) -> dict[str, Any]:
        """One flat JSON-ready row."""
        row = asdict(self.candidate)
        row.update({key: value for key, value in asdict(self).items() if key != "candidate"})
        return row


def enumerate_candidates(config: TransformerConfig, cluster: Cluster, *, num_gpus: int,
                         global_batch: int, placement: str = "tp-in-node") -> Iterator[Candidate | Outcome]:
    """Every configuration in the space, or an Outcome saying why one cannot be formed.

    A node bounds TP under ``tp-in-node`` and PP under ``pp-in-node``.
    """
    per_node = cluster.gpus_per_node
    widest = min(per_node, num_gpus) if placement == "tp-in-node" else num_gpus
    for tp in (t for t in divisors(widest) if num_gpus % t == 0):
        if config.num_heads % tp or (config.num_kv_heads % tp and tp % config.num_kv_heads):
            continue
        for pp in (p for p in divisors(num_gpus // tp) if placement == "tp-in-node" or p <= per_node):
            dp = num_gpus // (tp * pp)
            for size in MICROBATCH_SIZES:
                for schedule, per_rank in SEARCH_SCHEDULES:
                    for recompute in RECOMPUTE_MODES:
                        count, left = divmod(global_batch, size * dp)
                        candidate = Candidate(tp=tp, pp=pp, dp=dp, microbatch_size=size, num_microbatches=count,
                                              schedule=schedule, stages_per_rank=per_rank, recompute=recompute)
                        if left or count == 0:
                            yield Outcome(candidate, "dropped", f"global batch {global_batch} is not a multiple of "
                                          f"microbatch size x dp = {size * dp}")
                        elif pp * per_rank > config.num_layers + 2:
                            yield Outcome(candidate, "dropped", f"{pp * per_rank} stages exceed the "
                                          f"{config.num_layers + 2} layers")
                        else:
                            yield candidate


def memory_lower_bound(profile: Profile, partition: tuple[tuple[int, int], ...], optimizer_multiplier: float) -> float:
    """The most any stage of ``partition`` holds at least: weights, gradients, optimizer state and one
    microbatch's stash."""
    bound = 0.0
    for start, end in partition:
        layers = profile.layers[start:end]
        weights = sum(layer.param_bytes for layer in layers)
        bound = max(bound, weights * (2 + optimizer_multiplier) + sum(layer.stashed_bytes for layer in layers))
    return bound


@dataclass(frozen=True)
class _Setting:
    """What every candidate of one search shares (sent to Dask workers with their batches)."""

    config: TransformerConfig
    spec: Device
    cluster: Cluster
    placement: str
    seq_len: int
    budget: float
    zero: int
    flops: float
    dp_overlap: bool


class _GroupRunner:
    """Evaluates groups of candidates (one configuration's recomputation modes, full to none),
    keeping the profiles it builds and the schedule orders it lowers (``Reuse``) between groups."""

    def __init__(self, setting: _Setting) -> None:
        self.setting = setting
        self.reuse = Reuse()
        self.profiles: dict[tuple[int, int, str, int, int], Profile] = {}

    def profile_of(self, item: Candidate, recompute: Recompute) -> Profile:
        key = (item.tp, item.microbatch_size, recompute, item.dp, item.pp)
        if key not in self.profiles:
            setting = self.setting
            self.profiles[key] = transformer_profile(
                setting.config, device=setting.spec, cluster=setting.cluster, microbatch_size=item.microbatch_size,
                seq_len=setting.seq_len, tp=item.tp, recompute=recompute, pp=item.pp, dp=item.dp, zero=setting.zero,
                dp_overlap=setting.dp_overlap, placement=setting.placement)
        return self.profiles[key]

    def run(self, group: Sequence[Candidate]) -> list[Outcome]:
        setting, outcomes = self.setting, []
        over: Outcome | None = None
        for item in group:
            partition = balance_partition(self.profile_of(item, "none"), item.pp * item.stages_per_rank)
            if over is not None:
                outcomes.append(Outcome(item, "dropped", f"over budget: it stashes more than with "
                                        f"{over.candidate.recompute} recomputation, whose simulated peak is "
                                        f"{over.peak_memory_bytes / 1e9:.1f} GB",
                                        peak_memory_bytes=over.peak_memory_bytes, partition=_text(partition)))
                continue
            outcome = _evaluate(item, self.profile_of(item, item.recompute), partition, setting, self.reuse)
            if outcome.status == "simulated" and not outcome.fits:
                over = outcome
            outcomes.append(outcome)
        return outcomes


def run_groups(setting: _Setting, groups: Sequence[Sequence[Candidate]]) -> list[Outcome]:
    """The Dask task: a batch of groups on one worker, in order."""
    runner = _GroupRunner(setting)
    return [outcome for group in groups for outcome in runner.run(group)]


def search(model: str | TransformerConfig, *, device: str | Device, num_gpus: int, global_batch: int,
           seq_len: int | None = None, memory_bytes: float | None = None, zero: int = 0,
           placement: str = "tp-in-node", dp_overlap: bool = False, cluster: str | Cluster | None = None,
           workers: int | None = None,
           scheduler: str | None = None, progress: Callable[[int, int], None] | None = None) -> list[Outcome]:
    """Every candidate's outcome, the fitting ones first by tokens/s, then the others.

    The layers are cut as the model without recomputation balances them, whatever the
    recomputation (as Megatron cuts by layer count), so the three recomputation modes of one
    configuration differ only in what each microbatch stashes. A device's memory follows its
    rank's op order alone, so its peak grows with the stash: the modes run from full to none,
    and once one is over budget the ones that keep more are dropped without simulation.

    Args:
        dp_overlap: the data-parallel all-reduce overlapped with the last backward (``simulate
            --dp-overlap``) rather than after it.
        workers, scheduler: run on Dask (the sweep's ``dask_client``): an embedded cluster of
            ``workers`` processes on 127.0.0.1, or the scheduler at that address. Neither: in this
            process, unless more than ``DASK_MIN_CANDIDATES`` candidates are left to evaluate
            (then an embedded cluster of one process per CPU). The outcomes are the same.
        progress: called with (candidates done, candidates in all) at the start and as groups
            finish.

    Raises:
        ConfigError: a count or sequence length below 1, more than ``MAX_GPUS`` GPUs, an unknown
            placement or an unreachable scheduler.
    """
    config = load_model(model) if isinstance(model, str) else model
    spec = load_device(device) if isinstance(device, str) else device
    wiring = default_cluster(spec) if cluster is None else load_cluster(cluster) if isinstance(cluster, str) else cluster
    s = config.seq_len if seq_len is None else seq_len
    for field, value in (("gpus", num_gpus), ("global_batch", global_batch), ("seq_len", s)):
        if value < 1:
            raise ConfigError(field, value, "must be >= 1")
    if num_gpus > MAX_GPUS:
        raise ConfigError("gpus", num_gpus, f"must be <= {MAX_GPUS:,}")
    Parallelism(placement=placement)  # refuses an unknown placement before any work
    setting = _Setting(config=config, spec=spec, cluster=wiring, placement=placement, seq_len=s,
                       budget=spec.memory_bytes if memory_bytes is None else memory_bytes, zero=zero,
                       flops=forward_flops_per_token(config, s), dp_overlap=dp_overlap)
    # Candidates sharing a schedule order run one after another, so that Reuse builds it once; a
    # configuration's recomputation modes (a group) are neighbours, full to none.
    space = sorted(enumerate_candidates(config, wiring, num_gpus=num_gpus, global_batch=global_batch,
                                        placement=placement),
                   key=lambda item: (0, "", 0, 0, 0, 0, 0) if isinstance(item, Outcome) else
                   (1, item.schedule, item.pp * item.stages_per_rank, item.num_microbatches, item.tp,
                    item.microbatch_size, RECOMPUTE_ORDER.index(item.recompute)))
    outcomes = [item for item in space if isinstance(item, Outcome)]
    groups: list[list[Candidate]] = []
    for item in space:
        if isinstance(item, Candidate):
            if groups and _group_key(groups[-1][0]) == _group_key(item):
                groups[-1].append(item)
            else:
                groups.append([item])
    done, total = len(outcomes), len(space)
    if progress is not None:
        progress(done, total)
    is_large = total - done > DASK_MIN_CANDIDATES
    if workers is None and scheduler is None and not is_large:
        runner = _GroupRunner(setting)
        for group in groups:
            outcomes += runner.run(group)
            done += len(group)
            if progress is not None:
                progress(done, total)
    else:
        outcomes += _on_dask(DaskCluster(workers=workers, scheduler=scheduler, shared=setting), setting, groups,
                             progress=progress, done=done, total=total)
    outcomes.sort(key=lambda o: (not o.fits, o.status != "simulated", -o.tokens_per_s, o.peak_memory_bytes))
    return outcomes


def _group_key(item: Candidate) -> tuple[Any, ...]:
    """A configuration without its recomputation mode."""
    return (item.tp, item.pp, item.dp, item.microbatch_size, item.schedule, item.stages_per_rank)


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


def _text(partition: tuple[tuple[int, int], ...]) -> str:
    """``0:10,10:20,...``, as ``simulate --partition`` takes it."""
    return ",".join(f"{start}:{end}" for start, end in partition)


def _evaluate(candidate: Candidate, profile: Profile, partition: tuple[tuple[int, int], ...], setting: _Setting,
              reuse: Reuse) -> Outcome:
    budget = setting.budget
    multiplier = zero_optimizer_multiplier(ADAM_STATE_MULTIPLIER, candidate.dp, setting.zero)
    cut = _text(partition)
    bound = memory_lower_bound(profile, partition, multiplier)
    if bound > budget:
        return Outcome(candidate, "dropped", f"its heaviest stage needs at least {bound / 1e9:.1f} GB "
                       f"> {budget / 1e9:.1f} GB", peak_memory_bytes=bound, partition=cut)
    layout = Parallelism(tp=candidate.tp, pp=candidate.pp, dp=candidate.dp, placement=setting.placement)
    topology = Topology.uniform(num_devices=candidate.pp,
                                bandwidth=pipeline_bandwidth_bytes_per_s(setting.cluster, layout),
                                latency=pipeline_latency_s(setting.cluster, layout), memory_bytes=budget)
    try:
        plan = make_plan(profile, schedule=candidate.schedule, num_stages=len(partition),
                         num_microbatches=candidate.num_microbatches, stages_per_rank=candidate.stages_per_rank,
                         optimizer_state_multiplier=multiplier, partition=partition)
        result = simulate_plan(profile, topology, plan, engine="auto", reuse=reuse)
    except PipesimError as error:
        return Outcome(candidate, "dropped", str(error).splitlines()[0], partition=cut)
    metrics = result.metrics
    peak = max(metrics.device_peak_memory_bytes)
    tokens, mfu = model_throughput(metrics.throughput_samples_per_s, dp=candidate.dp, seq_len=setting.seq_len,
                                   forward_flops_per_token=setting.flops, num_gpus=candidate.tp * candidate.pp * candidate.dp,
                                   peak_flops=setting.spec.peak(setting.spec.default_precision))
    fits = peak <= budget
    return Outcome(candidate, "simulated", "fits" if fits else "over budget", tokens_per_s=tokens, mfu=mfu,
                   iteration_time_s=metrics.iteration_time_s, peak_memory_bytes=peak, fits=fits, partition=cut)
