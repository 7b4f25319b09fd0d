"""ZB-H1, the zero-bubble paper's memory-efficient handcrafted schedule (one stage per rank)."""

from __future__ import annotations

from pipesim.errors import ConfigError
from pipesim.schedule.ir import Op, OpKind, Schedule
from pipesim.schedule.multi_stage import assemble, ranks_and_stages


def split_1f1b_order(stage: int, num_microbatches: int, *, warmup: int, weight_lag: int) -> list[Op]:
    """1F1B with the backward split into I and W, each stage's W running ``weight_lag`` behind its I.

    ``warmup`` forwards (capped at m), then steps of (F, I, W) while forwards remain, then
    (I, W) steps; W(j) follows I(j + weight_lag), and the W still pending close the order.
    """
    warmup = min(warmup, num_microbatches)
    ops = [Op(stage, OpKind.F, i) for i in range(warmup)]
    next_weight = 0
    for i in range(num_microbatches):
        if i + warmup < num_microbatches:
            ops.append(Op(stage, OpKind.F, i + warmup))
        ops.append(Op(stage, OpKind.I, i))
        if i - next_weight >= weight_lag:
            ops.append(Op(stage, OpKind.W, next_weight))
            next_weight += 1
    ops += [Op(stage, OpKind.W, i) for i in range(next_weight, num_microbatches)]
    return ops


def one_stage_per_rank_only(name: str, num_stages: int, num_ranks: int | None) -> None:
    """Reject ``num_ranks`` other than ``num_stages`` for a one-stage-per-rank schedule.

    Raises:
        ConfigError: several stages per rank were asked for.
    """
    _, stages_per_rank = ranks_and_stages(name, num_stages, num_ranks)
    if stages_per_rank != 1:
        raise ConfigError("stages_per_rank", stages_per_rank, f"{name} runs one stage per rank")


def zb_h1(
    num_stages: int,
    num_microbatches: int,
    *,
    num_minibatches: int = 1,
    num_ranks: int | None = None,
) -> Schedule:
    """ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, section 2.1).

    Stage s warms up with ``p-1-s`` forwards as 1F1B does, then runs (F, I, W) steps with its
    W delayed by s microbatches, so every stage holds p microbatches between F and W, the
    peak of 1F1B's stage 0. With uniform stages, m >= p and ``tW <= min(tF, tI)`` the
    iteration time is ``m(tF+tI+tW) + (p-1)(tF+tI-tW)``: a third of 1F1B's bubble when the
    three are equal. p = 3, m = 3::

        stage 0: 0F0 0F1 0F2 0I0 0W0 0I1 0W1 0I2 0W2
        stage 1: 1F0 1F1 1I0 1F2 1I1 1W0 1I2 1W1 1W2
        stage 2: 2F0 2I0 2F1 2I1 2F2 2I2 2W0 2W1 2W2
    """
    one_stage_per_rank_only("zb-h1", num_stages, num_ranks)
    p = num_stages
    return assemble(
        "zb-h1", p, num_microbatches, num_minibatches, tuple(range(p)),
        lambda s, m: split_1f1b_order(s, m, warmup=p - 1 - s, weight_lag=s),
    )
