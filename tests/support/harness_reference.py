"""Plain single-process references of the training rules the harness must reproduce (tests only)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as functional

from pipesim.harness.rank.models import ModelBundle
from pipesim.harness.rank.weights import slots_of

Weights = list[torch.Tensor]  # per layer (W, b) flattened: [W0, b0, W1, b1, ...]


def initial_weights(bundle: ModelBundle) -> Weights:
    """The model's initial weights, in slot order."""
    return [module._parameters[name].detach().clone() for module, name in slots_of(bundle.layers)]


def flush_reference(bundle: ModelBundle, *, m: int, k: int, batch: int, lr: float) -> Weights:
    """Non-pipelined training: each minibatch (m microbatches concatenated) is one SGD step with autograd."""
    model = torch.nn.Sequential(*bundle.layers[:-1])
    params = [module._parameters[name] for module, name in slots_of(bundle.layers[:-1])]
    for step in range(k):
        parts = [bundle.microbatch(step * m + i, batch) for i in range(m)]
        inputs = torch.cat([x for x, _ in parts])
        target = torch.cat([t for _, t in parts])
        loss = functional.mse_loss(model(inputs), target)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for param, grad in zip(params, grads, strict=True):
                param -= lr * grad
    return [p.detach().clone() for p in params]


def mlp_gradients(stages: list[list[int]], forward: list[Weights], backward: list[Weights],
                  x: torch.Tensor, target: torch.Tensor) -> list[Weights]:
    """By hand, for the built-in MLP: activations from the ``forward`` weights, backward through ``backward``.

    ``stages[s]`` lists stage s's layer indices; ``forward[s]`` and ``backward[s]`` hold its
    (W, b) pairs in order. Returns each stage's weight gradients, in the same order.
    """
    saved: list[list[tuple[int, torch.Tensor]]] = []
    h = x
    for s, layers in enumerate(stages):
        mine = []
        for position, layer in enumerate(layers):
            weight, bias = forward[s][2 * position], forward[s][2 * position + 1]
            if layer > 0:  # a block: ReLU, then Linear
                h = torch.relu(h)
            mine.append((layer, h))  # the Linear's input (for a block, also the ReLU's output)
            h = h @ weight.T + bias
        saved.append(mine)
    g = 2.0 * (h - target) / h.numel()
    grads: list[Weights] = [[] for _ in stages]
    for s in reversed(range(len(stages))):
        stage_grads: list[torch.Tensor] = []
        for position in reversed(range(len(stages[s]))):
            layer, inputs = saved[s][position]
            weight = backward[s][2 * position]
            stage_grads = [g.T @ inputs, g.sum(0), *stage_grads]
            g = g @ weight
            if layer > 0:
                g = g * (inputs > 0)
        grads[s] = stage_grads
    return grads


def asynchronous_reference(
    bundle: ModelBundle, stages: list[list[int]], *, total: int, update_every: int, batch: int, lr: float,
    forward_version: Callable[[int, int], int], backward_version: Callable[[int, int], int],
    step_size: Callable[[int, int], float] | None = None, correction_decay: float | None = None,
) -> Weights:
    """Microbatch j on stage s runs forward on version ``forward_version(s, j)`` and backward on
    ``backward_version(s, j)``; update k of stage s applies the mean gradient of microbatches
    ``[k*u, (k+1)*u)`` to the newest version. With ``correction_decay``, a backward D versions
    after its forward uses ``w - D * delta`` (delta: moving average of the per-update change)."""
    start = initial_weights(bundle)
    offsets, index = [], 0
    for layers in stages:
        offsets.append((index, index + 2 * len(layers)))
        index += 2 * len(layers)
    versions = [[start[a:b]] for a, b in offsets]
    deltas = [[[torch.zeros_like(w) for w in start[a:b]]] for a, b in offsets]
    for update in range(total // update_every):
        sums: list[Weights] = [[torch.zeros_like(w) for w in versions[s][-1]] for s in range(len(stages))]
        for j in range(update * update_every, (update + 1) * update_every):
            x, target = bundle.microbatch(j, batch)
            forward = [versions[s][forward_version(s, j)] for s in range(len(stages))]
            backward = []
            for s in range(len(stages)):
                fv, bv = forward_version(s, j), backward_version(s, j)
                weights = versions[s][bv]
                if correction_decay is not None and bv > fv:
                    weights = [w - (bv - fv) * d for w, d in zip(weights, deltas[s][bv], strict=True)]
                backward.append(weights)
            for s, grads in enumerate(mlp_gradients(stages, forward, backward, x, target)):
                sums[s] = [a + g for a, g in zip(sums[s], grads, strict=True)]
        for s in range(len(stages)):
            rate = step_size(s, update) if step_size else lr
            new = [w - rate / update_every * g for w, g in zip(versions[s][-1], sums[s], strict=True)]
            if correction_decay is not None:
                gamma = correction_decay
                deltas[s].append([gamma * d + (1 - gamma) * (n - w) for d, n, w in
                                  zip(deltas[s][-1], new, versions[s][-1], strict=True)])
            versions[s].append(new)
    return [w for s in range(len(stages)) for w in versions[s][-1]]
