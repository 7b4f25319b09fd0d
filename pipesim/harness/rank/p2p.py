"""Point-to-point transfers of one rank: receives posted ahead of need, sends that never block compute."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


# A wait on a gloo receive whose message is already in its buffer returns within this: on the
# reference 2-core host such waits took 4-23 us, waits that blocked for their message 42 us or more.
HELD_S = 30e-6


@dataclass(frozen=True)
class Incoming:
    """A message an op of this rank needs: from ``source`` with ``tag``, of ``shape``."""

    position: int
    source: int
    tag: int
    shape: tuple[int, ...]


class Links:
    """The rank's side of every link it uses.

    Receives are posted ``window`` messages ahead, in the order the rank's ops need them, so a
    message travels while the rank computes (gloo and NCCL only move data once the receive is
    posted). Sends are ``isend``s whose handles are kept until they complete. Messages between
    stages on the same rank skip the process group.

    Args:
        rank: this rank.
        incoming: the messages this rank's ops need, in op order.
        dtype, device: of the buffers.
        window: receives kept posted ahead.
        now: the clock that stamps arrivals.
    """

    def __init__(self, rank: int, incoming: list[Incoming], dtype: torch.dtype, device: torch.device,
                 window: int, now: Callable[[], float]) -> None:
        self.rank = rank
        self.incoming = [message for message in incoming if message.source != rank]
        self.dtype = dtype
        self.device = device
        self.window = max(1, window)
        self.now = now
        self.posted: dict[tuple[int, int], tuple[Any, torch.Tensor]] = {}
        self.next_index = 0
        self.local: dict[int, torch.Tensor] = {}
        self.sending: deque[tuple[Any, torch.Tensor]] = deque()
        self._post_ahead()

    def _post_ahead(self) -> None:
        while self.next_index < len(self.incoming) and len(self.posted) < self.window:
            message = self.incoming[self.next_index]
            buffer = torch.empty(message.shape, dtype=self.dtype, device=self.device)
            work = dist.irecv(buffer, src=message.source, tag=message.tag)
            self.posted[(message.source, message.tag)] = (work, buffer)
            self.next_index += 1

    def ready(self, source: int, tag: int) -> bool:
        """True when message ``tag`` from ``source`` is already in hand (receiving it will not wait)."""
        if source == self.rank:
            return tag in self.local
        posted = self.posted.get((source, tag))
        return posted is not None and bool(posted[0].is_completed())

    def receive(self, source: int, tag: int) -> tuple[torch.Tensor, float, bool]:
        """Wait for message ``tag`` from ``source``; return it, when it was in hand, and whether the
        wait blocked (the message had not arrived when the rank asked for it).

        gloo's receive reports itself complete only once it is waited on, so whether a message
        was already there shows in how long the wait took: a wait that returns within
        ``HELD_S`` found it there.
        """
        if source == self.rank:
            return self.local.pop(tag), self.now(), False
        work, buffer = self.posted.pop((source, tag))
        asked = self.now()
        work.wait()
        arrived = self.now()
        self._post_ahead()
        return buffer, arrived, arrived - asked >= HELD_S

    def send(self, tensor: torch.Tensor, target: int, tag: int) -> None:
        """Start sending ``tensor`` to ``target``; return at once."""
        if target == self.rank:
            self.local[tag] = tensor.detach().clone()
            return
        payload = tensor.detach().contiguous()
        self.sending.append((dist.isend(payload, dst=target, tag=tag), payload))
        while self.sending and self.sending[0][0].is_completed():
            self.sending.popleft()[0].wait()

    def finish(self) -> None:
        """Wait until every send has completed."""
        while self.sending:
            self.sending.popleft()[0].wait()
