"""The configuration search's space: every layout, microbatch size, schedule, V, recomputation,
sequence parallelism and ZeRO stage a Megatron/NeMo user can run on N GPUs.

- TP divides the heads (and the KV heads, or is a multiple of them); under ``tp-in-node`` it
  stays inside a node, under ``pp-in-node`` the pipeline does.
- CP splits each sequence into 2 x CP equal chunks (load-balanced causal attention), each CP
  rank holding at least ``MIN_CP_TOKENS`` tokens; EP (a mixture of experts only) divides the
  routed experts and DP x CP.
- Stages are cut as Megatron-LM cuts them (``megatron_cut``): whole blocks, equal per stage, or
  one fewer on the first and last stage. V (model stages per rank) takes every value that
  cuts so; ``allow_uneven`` adds the other counts, cut by balanced compute.
- Sequence parallelism on and off where TP > 1; recomputation none, selective, full; ZeRO 0 and
  1 (the distributed optimizer) with data parallelism, 2 and 3 (FSDP) only without a pipeline
  (DeepSpeed's pipeline engine refuses them, Megatron's FSDP runs without PP).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from pipesim.errors import ConfigError
from pipesim.schedule.interleaved_1f1b import rounds_of
from pipesim.schedule.multi_stage import loop_placement, v_placement
from pipesim.spec.cluster import Cluster
from pipesim.spec.parallel import divisors
from pipesim.spec.partition import megatron_cut
from pipesim.spec.transformer import RECOMPUTE_MODES, Recompute, TransformerConfig

MICROBATCH_SIZES = (1, 2, 4)
MIN_CP_TOKENS = 1024
# (schedule, V form): 1 one stage per rank, 2 the V placement, 0 every V >= 2 that cuts evenly.
SEARCH_SCHEDULES: tuple[tuple[str, int], ...] = (
    ("1f1b", 1), ("zb-h1", 1), ("zb-h2", 1), ("interleaved-1f1b", 0), ("interleaved-zb", 0), ("zbv", 2))
SPLIT_BACKWARD = frozenset({"zb-h1", "zb-h2", "interleaved-zb", "zbv"})


@dataclass(frozen=True)
class Candidate:
    """One configuration: degrees, microbatch size and count, schedule and V, recomputation,
    sequence parallelism, context and expert parallelism and ZeRO stage."""

    tp: int
    pp: int
    dp: int
    microbatch_size: int
    num_microbatches: int
    schedule: str
    stages_per_rank: int
    recompute: Recompute
    sequence_parallel: bool = False
    cp: int = 1
    ep: int = 1
    zero: int = 0

    @property
    def num_stages(self) -> int:
        return self.pp * self.stages_per_rank


@dataclass(frozen=True)
class Outcome:
    """A candidate and what became of it.

    Attributes:
        candidate: the configuration (``schedule`` ``*``: every schedule of a layout that the
            arithmetic rules out).
        status: ``"simulated"``, ``"pruned"`` (by a proven bound) or ``"dropped"`` (cannot be formed
            or run).
        reason: ``"fits"`` / ``"over budget"`` after simulation, else why it was not simulated.
        tokens_per_s, mfu, iteration_time_s: simulated throughput (0 when not simulated).
        peak_memory_bytes: simulated per-device peak, or the lower bound that pruned it.
        fits: simulated and within the budget.
        partition: the stages' layer ranges, ``0:10,10:20,...`` ("" when not cut).
        step_bound_s: the proven lower bound on the step time (0 when not computed).
        memory_bound_bytes: the proven lower bound on the peak from the exact stage costs and the
            schedule's order (0 when not computed).
        step_breakdown_s: for the top configurations, the step split into ``compute``, ``bubble``,
            ``tp_comm``, ``dp_comm``, ``pp_comm`` and ``optimizer`` seconds (``pipesim.search``).
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
    step_bound_s: float = 0.0
    memory_bound_bytes: float = 0.0
    step_breakdown_s: dict[str, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        """One flat JSON-ready row (the breakdown as ``step_<part>_s`` columns when known)."""
        row = {name: getattr(self.candidate, name) for name in _CANDIDATE_FIELDS}
        row.update({name: getattr(self, name) for name in _OUTCOME_FIELDS})
        for part, seconds in (self.step_breakdown_s or {}).items():
            row[f"step_{part}_s"] = seconds
        return row


_CANDIDATE_FIELDS = tuple(field.name for field in fields(Candidate))
_OUTCOME_FIELDS = tuple(field.name for field in fields(Outcome) if field.name not in ("candidate", "step_breakdown_s"))


def layer_cut(config: TransformerConfig, num_stages: int, *, allow_uneven: bool) -> str:
    """``"even"`` when Megatron cuts the model into ``num_stages`` stages, ``"uneven"`` when only
    balanced compute can (``allow_uneven``), ``""`` when neither may."""
    if _cuts_evenly(config.num_layers, num_stages):
        return "even"
    return "uneven" if allow_uneven and num_stages <= config.num_layers + 2 else ""


@functools.lru_cache(maxsize=4096)
def _cuts_evenly(num_layers: int, num_stages: int) -> bool:
    return megatron_cut(num_layers, num_stages) is not None


def stage_ranks(schedule: str, num_ranks: int, num_stages: int) -> tuple[int, ...]:
    """The rank of each stage: one each, the V, or round the ranks (interleaved)."""
    if schedule == "zbv":
        return v_placement(num_ranks)
    return loop_placement(num_ranks, num_stages)


def enumerate_candidates(config: TransformerConfig, cluster: Cluster, *, num_gpus: int, global_batch: int,
                         seq_len: int | None = None, placement: str = "tp-in-node", allow_uneven: bool = False,
                         zero: int | None = None, dp_overlap: bool = False) -> Iterator[Candidate | Outcome]:
    """Every configuration of the space (module docstring), or an Outcome saying why a layout
    (all its schedules at once: schedule ``*``) or a schedule cannot be formed; ``seq_len``
    defaults to the model's."""
    seq_len = config.seq_len if seq_len is None else seq_len
    per_node = cluster.gpus_per_node
    widest = min(per_node, num_gpus) if placement == "tp-in-node" else num_gpus
    for tp in (t for t in divisors(widest) if num_gpus % t == 0):
        if config.num_heads % tp or (config.num_kv_heads % tp and tp % config.num_kv_heads):
            continue
        for cp in divisors(num_gpus // tp):
            if cp > 1 and (seq_len % (2 * cp) or seq_len // cp < MIN_CP_TOKENS):
                continue
            for pp in divisors(num_gpus // (tp * cp)):
                if placement == "pp-in-node" and pp > per_node:
                    continue
                dp = num_gpus // (tp * cp * pp)
                experts = [e for e in divisors(config.num_experts) if (dp * cp) % e == 0] if config.is_moe else [1]
                for size in MICROBATCH_SIZES:
                    count, left = divmod(global_batch, size * dp)
                    for ep in experts:
                        base = Candidate(tp=tp, pp=pp, dp=dp, microbatch_size=size, num_microbatches=count,
                                         schedule="*", stages_per_rank=1, recompute="none", cp=cp, ep=ep)
                        if left or count == 0:
                            yield Outcome(base, "dropped", f"global batch {global_batch} is not a multiple of "
                                          f"microbatch size x dp = {size * dp}")
                            continue
                        yield from _configurations(config, base, allow_uneven=allow_uneven, zero=zero,
                                                   dp_overlap=dp_overlap)


def _configurations(config: TransformerConfig, base: Candidate, *, allow_uneven: bool, zero: int | None,
                    dp_overlap: bool) -> Iterator[Candidate | Outcome]:
    """One layout's schedules x V x sequence parallelism x recomputation x ZeRO."""
    pp, count = base.pp, base.num_microbatches
    replicas = base.dp * base.cp
    stages = [0, 1] if replicas > 1 else [0]
    if pp == 1 and replicas > 1 and not dp_overlap:
        stages += [2, 3]
    if zero is not None:
        stages = [stage for stage in stages if stage == zero]
        if not stages:
            yield Outcome(base, "dropped", f"ZeRO-{zero} needs data parallelism"
                          + (" and no pipeline (pp = 1) nor --dp-overlap" if zero >= 2 else ""))
            return
    parallel = [False, True] if base.tp > 1 else [False]
    for schedule, form in SEARCH_SCHEDULES:
        if pp == 1 and schedule != "1f1b":
            continue  # one rank: every flush schedule runs the same ops in the same order
        if form == 0:
            per_rank_counts = [v for v in range(2, config.num_layers + 3) if layer_cut(config, pp * v, allow_uneven=False)]
            if allow_uneven:
                per_rank_counts = [v for v in range(2, (config.num_layers + 2) // pp + 1)]
        else:
            per_rank_counts = [form]
        for per_rank in per_rank_counts:
            shape = replace(base, schedule=schedule, stages_per_rank=per_rank)
            cut = layer_cut(config, pp * per_rank, allow_uneven=allow_uneven)
            if not cut:
                rule = " (--allow-uneven cuts them by compute)" if pp * per_rank <= config.num_layers + 2 else ""
                yield Outcome(shape, "dropped", f"{pp * per_rank} stages do not cut the {config.num_layers} "
                              f"layers evenly{rule}")
                continue
            if schedule.startswith("interleaved"):
                try:
                    rounds_of(schedule, pp, count)
                except ConfigError as error:
                    yield Outcome(shape, "dropped", str(error).splitlines()[0])
                    continue
            for sequence_parallel in parallel:
                for recompute in RECOMPUTE_MODES:
                    for stage in stages:
                        yield Candidate(shape.tp, shape.pp, shape.dp, shape.microbatch_size, count, schedule,
                                        per_rank, recompute, sequence_parallel, shape.cp, shape.ep, stage)


def beaten(item: Candidate, bound: float, threshold: float, top: int, partition: str) -> Outcome:
    """A candidate pruned by its step bound."""
    return Outcome(item, "pruned", f"its step takes at least {bound:.4g} s, more than the {ordinal(top)} best "
                   f"{threshold:.4g} s", partition=partition, step_bound_s=bound)


def held_over(item: Candidate, held: float, budget: float, partition: str, step_bound_s: float = 0.0) -> Outcome:
    """A candidate pruned by the memory its schedule's order holds."""
    return Outcome(item, "pruned", f"its schedule holds at least {held / 1e9:.1f} GB on a device > {budget / 1e9:.1f} "
                   "GB", peak_memory_bytes=held, partition=partition, step_bound_s=step_bound_s,
                   memory_bound_bytes=held)


def order_key(item: Candidate) -> tuple[Any, ...]:
    """A fixed order among candidates with equal bounds or steps."""
    return (item.tp, item.cp, item.ep, item.pp, item.dp, item.microbatch_size, item.schedule, item.stages_per_rank,
            item.sequence_parallel, item.recompute, item.zero)


def rank_key(outcome: Outcome) -> tuple[Any, ...]:
    """Fitting first by tokens/s, then over budget, then pruned and dropped."""
    order = {"simulated": 0, "pruned": 1, "dropped": 2}[outcome.status]
    return (not outcome.fits, order, -outcome.tokens_per_s, outcome.step_bound_s, order_key(outcome.candidate))


def ordinal(k: int) -> str:
    return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


def search_counts(outcomes: Sequence[Outcome]) -> dict[str, int]:
    """``num_candidates`` (formed), ``num_simulated``, ``num_pruned_by_memory``, ``num_pruned_by_bound``,
    ``num_dropped`` (what cannot be formed or run)."""
    pruned = [o for o in outcomes if o.status == "pruned"]
    memory = sum(o.peak_memory_bytes > 0 for o in pruned)
    simulated = sum(o.status == "simulated" for o in outcomes)
    dropped = sum(o.status == "dropped" for o in outcomes)
    return {"num_candidates": simulated + len(pruned) + sum(o.status == "dropped" and o.candidate.schedule != "*"
                                                               and bool(o.partition) for o in outcomes),
            "num_simulated": simulated, "num_pruned_by_memory": memory, "num_pruned_by_bound": len(pruned) - memory,
            "num_dropped": dropped}
