"""One pipeline stage's compute: the F, B and U of its layers, as both the profiler and the runtime run them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from pipesim.harness.config import TrainingOptions
from pipesim.harness.rank.models import ModelBundle, MSELossLayer
from pipesim.harness.rank.weights import MemoryDelta, WeightStore, slots_of
from pipesim.schedule.ir import WeightPolicy


class SavedTensors:
    """saved_tensors_hooks of one forward: counts the activation bytes autograd keeps for the backward.

    Each distinct storage counts once; weights are not activations. Under SINGLE weights (PipeMare)
    a saved weight is replaced by a reference to its slot, so that the backward reads whatever
    weights ``backward_weights`` holds when it runs, while activations stay those of the forward.
    An activation is kept detached: an op that saves its own output (ReLU, softmax) would
    otherwise hold its graph node through that output, a cycle that Python's collector cannot see
    into, so a graph kept for a split backward's W would never be freed.
    """

    def __init__(self, store: WeightStore, *, by_reference: bool) -> None:
        self.store = store
        self.by_reference = by_reference
        self.storages: set[int] = set()
        self.bytes = 0.0
        self.backward_weights: list[torch.Tensor] = []

    def pack(self, tensor: torch.Tensor) -> Any:
        """Count an activation; under SINGLE, swap a weight (or a view of one) for its slot."""
        slot = self.store.slot_of(tensor)
        if slot >= 0:
            if self.by_reference:
                return (slot, tuple(tensor.shape), tensor.stride(), tensor.storage_offset())
            return tensor
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if pointer not in self.storages:
            self.storages.add(pointer)
            self.bytes += storage.nbytes()
        return tensor.detach()

    def unpack(self, packed: Any) -> torch.Tensor:
        """The saved tensor, or the backward's weight for a slot reference."""
        if isinstance(packed, torch.Tensor):
            return packed
        slot, shape, stride, offset = packed
        return torch.as_strided(self.backward_weights[slot], shape, stride, offset)


@dataclass
class Stashed:
    """What a forward leaves for its backward."""

    inputs: torch.Tensor
    output: torch.Tensor
    version: int
    weights: list[torch.Tensor]
    saved: SavedTensors
    microbatch: int
    leaf_outputs: dict[int, torch.Tensor] = field(default_factory=dict)
    leaf_grads: dict[int, torch.Tensor | None] = field(default_factory=dict)


@dataclass
class OpResult:
    """What an op produced: the tensor to send (if any), the version used, and memory changes."""

    version: int
    send: torch.Tensor | None = None
    memory: list[MemoryDelta] = field(default_factory=list)


