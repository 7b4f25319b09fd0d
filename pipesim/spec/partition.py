"""Cutting a layer chain into contiguous stages without a cost model: even layer counts, or balanced compute.

The cost-aware partitioners build on these ranges: PipeDream's dynamic program over replicated
stages and links is ``pipesim.plan.partition``, PipeDream's released optimizer
``pipesim.plan.compat``.
"""

from __future__ import annotations

import bisect
from itertools import accumulate

from pipesim.errors import ConfigError
from pipesim.spec.profile import Profile


def even_partition(num_layers: int, num_stages: int) -> tuple[tuple[int, int], ...]:
    """Equal layer counts per stage (the first stages take one more when they do not divide).

    Raises:
        ConfigError: more stages than layers.
    """
    if num_stages > num_layers:
        raise ConfigError("num_stages", num_stages, f"must be <= the number of layers ({num_layers})")
    base, extra = divmod(num_layers, num_stages)
    bounds = [0]
    for stage in range(num_stages):
        bounds.append(bounds[-1] + base + (1 if stage < extra else 0))
    return tuple((bounds[i], bounds[i + 1]) for i in range(num_stages))


def megatron_cut(num_layers: int, num_stages: int) -> tuple[tuple[int, int], ...] | None:
    """Megatron-LM's cut of a transformer profile (embedding, ``num_layers`` blocks, head) into
    stages of whole blocks, or None when it has none for this count.

    Equal blocks per stage when ``num_stages`` divides them, the embedding on the first stage and
    the head on the last; else, when it divides ``num_layers + 2``, the embedding and the head
    each count as a block: the first and last stages hold one block fewer (Llama 3 405B's 126
    layers on 16 stages; Megatron's ``account_for_embedding_in_pipeline_split`` and loss).
    """
    if num_stages < 1:
        return None
    if num_layers % num_stages == 0:
        chunk, ends = num_layers // num_stages, 0
    elif num_stages >= 2 and (num_layers + 2) % num_stages == 0:
        chunk, ends = (num_layers + 2) // num_stages, 1
    else:
        return None
    bounds = [0] + [1 + stage * chunk - ends for stage in range(1, num_stages)] + [num_layers + 2]
    return tuple((bounds[i], bounds[i + 1]) for i in range(num_stages))


def balance_partition(profile: Profile, num_stages: int) -> tuple[tuple[int, int], ...]:
    """Cut the layers into ``num_stages`` contiguous ranges minimizing the largest stage compute.

    Compute of a layer is ``forward_s + backward_s``. Exact for the min-max objective: a
    binary search over candidate bottlenecks with a greedy feasibility test.

    Raises:
        ConfigError: more stages than layers.
    """
    n = profile.num_layers
    if num_stages > n:
        raise ConfigError("num_stages", num_stages, f"must be <= the number of layers ({n})")
    costs = [layer.forward_s + layer.backward_s for layer in profile.layers]
    prefix = [0.0, *accumulate(costs)]

    def cuts_for(limit: float) -> list[int] | None:
        # Prefix sums round differently at different offsets, so a range equal to the limit can
        # come out a few ulps above it; without the slack, uniform layers split unevenly.
        limit *= 1 + 1e-9
        cuts, start = [], 0
        while start < n:
            # Furthest end such that prefix[end] - prefix[start] <= limit, at least one layer.
            end = bisect.bisect_right(prefix, prefix[start] + limit, lo=start + 1) - 1
            end = max(end, start + 1)
            if prefix[end] - prefix[start] > limit:
                return None
            cuts.append(end)
            start = end
            if len(cuts) > num_stages:
                return None
        return cuts

    candidates = sorted({prefix[j] - prefix[i] for i in range(n) for j in range(i + 1, n + 1)}) if n <= 400 else []
    if candidates:
        low, high = 0, len(candidates) - 1
        while low < high:
            middle = (low + high) // 2
            if cuts_for(candidates[middle]) is not None:
                high = middle
            else:
                low = middle + 1
        best = candidates[low]
    else:
        low_s, high_s = max(costs), prefix[-1]
        for _ in range(100):
            middle_s = (low_s + high_s) / 2
            if cuts_for(middle_s) is not None:
                high_s = middle_s
            else:
                low_s = middle_s
        best = high_s
    cuts = cuts_for(best)
    assert cuts is not None
    # Fewer stages than asked never beats more: split the widest ranges until there are enough.
    bounds = [0, *cuts]
    while len(bounds) - 1 < num_stages:
        widths = [(bounds[i + 1] - bounds[i], -i) for i in range(len(bounds) - 1)]
        width, negative_index = max(widths)
        index = -negative_index
        bounds.insert(index + 1, bounds[index] + width // 2 if width > 1 else bounds[index] + 1)
    return tuple((bounds[i], bounds[i + 1]) for i in range(num_stages))
