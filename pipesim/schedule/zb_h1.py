"""ZB-H1, the zero-bubble paper's memory-efficient handcrafted schedule (one stage per rank)."""

from __future__ import annotations

from pipesim.errors import ConfigError
from pipesim.schedule.ir import F_CODE, I_CODE, W_CODE, Schedule
from pipesim.schedule.multi_stage import Runs, assemble, rank_by_rank, ranks_and_stages


def split_1f1b_order(runs: Runs, stage: int, num_microbatches: int, *, warmup: int, weight_lag: int) -> None:
    """1F1B with the backward split into I and W, each stage's W running ``weight_lag`` behind its I.

    ``warmup`` forwards (capped at m), then steps i = 0..m-1 of F(i + warmup) while forwards
    remain, I(i), and W(i - weight_lag) once that is a microbatch; the W still pending close
    the order. The steps fall into runs (``Runs``), split where the forwards end and where
    the W's start.
    """
    m, s = num_microbatches, stage
    warmup = min(warmup, m)
    forwards_end, weights_start = m - warmup, min(weight_lag, m)
    runs.repeat(warmup, (s, F_CODE, 0))
    first = min(forwards_end, weights_start)
    runs.repeat(first, (s, F_CODE, warmup), (s, I_CODE, 0))
    if forwards_end < weights_start:
        runs.repeat(weights_start - first, (s, I_CODE, first))
    else:
        runs.repeat(forwards_end - first, (s, F_CODE, first + warmup), (s, I_CODE, first), (s, W_CODE, first - weight_lag))
    both = max(forwards_end, weights_start)
    runs.repeat(m - both, (s, I_CODE, both), (s, W_CODE, both - weight_lag))
    runs.repeat(weights_start, (s, W_CODE, m - weights_start))


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
    m = num_microbatches
    return assemble("zb-h1", p, m, num_minibatches, tuple(range(p)), rank_by_rank(
        p, m, lambda runs, s: split_1f1b_order(runs, s, m, warmup=p - 1 - s, weight_lag=s)))