class StageExecutor:
    """Runs F, B and U for one stage made of ``bundle.layers[start:end]``.

    Args:
        bundle: the whole model (every rank builds it identically).
        start, end: the stage's layer range.
        policy: the schedule's weight policy.
        options: learning rate and PipeMare options.
        stage_delay: forward delay of the stage in updates (PipeMare's learning-rate rescheduling).
        num_microbatches, num_minibatches: the run's m and K (double buffering counts users).
    """

    def __init__(self, bundle: ModelBundle, start: int, end: int, policy: WeightPolicy,
                 options: TrainingOptions, *, stage_delay: int = 1, num_microbatches: int = 1,
                 num_minibatches: int = 1, split_backward: bool = False) -> None:
        self.layers = bundle.layers[start:end]
        self.policy = policy
        self.takes_gradient_input = start > 0
        self.loss = self.layers[-1] if isinstance(self.layers[-1], MSELossLayer) else None
        self.store = WeightStore(self.layers, policy, options, stage_delay=stage_delay,
                                 num_microbatches=num_microbatches, num_minibatches=num_minibatches)
        # The modules that own weights, in slot order, and how many slots each owns.
        self.leaves: dict[int, int] = {}
        for module, _ in slots_of(self.layers):
            self.leaves[id(module)] = self.leaves.get(id(module), 0) + 1
        self._weighted = list({id(m): m for m, _ in slots_of(self.layers)}.values())
        self._captured: dict[int, torch.Tensor] = {}
        # A split backward needs each weighted module's output (see backward_input); the forward
        # keeps them while this is true (the profiler times I and W on the executor that times B).
        self.split_backward = split_backward
        self.stash: dict[int, Stashed] = {}
        self.stash_bytes_seen = 0.0

    @property
    def has_loss(self) -> bool:
        """True on the stage that ends with the loss (the last stage)."""
        return self.loss is not None

    def forward(self, microbatch: int, minibatch: int, inputs: torch.Tensor,
                target: torch.Tensor | None = None) -> OpResult:
        """F: run the stage on ``inputs`` with the policy's version; stash what the backward needs.

        Returns:
            the version used, the output to send (None on the loss stage), and the stashed
            activations as a memory change.
        """
        version = self.store.forward_version(minibatch)
        self.store.load(version)
        if self.takes_gradient_input:
            inputs.requires_grad_(True)
        if self.loss is not None:
            self.loss.target = target
        saved = SavedTensors(self.store, by_reference=self.policy is WeightPolicy.SINGLE)
        hooks = [module.register_forward_hook(self._capture) for module in self._weighted] if self.split_backward else []
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            output = inputs
            for layer in self.layers:
                output = layer(output)
        for hook in hooks:
            hook.remove()
        self.stash[microbatch] = Stashed(inputs, output, version, self.store.tensors(version), saved, microbatch,
                                         leaf_outputs=self._captured)
        self._captured = {}
        self.store.acquire(version)
        self.stash_bytes_seen = max(self.stash_bytes_seen, saved.bytes)
        memory = [("activations", saved.bytes, 1), *self.store.finished(version, is_backward=False)]
        send = None if self.loss is not None else output.detach()
        return OpResult(version=version, send=send, memory=memory)

    def backward(self, microbatch: int, grad_output: torch.Tensor | None) -> OpResult:
        """B: backpropagate microbatch's gradient through the stage; accumulate weight gradients.

        Returns:
            the version the backward ran on, the input gradient to send (None on the first
            stage), and the freed activations (and any dropped version) as memory changes.
        """
        stashed = self.stash.pop(microbatch)
        forward_version = stashed.version
        version = self._backward_version(stashed)
        # The gradients are those of the forward's weight tensors (under SINGLE their values may be
        # gone: the saved ones resolve to the backward's weights, see SavedTensors).
        wanted = ([stashed.inputs] if self.takes_gradient_input else []) + list(stashed.weights)
        # A first stage without weights has nothing to backpropagate into.
        grads = torch.autograd.grad(stashed.output, wanted, grad_output, allow_unused=True) if wanted else ()
        offset = 1 if self.takes_gradient_input else 0
        self.store.accumulate(list(grads[offset:]))
        send = grads[0] if self.takes_gradient_input else None
        memory = [("activations", -stashed.saved.bytes, -1),
                  *self.store.finished(forward_version, is_backward=True)]
        return OpResult(version=version, send=send, memory=memory)

    def _backward_version(self, stashed: Stashed) -> int:
        """The version a backward of ``stashed`` runs on (under SINGLE, the current one, whose
        weights the saved references then resolve to)."""
        if self.policy is not WeightPolicy.SINGLE:
            return stashed.version
        stashed.saved.backward_weights = self.store.backward_tensors(stashed.version)
        return self.store.current

    def _capture(self, module: nn.Module, args: Any, output: Any) -> None:
        """Forward hook: keep a weighted module's output for the split backward."""
        if isinstance(output, torch.Tensor):
            self._captured[id(module)] = output

    def backward_input(self, microbatch: int, grad_output: torch.Tensor | None) -> OpResult:
        """I: the gradient of the stage's input, to send upstream, and of every weighted module's
        output, kept for W; the graph is kept too. Like a full backward without the weight gradients.

        Autograd keeps every saved tensor until W, so I frees no tracked memory.
        """
        stashed = self.stash[microbatch]
        version = self._backward_version(stashed)
        leaves = [(key, out) for key, out in stashed.leaf_outputs.items() if out.requires_grad]
        wanted = ([stashed.inputs] if self.takes_gradient_input else []) + [out for _, out in leaves]
        grads = list(torch.autograd.grad(stashed.output, wanted, grad_output, retain_graph=True,
                                         allow_unused=True)) if wanted else []
        send = grads.pop(0) if self.takes_gradient_input else None
        stashed.leaf_grads = {key: grad for (key, _), grad in zip(leaves, grads, strict=True)}
        return OpResult(version=version, send=send)

    def backward_weight(self, microbatch: int) -> OpResult:
        """W: each weighted module's weight gradients from its own output's gradient (kept by I), so
        that W does only the weight part of the backward; accumulated; frees the microbatch's stash."""
        stashed = self.stash.pop(microbatch)
        version = self._backward_version(stashed)
        grads: list[torch.Tensor | None] = []
        first = 0
        for key, count in self.leaves.items():
            weights = stashed.weights[first:first + count]
            first += count
            out, grad = stashed.leaf_outputs.get(key), stashed.leaf_grads.get(key)
            if out is None or grad is None:
                grads += [None] * count
            else:
                grads += torch.autograd.grad(out, weights, grad, retain_graph=True, allow_unused=True)
        self.store.accumulate(grads)
        memory = [("activations", -stashed.saved.bytes, -1),
                  *self.store.finished(stashed.version, is_backward=True)]
        return OpResult(version=version, send=None, memory=memory)

    def update(self, update_index: int) -> OpResult:
        """U: the optimizer step; returns the version it updated and any version added or dropped."""
        version = self.store.current
        memory = self.store.update(update_index)
        return OpResult(version=version, memory=memory)

    def warm_up(self, inputs: torch.Tensor, target: torch.Tensor | None) -> None:
        """One untimed forward and backward (no update) so that first-touch costs are paid before timing:
        a split backward's I and W where the schedule splits it (their first W, on the loss stage,
        took a tenth of a second more than the next), else the whole B."""
        probe = inputs.detach().clone()
        users = dict(self.store.users)
        result = self.forward(-1, 0, probe, target)
        grad = None if result.send is None else torch.ones_like(result.send)
        if self.split_backward:
            self.backward_input(-1, grad)
            self.backward_weight(-1)
        else:
            self.backward(-1, grad)
        with torch.no_grad():
            for buffer in self.store.grads:
                buffer.zero_()
        self.store.pending = 0
        self.store.users = users
