"""Weight versions of one stage under each schedule's policy, gradient accumulation and the SGD step."""

from __future__ import annotations

import torch
from torch import nn

from pipesim.harness.config import TrainingOptions
from pipesim.schedule.ir import WeightPolicy

# A memory change: (category name, delta bytes, delta count), stamped by the runtime with a time.
MemoryDelta = tuple[str, float, int]


def slots_of(layers: list[nn.Module]) -> list[tuple[nn.Module, str]]:
    """Every parameter of ``layers`` as (owning module, attribute name), in a fixed order."""
    slots = []
    for layer in layers:
        for module in layer.modules():
            for name, parameter in module.named_parameters(recurse=False):
                if parameter.requires_grad:
                    slots.append((module, name))
    return slots


class WeightStore:
    """The weight versions of one stage, its gradient buffer, and the update rule of its policy.

    A version is a list of tensors, one per slot, tagged with the number of updates that made it.
    FLUSH and SINGLE keep one version; STASH and DOUBLE_BUFFER keep old versions while an op
    still needs them:
    STASH keeps a version while a forward that used it awaits its backward; DOUBLE_BUFFER keeps
    version v while minibatch ``v + 1`` (and, for v = 0, minibatch 0) has ops left on the stage.
    """

    def __init__(self, layers: list[nn.Module], policy: WeightPolicy, options: TrainingOptions, *,
                 stage_delay: int = 1, num_microbatches: int = 1, num_minibatches: int = 1) -> None:
        self.slots = slots_of(layers)
        self.policy = policy
        self.options = options
        self.stage_delay = stage_delay
        self.num_microbatches = num_microbatches
        self.num_minibatches = num_minibatches
        first = [module._parameters[name] for module, name in self.slots]
        self.versions: dict[int, list[torch.Tensor]] = {0: [p for p in first if p is not None]}
        self.current = 0
        self.loaded = 0
        with torch.no_grad():
            self.grads = [torch.zeros_like(p) for p in self.versions[0]]
            self.delta = ([torch.zeros_like(p) for p in self.versions[0]]
                          if policy is WeightPolicy.SINGLE and options.pipemare_correction else [])
        self.param_bytes = float(sum(p.numel() * p.element_size() for p in self.versions[0]))
        self.pending = 0
        self.keeps_versions = policy in (WeightPolicy.STASH, WeightPolicy.DOUBLE_BUFFER)
        self.users: dict[int, int] = {0: self._initial_users(0)}
        self._pool: list[list[torch.Tensor]] = []
        self._slot_of_storage: dict[int, int] = {}
        self._index(self.versions[0])

    # -- which version an op uses -------------------------------------------------------------

    def forward_version(self, minibatch: int) -> int:
        """The version a forward of ``minibatch`` runs on.

        Raises:
            RuntimeError: DOUBLE_BUFFER needs a version this stage has not made (or already dropped).
        """
        if self.policy is WeightPolicy.DOUBLE_BUFFER:
            wanted = max(0, minibatch - 1)
            if wanted not in self.versions:
                raise RuntimeError(f"minibatch {minibatch} needs weight version {wanted}, but the stage "
                                   f"holds {sorted(self.versions)}")
            return wanted
        return self.current

    def tensors(self, version: int) -> list[torch.Tensor]:
        """The tensors of a live version."""
        return self.versions[version]

    def load(self, version: int) -> None:
        """Point the stage's modules at ``version``'s tensors (a no-op when already loaded)."""
        if self.loaded == version:
            return
        for (module, name), tensor in zip(self.slots, self.versions[version], strict=True):
            module._parameters[name] = tensor  # type: ignore[assignment]
        self.loaded = version

    def slot_of(self, tensor: torch.Tensor) -> int:
        """Slot index of a tensor sharing a live version's storage, or -1 for an activation."""
        return self._slot_of_storage.get(tensor.untyped_storage().data_ptr(), -1)

    def backward_tensors(self, forward_version: int) -> list[torch.Tensor]:
        """SINGLE: the weights a backward runs on: current ones, or PipeMare's corrected estimate of
        the forward's weights ``w - D * delta`` with D = updates since the forward."""
        discrepancy = self.current - forward_version
        if not self.delta or discrepancy == 0:
            return self.versions[self.current]
        with torch.no_grad():
            return [torch.add(w, d, alpha=-float(discrepancy))
                    for w, d in zip(self.versions[self.current], self.delta, strict=True)]

    # -- gradients and updates ------------------------------------------------------------------

    def accumulate(self, grads: list[torch.Tensor | None]) -> None:
        """Add one microbatch's weight gradients into the stage's buffer."""
        with torch.no_grad():
            for buffer, grad in zip(self.grads, grads, strict=True):
                if grad is not None:
                    buffer.add_(grad)
        self.pending += 1

    def update(self, update_index: int, *, arithmetic: bool = True) -> list[MemoryDelta]:
        """Apply the SGD step to the mean of the pending gradients; return the memory changes.

        Without ``arithmetic`` (an emulated device) the new version takes its buffer and its
        number as always, but its values are not computed.

        Every policy writes the new weights into a second buffer (recycled from a dropped
        version), so that an update costs the same whatever the schedule and the profile's
        update time holds for all of them. FLUSH and SINGLE drop the old buffer at once (one
        version, for the memory accounting too); STASH and DOUBLE_BUFFER keep it while needed.
        """
        count = max(1, self.pending)
        step = self.options.step_size(update_index, self.stage_delay) / count
        old = self.current
        old_tensors = self.versions[old]
        recycled = self._pool.pop() if self._pool else [torch.empty_like(w) for w in old_tensors]
        with torch.no_grad():
            new_tensors: list[torch.Tensor] = []
            for weight, grad, out in zip(old_tensors, self.grads, recycled, strict=True):
                if arithmetic:
                    torch.add(weight, grad, alpha=-step, out=out)
                new_tensors.append(nn.Parameter(out))
            if not arithmetic:
                self.pending = 0
                return self._switch(old, new_tensors)
            decay = self.options.pipemare_correction_decay
            for delta, grad in zip(self.delta, self.grads, strict=bool(self.delta)):
                delta.mul_(decay).add_(grad, alpha=-(1.0 - decay) * step)
            for grad in self.grads:
                grad.zero_()
        self.pending = 0
        return self._switch(old, new_tensors)

    def _switch(self, old: int, new_tensors: list[torch.Tensor]) -> list[MemoryDelta]:
        """Make ``new_tensors`` the version after ``old``; drop or keep ``old`` by the policy."""
        self.current = old + 1
        self.versions[self.current] = new_tensors
        self._index(new_tensors)
        self.users[self.current] = self._initial_users(self.current)
        if self.loaded == old:
            self.loaded = -1
            self.load(self.current)
        if not self.keeps_versions:
            self._drop(old)
            return []
        return [("weights", self.param_bytes, 1), *self._release_if_unused(old)]

    # -- keeping and dropping versions ----------------------------------------------------------

    def _initial_users(self, version: int) -> int:
        """DOUBLE_BUFFER: ops (F and B) of the minibatches that will run on ``version``."""
        if self.policy is not WeightPolicy.DOUBLE_BUFFER:
            return 0
        minibatches = [t for t in range(self.num_minibatches) if max(0, t - 1) == version]
        return 2 * self.num_microbatches * len(minibatches)

    def acquire(self, version: int) -> None:
        """STASH: a forward now holds ``version`` until its backward."""
        if self.policy is WeightPolicy.STASH:
            self.users[version] = self.users.get(version, 0) + 1

    def finished(self, version: int, is_backward: bool) -> list[MemoryDelta]:
        """An op that ran on ``version`` ended; drop the version if nothing needs it any more."""
        if self.policy is WeightPolicy.STASH and is_backward:
            self.users[version] -= 1
        elif self.policy is WeightPolicy.DOUBLE_BUFFER:
            self.users[version] -= 1
        else:
            return []
        return self._release_if_unused(version)

    def _release_if_unused(self, version: int) -> list[MemoryDelta]:
        if not self.keeps_versions:
            return []
        if version == self.current or self.users.get(version, 0) > 0 or version not in self.versions:
            return []
        self._drop(version)
        return [("weights", -self.param_bytes, -1)]

    def _drop(self, version: int) -> None:
        """Forget a version; its buffers wait in the pool for the next update."""
        tensors = self.versions.pop(version)
        self.users.pop(version, None)
        for tensor in tensors:
            self._slot_of_storage.pop(tensor.untyped_storage().data_ptr(), None)
        self._pool.append([t.detach() for t in tensors])

    def _index(self, tensors: list[torch.Tensor]) -> None:
        for slot, tensor in enumerate(tensors):
            self._slot_of_storage[tensor.untyped_storage().data_ptr()] = slot
