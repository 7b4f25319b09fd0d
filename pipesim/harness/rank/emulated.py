"""A stage on a device of steady speed: ops keep their real bookkeeping and wait out given durations.

``--compute emulated`` isolates what pipesim models beyond op durations (order, dependency waits,
communication and its overlap, the runtime's own costs) from how long a layer's arithmetic takes,
which on a shared CPU drifts from second to second. As a GPU looks from the host, an op is
dispatched and takes a stable time; here the rank waits on a monotonic clock until the op's
deadline. The device runs its ops back to back: an op's deadline is its duration after the
later of the device's previous deadline and the arrival of its input, so a host that wakes late
for one op does not push back the ops after it (the runtime keeps that clock). Everything else stays real: tensors of the model's sizes go over the process group,
weight versions, their buffers and the stashes are kept by the real WeightStore (an update makes
its new version in a new buffer, without the arithmetic), and every forward holds a real buffer
of its stage's stash size until its backward.

An op's duration, as the profile measures it, includes the runtime's own cost of handing the
output to the link (the isend); so an op that sends waits until its deadline less the isend
time this rank has measured so far (the median of its last sends), and the send then ends near the deadline.
"""

from __future__ import annotations

import statistics
import time
from collections import deque

import torch

from pipesim.harness.config import TrainingOptions
from pipesim.harness.rank.models import ModelBundle
from pipesim.harness.rank.stage import OpResult, StageExecutor
from pipesim.schedule.ir import WeightPolicy

# The last stretch before a deadline is spun, not slept: a sleep may overshoot by a scheduler tick.
SPIN_S = 0.0002


class SendCost:
    """The median of this rank's last isend calls, seconds (a median: one send that blocked
    behind a busy peer must not shorten the ops after it)."""

    WINDOW = 16

    def __init__(self) -> None:
        self.recent: deque[float] = deque(maxlen=self.WINDOW)

    @property
    def typical_s(self) -> float:
        """The median of the recent sends (0 before the first)."""
        return statistics.median(self.recent) if self.recent else 0.0

    def add(self, seconds: float) -> None:
        """Count one isend call of ``seconds``."""
        self.recent.append(seconds)


def wait_until(deadline: float) -> None:
    """Return at ``deadline`` (``time.perf_counter`` seconds): sleep most of the way, then spin."""
    left = deadline - time.perf_counter()
    if left > SPIN_S:
        time.sleep(left - SPIN_S)
    while time.perf_counter() < deadline:
        pass


class EmulatedStage(StageExecutor):
    """A stage whose F and B do the runtime's bookkeeping without the layers' arithmetic.

    Args:
        bundle, start, end, policy, options: as for StageExecutor (the weights are real).
        stash_bytes: bytes a forward keeps until its backward (from the profile).
        weight_stash_bytes: of those, the bytes a split backward's W still needs after its I.
        microbatch_size: samples per microbatch (sizes the tensors sent).
        device: where the tensors live.
        num_microbatches, num_minibatches, stage_delay: as for StageExecutor.
    """

    def __init__(self, bundle: ModelBundle, start: int, end: int, policy: WeightPolicy, options: TrainingOptions,
                 *, stash_bytes: float, weight_stash_bytes: float, microbatch_size: int, device: torch.device,
                 stage_delay: int = 1,
                 num_microbatches: int = 1, num_minibatches: int = 1) -> None:
        super().__init__(bundle, start, end, policy, options, stage_delay=stage_delay,
                         num_microbatches=num_microbatches, num_minibatches=num_minibatches)
        self.stash_bytes = float(stash_bytes)
        self.weight_stash_bytes = float(weight_stash_bytes)
        self.device = device
        in_shape = bundle.input_shape if start == 0 else bundle.output_shapes[start - 1]
        self.output = None if self.has_loss else torch.zeros(
            (microbatch_size, *bundle.output_shapes[end - 1]), dtype=bundle.dtype, device=device)
        self.input_grad = torch.zeros((microbatch_size, *in_shape), dtype=bundle.dtype,
                                      device=device) if self.takes_gradient_input else None
        self.held: dict[int, tuple[int, torch.Tensor]] = {}

    def forward(self, microbatch: int, minibatch: int, inputs: torch.Tensor,
                target: torch.Tensor | None = None) -> OpResult:
        """F: take the policy's version, hold a stash of the profiled size, hand on an output of the real shape."""
        version = self.store.forward_version(minibatch)
        self.store.load(version)
        self.held[microbatch] = (version, torch.empty(int(self.stash_bytes), dtype=torch.uint8, device=self.device))
        self.store.acquire(version)
        self.stash_bytes_seen = self.stash_bytes
        memory = [("activations", self.stash_bytes, 1), *self.store.finished(version, is_backward=False)]
        return OpResult(version=version, send=self.output, memory=memory)

    def backward(self, microbatch: int, grad_output: torch.Tensor | None) -> OpResult:
        """B: release the stash, count a gradient towards the next update, hand back an input gradient."""
        forward_version, _ = self.held.pop(microbatch)
        version = self.store.current if self.policy is WeightPolicy.SINGLE else forward_version
        self.store.pending += 1
        memory = [("activations", -self.stash_bytes, -1), *self.store.finished(forward_version, is_backward=True)]
        return OpResult(version=version, send=self.input_grad, memory=memory)

    def backward_input(self, microbatch: int, grad_output: torch.Tensor | None) -> OpResult:
        """I: hand back an input gradient; free the part of the stash W does not need."""
        forward_version, _ = self.held[microbatch]
        version = self.store.current if self.policy is WeightPolicy.SINGLE else forward_version
        freed = self.stash_bytes - self.weight_stash_bytes
        return OpResult(version=version, send=self.input_grad, memory=[("activations", -freed, 0)] if freed else [])

    def backward_weight(self, microbatch: int) -> OpResult:
        """W: count a gradient towards the next update; free what the stash still held."""
        forward_version, _ = self.held.pop(microbatch)
        version = self.store.current if self.policy is WeightPolicy.SINGLE else forward_version
        self.store.pending += 1
        memory = [("activations", -self.weight_stash_bytes, -1),
                  *self.store.finished(forward_version, is_backward=True)]
        return OpResult(version=version, memory=memory)

    def update(self, update_index: int) -> OpResult:
        """U: a new weight version in a new buffer, as a real update makes it, without the arithmetic."""
        version = self.store.current
        return OpResult(version=version, memory=self.store.update(update_index, arithmetic=False))

    def warm_up(self, inputs: torch.Tensor, target: torch.Tensor | None) -> None:
        """Nothing to warm: no layer runs."""
