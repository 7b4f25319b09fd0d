"""Shared NICs for the DES engine: flows that cross the same NIC split its bandwidth max-min fairly."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import simpy

from pipesim.engine.lowering import Program, SharedPath

# A flow with less than this fraction of its bytes left counts as finished (floating-point residue).
_RESIDUE = 1e-9


@dataclass(eq=False)
class _Flow:
    total: float
    remaining: float
    nics: tuple[str, ...]
    done: simpy.Event
    rate: float = 0.0


class Network:
    """A fluid model of NICs shared by concurrent transfers.

    Every active flow gets a rate by progressive filling (max-min fairness): the NIC whose
    fair share (capacity left / flows not yet fixed) is smallest fixes its flows at that
    share, and so on. Rates are recomputed whenever a flow starts or ends, so a flow alone on
    its NICs moves at full bandwidth and two flows on one NIC move at half each.

    Args:
        env: the simulation environment.
        bandwidth_bytes_per_s: capacity of each NIC, bytes per second.
    """

    def __init__(self, env: simpy.Environment, bandwidth_bytes_per_s: dict[str, float]) -> None:
        self.env = env
        self.capacity = dict(bandwidth_bytes_per_s)
        self.flows: list[_Flow] = []
        self._updated_at = 0.0
        self._generation = 0

    def transfer(self, num_bytes: float, latency_s: float, nics: tuple[str, ...]) -> Generator[simpy.Event, Any, None]:
        """A process: wait the latency, then move ``num_bytes`` through ``nics`` at the fair rate."""
        if latency_s > 0:
            yield self.env.timeout(latency_s)
        if num_bytes <= 0:
            return
        flow = _Flow(total=float(num_bytes), remaining=float(num_bytes), nics=nics, done=self.env.event())
        self._advance()
        self.flows.append(flow)
        self._reschedule()
        yield flow.done

    def _advance(self) -> None:
        elapsed = self.env.now - self._updated_at
        if elapsed > 0:
            for flow in self.flows:
                flow.remaining -= flow.rate * elapsed
        self._updated_at = self.env.now

    def _reschedule(self) -> None:
        self._fair_rates()
        self._generation += 1
        if not self.flows:
            return
        wait = min(flow.remaining / flow.rate for flow in self.flows)
        wakeup = self.env.timeout(max(wait, 0.0))
        generation = self._generation
        wakeup.callbacks.append(lambda _event: self._wake(generation))

    def _wake(self, generation: int) -> None:
        if generation != self._generation:
            return
        self._advance()
        finished = [flow for flow in self.flows if flow.remaining <= _RESIDUE * flow.total]
        if not finished:
            # Floating-point: the earliest flow is a hair short; finish it now.
            finished = [min(self.flows, key=lambda flow: flow.remaining / flow.rate)]
        for flow in finished:
            self.flows.remove(flow)
            flow.done.succeed()
        self._reschedule()

    def _fair_rates(self) -> None:
        """Progressive filling: fix the flows of the NIC with the smallest fair share, repeat.

        Per-NIC counts of unfixed flows are kept up to date rather than recounted each round;
        ties go to the first NIC in name order, and each NIC's capacity is reduced flow by
        flow in the order the flows started.
        """
        left = {nic: self.capacity[nic] for flow in self.flows for nic in flow.nics}
        count = dict.fromkeys(left, 0)
        for flow in self.flows:
            for nic in flow.nics:
                count[nic] += 1
        names = sorted(left)
        unfixed = self.flows
        while unfixed:
            best_nic, best_share = "", float("inf")
            for nic in names:
                flows_left = count[nic]
                if flows_left and left[nic] / flows_left < best_share:
                    best_nic, best_share = nic, left[nic] / flows_left
            assert best_nic, "every flow crosses at least one NIC"
            still: list[_Flow] = []
            for flow in unfixed:
                if best_nic in flow.nics:
                    flow.rate = best_share
                    for nic in flow.nics:
                        left[nic] -= best_share
                        count[nic] -= 1
                else:
                    still.append(flow)
            unfixed = still


class SharedLinks:
    """The links of a program whose paths cross shared NICs: one first-in first-out queue each,
    served one send at a time through a ``Network`` that splits NIC bandwidth between flows.
    A send holds its link while its bytes move and arrives the path's latency after that: the
    next send may start meanwhile (latency pipelines, as on a dedicated link).

    ``link`` is the program's per-op link column with those links relabelled ``-2 - index``
    (the timing kernel stops after an op whose send takes one). ``send(g, now)`` queues op
    ``g``'s send at its end; when it arrives, ``arrived(g, start_s, now)`` is called.
    """

    def __init__(self, env: simpy.Environment, program: Program,
                 arrived: Callable[[int, float, float], None]) -> None:
        ops = program.ops
        self.env = env
        self.arrived = arrived
        self.network = Network(env, program.nic_bandwidth_bytes_per_s)
        self.send_bytes: list[float] = ops.send_bytes.tolist()
        self.paths: list[SharedPath] = []
        self.queues: list[deque[tuple[int, float]]] = []
        index_of: dict[tuple[int, int], int] = {}
        link = ops.link.copy()
        for g in np.flatnonzero(link >= 0).tolist():
            pair = (int(ops.rank[g]), int(ops.send_rank[g]))
            path = program.shared_paths.get(pair)
            if path is None:
                continue
            if pair not in index_of:
                index_of[pair] = len(self.paths)
                self.paths.append(path)
                self.queues.append(deque())
            link[g] = -2 - index_of[pair]
        self.link: npt.NDArray[np.int64] = link

    def send(self, g: int, now: float) -> None:
        """Queue op ``g``'s send on its link at ``now``; start it at once if the link is idle."""
        index = -2 - int(self.link[g])
        queue = self.queues[index]
        queue.append((g, now))
        if len(queue) == 1:
            self._begin(index, now)

    def _begin(self, index: int, now: float) -> None:
        g, _ = self.queues[index][0]
        self.queues[index][0] = (g, now)
        path = self.paths[index]
        process = self.env.process(self.network.transfer(self.send_bytes[g], 0.0, path.nics))
        process.callbacks.append(lambda _event: self._moved(index))

    def _moved(self, index: int) -> None:
        """The bytes of the link's head send have left: start the next send, and report this
        one arrived after the path's latency."""
        now = self.env.now
        queue = self.queues[index]
        g, started = queue.popleft()
        latency_s = self.paths[index].latency_s
        if latency_s > 0:
            self.env.timeout(latency_s).callbacks.append(lambda _event: self.arrived(g, started, self.env.now))
        else:
            self.arrived(g, started, now)
        if queue:
            self._begin(index, now)
