"""One rank of a pipelined run: interpret its ops from the Schedule IR, with real transfers, and record them.

The rank's op list is the only description of the schedule. F: receive the activation (stage > 0),
forward, send it on (stage < p-1). B: receive the gradient (stage < p-1), backward, send the input
gradient back (stage > 0). A split backward's I does B's receive and send with the input gradient
alone, and its W the weight gradients. U: the optimizer step under the schedule's weight policy.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pipesim.errors import ConfigError
from pipesim.harness.config import RunConfig
from pipesim.harness.rank.emulated import EmulatedStage, SendCost, wait_until
from pipesim.harness.rank.models import build_model
from pipesim.harness.rank.p2p import Incoming, Links
from pipesim.harness.rank.process import configure_process, without_gc
from pipesim.harness.rank.rendezvous import join_process_group
from pipesim.harness.recorder import (
    COMPUTING,
    FAILED,
    FINISHED,
    NUM_ARRIVALS,
    NUM_COMPUTE,
    NUM_MEMORY,
    NUM_SENDS,
    WAITING,
    Recorder,
    merge,
    message_tag,
    trace_meta,
)
from pipesim.harness.rank.stage import OpResult, StageExecutor
from pipesim.schedule.deps import gradient_kind, sends_to
from pipesim.schedule.ir import Op, OpKind, Schedule
from pipesim.schedule.versions import assign_versions
from pipesim.spec.files import write_text_atomic


def forward_delays(schedule: Schedule) -> list[int]:
    """Per stage, the most updates between a forward and the update that consumes its gradient (>= 1)."""
    plan = assign_versions(schedule)
    delays = [1] * schedule.num_stages
    for (stage, microbatch), update in plan.consumed_by.items():
        forward = plan.version_of.get(Op(stage, OpKind.F, microbatch))
        if forward is not None:
            delays[stage] = max(delays[stage], plan.version_of[update] - forward)
    return delays


@dataclass
class _Last:
    """What the previous op left: its end, the thread's CPU clock then, and its minibatch."""

    end: float
    cpu: float
    minibatch: int = 0


@dataclass
class RankState:
    """Where a rank is, for the error report."""

    position: int = -1
    op: str = ""


class Clock:
    """Op timing: ``perf_counter`` on CPU (CLOCK_MONOTONIC, shared by the processes of one machine);
    CUDA events on GPU, read back against a base event whose host time is known.

    CUDA marks are resolved only by ``seconds``; the runtime defers that to the end of the run so
    that timing never makes the host wait for the device.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.base: Any = None
        self.base_host = 0.0

    def now(self) -> float:
        """Host seconds, for progress and arrivals."""
        return time.perf_counter()

    def start(self) -> float:
        """Set the base of CUDA marks; return the host time."""
        if self.cuda:
            torch.cuda.synchronize()
            self.base = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            self.base.record()
            self.base.synchronize()
        self.base_host = time.perf_counter()
        return self.base_host

    def mark(self) -> Any:
        """A point in time: seconds on CPU, a recorded CUDA event on GPU."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record()
            return event
        return time.perf_counter()

    def seconds(self, mark: Any) -> float:
        """Host seconds of a mark."""
        if self.cuda:
            mark.synchronize()
            return self.base_host + float(self.base.elapsed_time(mark)) / 1e3
        return float(mark)


class RankRuntime:
    """One rank: its stages' executors, links and recorder."""

    def __init__(self, config: RunConfig, rank: int, world_size: int, run_dir: Path) -> None:
        self.config = config
        self.rank = rank
        self.schedule = config.build_schedule()
        if self.schedule.num_ranks != world_size:
            raise ConfigError("ranks", world_size, f"the schedule needs {self.schedule.num_ranks} ranks")
        self.ops = self.schedule.ranks[rank]
        self.device = (torch.device("cuda", rank % max(1, torch.cuda.device_count())) if config.device == "cuda"
                       else torch.device("cpu"))
        # An emulated op is a wait on the host's clock, so its span is timed there even on a GPU.
        self.clock = Clock(self.device if config.emulation is None else torch.device("cpu"))
        self.bundle = build_model(config.model, config.microbatch_size)
        self.grad_kind = gradient_kind(self.schedule)
        self.durations_s = self._emulated_durations()
        self.send_cost = SendCost()
        self.device_free = 0.0  # emulated: when the device finishes its last op (host seconds)
        self.executors = self._executors()
        self.recorder = Recorder(run_dir / f"rank{rank}.npy", len(self.ops), rank, os.getpid(), self.clock.now())
        self.state = RankState()
        self.data = self._data()
        self._deferred: list[tuple[int, int, int, Any, Any]] = []

    def _emulated_durations(self) -> tuple[float, ...]:
        """This rank's op durations under ``--compute emulated`` (empty when the layers compute)."""
        emulation = self.config.emulation
        if emulation is None:
            return ()
        if len(emulation.durations_s) != self.schedule.num_ranks or len(
                emulation.durations_s[self.rank]) != len(self.ops):
            raise ConfigError("durations_s", [len(d) for d in emulation.durations_s],
                              f"must give every op of every rank ({[len(ops) for ops in self.schedule.ranks]})")
        if len(emulation.stash_bytes) != self.schedule.num_stages:
            raise ConfigError("stash_bytes", list(emulation.stash_bytes),
                              f"must give one size per stage ({self.schedule.num_stages})")
        return emulation.durations_s[self.rank]

    def _executors(self) -> dict[int, StageExecutor]:
        """The rank's stages: computing ones, or emulated ones that wait out their durations."""
        config, schedule = self.config, self.schedule
        delays = forward_delays(schedule)
        executors: dict[int, StageExecutor] = {}
        for stage in sorted({op.stage for op in self.ops}):
            start, end = config.partition[stage]
            for layer in self.bundle.layers[start:end]:
                layer.to(self.device)
            common = {"stage_delay": delays[stage], "num_microbatches": schedule.num_microbatches,
                      "num_minibatches": schedule.num_minibatches}
            if config.emulation is None:
                executors[stage] = StageExecutor(self.bundle, start, end, schedule.weights, config.training,
                                                 split_backward=schedule.has_split_backward, **common)
            else:
                executors[stage] = EmulatedStage(
                    self.bundle, start, end, schedule.weights, config.training,
                    stash_bytes=config.emulation.stash_bytes[stage],
                    weight_stash_bytes=config.emulation.kept_by_weight_gradient(stage),
                    microbatch_size=config.microbatch_size,
                    device=self.device, **common)
        return executors

    def resolve_marks(self) -> None:
        """Write the compute spans whose marks are pending (every op on CPU; at the end on CUDA)."""
        for position, version, minibatch, start, finish in self._deferred:
            self.recorder.compute(position, version, minibatch, self.clock.seconds(start), self.clock.seconds(finish))
        self._deferred.clear()

    def _boundary_shape(self, stage: int) -> tuple[int, ...]:
        """Shape of the activation stage ``stage`` sends downstream (and of the gradient coming back)."""
        end = self.config.partition[stage][1]
        return (self.config.microbatch_size, *self.bundle.output_shapes[end - 1])

    def _data(self) -> dict[int, tuple[torch.Tensor | None, torch.Tensor | None]]:
        """Inputs of stage 0 and targets of the loss stage, made before timing starts."""
        data: dict[int, tuple[torch.Tensor | None, torch.Tensor | None]] = {}
        first, last = 0 in self.executors, (self.schedule.num_stages - 1) in self.executors
        if not (first or last):
            return data
        for microbatch in range(self.schedule.total_microbatches):
            inputs, target = self.bundle.microbatch(microbatch, self.config.microbatch_size)
            data[microbatch] = (inputs.to(self.device) if first else None, target.to(self.device) if last else None)
        return data

    def _incoming(self) -> list[Incoming]:
        """Every message the rank's ops need, in op order."""
        messages = []
        for position, op in enumerate(self.ops):
            message = self._incoming_message(op)
            if message is not None:
                shape = self._boundary_shape(op.stage - 1 if op.kind is OpKind.F else op.stage)
                messages.append(Incoming(position, *message, shape))
        return messages

    def _warm_up(self) -> None:
        for stage, executor in self.executors.items():
            start = self.config.partition[stage][0]
            shape = (self.config.microbatch_size,
                     *(self.bundle.input_shape if start == 0 else self.bundle.output_shapes[start - 1]))
            target = torch.zeros((self.config.microbatch_size, *self.bundle.target_shape), device=self.device)
            executor.warm_up(torch.zeros(shape, device=self.device), target if executor.has_loss else None)

    def _agree_on_origin(self) -> float:
        """A common time origin: rank 0's clock after a barrier when all ranks share one host."""
        dist.barrier()
        mine = (socket.gethostname(), self.clock.start())
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        same_host = all(host == everyone[0][0] for host, _ in everyone)
        return float(everyone[0][1]) if same_host else float(mine[1])

    def run(self) -> None:
        """Interpret the rank's ops in order, recording every span, send, arrival and memory event."""
        self._warm_up()
        links = Links(self.rank, self._incoming(), self.bundle.dtype, self.device,
                      window=2 * (self.schedule.num_microbatches + self.schedule.num_stages), now=self.clock.now)
        origin = self._agree_on_origin()
        self.recorder.set_origin(origin)
        for stage, executor in self.executors.items():
            for category, size in (("weights", executor.store.param_bytes), ("gradients", executor.store.param_bytes),
                                   ("optimizer", 0.0)):
                self.recorder.memory(origin, stage, category, size, 1)
        last = _Last(end=self.clock.now(), cpu=time.thread_time())
        self.device_free = last.end
        with without_gc():
            for position, op in enumerate(self.ops):
                self._run_op(position, op, links, last)
        links.finish()
        self.resolve_marks()
        self.recorder.progress(len(self.ops), FINISHED, self.clock.now())
        self.recorder.flush()

    def _run_op(self, position: int, op: Op, links: Links, last: _Last) -> None:
        """One op: its input, its compute, its output, its records.

        An op's span runs from when it can start (its input in hand) to when its output is handed
        to the link: the receive of an input that had already arrived, the send and the
        bookkeeping are the op's work, as the profile's per-op overheads count them; only waiting
        for an input that has not arrived is idle time (a receive whose wait blocked: gloo cannot
        say sooner that a message is in hand, see ``Links.receive``). The emulated device starts
        an op fed by another rank no earlier than the host holds its input, blocked or not.
        """
        self.state.position, self.state.op = position, str(op)
        op_start = last.end
        device_start = self.device_free
        self.recorder.progress(position, WAITING, self.clock.now())
        received = None
        incoming = self._incoming_message(op)
        if incoming is not None:
            source, tag = incoming
            was_ready = links.ready(source, tag)
            received, arrived, blocked = links.receive(source, tag)
            self.recorder.arrival(source, tag, arrived)
            if not was_ready:
                device_start = max(device_start, arrived)
            if blocked:
                op_start = arrived
        self.recorder.progress(position, COMPUTING, op_start)
        minibatch = last.minibatch if op.kind is OpKind.U else self.schedule.minibatch_of(op.microbatch)
        start = self.clock.mark()
        result = self._execute(op, self.executors[op.stage], minibatch, received)
        target_stage = sends_to(op, self.schedule.num_stages, self.grad_kind)
        if self.durations_s:
            sending_s = self.send_cost.typical_s if target_stage is not None and result.send is not None else 0.0
            # The emulated device runs its ops back to back from when it is free, as a GPU runs its
            # queue: a host that woke late for one op does not delay the ops after it.
            self.device_free = device_start + self.durations_s[position]
            wait_until(self.device_free - sending_s)
        finish = self.clock.mark()
        if target_stage is not None and result.send is not None:
            target = self.schedule.stage_to_rank[target_stage]
            tag = message_tag(op.kind, op.stage, op.microbatch, self.schedule.num_stages)
            handed = self.clock.now()
            links.send(result.send, target, tag)
            self.send_cost.add(self.clock.now() - handed)
            num_bytes = float(result.send.numel() * result.send.element_size())
            self.recorder.send(position, self.clock.now(), num_bytes, target, tag)
        end = self.clock.now()
        for category, delta_bytes, delta_count in result.memory:
            self.recorder.memory(end, op.stage, category, delta_bytes, delta_count)
        if self.clock.cuda:
            self._deferred.append((position, result.version, minibatch, start, finish))
        else:
            cpu_now = time.thread_time()
            self.recorder.compute(position, result.version, minibatch, op_start, end, cpu_now - last.cpu,
                                  receive_s=start - op_start, send_s=end - finish)
            self.recorder.cpu_time(cpu_now - last.cpu, end - op_start)
            last.cpu = cpu_now
        last.minibatch, last.end = minibatch, end

    def _incoming_message(self, op: Op) -> tuple[int, int] | None:
        """(source rank, tag) of the message ``op`` needs, or None."""
        p = self.schedule.num_stages
        if op.kind is OpKind.F and op.stage > 0:
            return self.schedule.stage_to_rank[op.stage - 1], message_tag(OpKind.F, op.stage - 1, op.microbatch, p)
        if op.kind in (OpKind.B, OpKind.I) and op.stage < p - 1:
            source = self.schedule.stage_to_rank[op.stage + 1]
            return source, message_tag(self.grad_kind, op.stage + 1, op.microbatch, p)
        return None

    def _execute(self, op: Op, executor: StageExecutor, minibatch: int, received: torch.Tensor | None) -> OpResult:
        if op.kind is OpKind.F:
            inputs, target = self.data.get(op.microbatch, (None, None))
            x = received if received is not None else inputs
            assert x is not None, f"{op} has no input"
            return executor.forward(op.microbatch, minibatch, x, target)
        if op.kind is OpKind.B:
            return executor.backward(op.microbatch, received)
        if op.kind is OpKind.I:
            return executor.backward_input(op.microbatch, received)
        if op.kind is OpKind.W:
            return executor.backward_weight(op.microbatch)
        return executor.update(op.microbatch)

    def fail(self, run_dir: Path, error: BaseException) -> None:
        """Record the failure: progress marked failed and a one-line error file for the launcher."""
        try:
            self.resolve_marks()
        except Exception:  # a broken device: the spans recorded so far are all there is
            self._deferred.clear()
        self.recorder.progress(max(0, self.state.position), FAILED, self.clock.now())
        self.recorder.flush()
        write_error(run_dir, self.rank, self.state.op, error)

    def finish(self) -> None:
        """Gather every rank's records on rank 0, which writes the trace; save weights if asked."""
        sizes = {stage: (e.store.param_bytes, e.stash_bytes_seen) for stage, e in self.executors.items()}
        blocks = {name: self.recorder.blocks[name].copy() for name in ("header", "compute", "sends", "arrivals",
                                                                       "memory")}
        header = blocks["header"]
        for name, counter in (("compute", NUM_COMPUTE), ("sends", NUM_SENDS), ("arrivals", NUM_ARRIVALS),
                              ("memory", NUM_MEMORY)):
            blocks[name] = blocks[name][: int(header[counter])]
        cuda_peak = float(torch.cuda.max_memory_allocated(self.device)) if self.clock.cuda else None
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, (blocks, sizes, cuda_peak))
        if self.config.weights_out:
            folder = Path(self.config.weights_out)
            folder.mkdir(parents=True, exist_ok=True)
            for stage, executor in self.executors.items():
                tensors = [t.detach().cpu() for t in executor.store.tensors(executor.store.current)]
                partial = folder / f".stage{stage}.pt.{os.getpid()}.tmp"
                torch.save(tensors, partial)
                os.replace(partial, folder / f"stage{stage}.pt")
        if self.rank == 0 and self.config.trace_out:
            stage_sizes: dict[int, tuple[float, float]] = {}
            for _, rank_sizes, _ in gathered:
                stage_sizes.update(rank_sizes)
            info = trace_meta(self.config, self.schedule,
                              [stage_sizes[s][0] for s in range(self.schedule.num_stages)],
                              [stage_sizes[s][1] for s in range(self.schedule.num_stages)])
            if cuda_peak is not None:
                info = replace(info, cuda_max_memory_allocated_bytes=tuple(peak for _, _, peak in gathered))
            trace = merge(self.schedule, [b for b, _, _ in gathered], info)
            write_text_atomic(self.config.trace_out, trace.to_json())


def write_error(run_dir: Path, rank: int, op: str, error: BaseException) -> None:
    """A one-line account of a rank's failure, for the launcher."""
    message = f"{type(error).__name__}: {error}".splitlines()[0] if str(error) else type(error).__name__
    write_text_atomic(run_dir / f"error{rank}.json", json.dumps({"rank": rank, "op": op, "message": message}) + "\n")


def init_process_group(config: RunConfig, rank: int, world_size: int) -> None:
    """Join the process group named by MASTER_ADDR/MASTER_PORT (as torchrun sets them; ``rendezvous``)."""
    configure_process(config.threads, config.emulation.realtime_priority if config.emulation else 0)
    if config.device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    join_process_group(config.backend, rank, world_size, timedelta(seconds=config.comm_timeout_s))
