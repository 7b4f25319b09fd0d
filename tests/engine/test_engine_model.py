"""The DES engine stepped beside a reference list scheduler: they agree after every step.

Each step, the reference completes its next instant and the engine processes up to a drawn
number of its pending SimPy events that are due by then, so the engine lags behind by a few
events and catches up in different interleavings. When both have finished a case, the engine's
whole trace is checked and the next drawn case starts.
"""

from __future__ import annotations

import dataclasses

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from reference_scheduler import ReferenceScheduler
from strategies import Case, cases

from pipesim.engine.des import DesRun
from pipesim.engine.lowering import Program
from pipesim.simulation import make_plan, prepare
from pipesim.spec.profile import uniform_profile
from pipesim.spec.topology import Topology
from trace_invariants import find_trace_violations


class EngineBesideReference(RuleBasedStateMachine):
    """State: the cases still to run, and the engine and the reference running the current one."""

    def __init__(self) -> None:
        super().__init__()
        self.queue: list[Case] = []
        self.program: Program | None = None
        self.engine: DesRun | None = None
        self.reference: ReferenceScheduler | None = None
        self.is_checked = False

    def _begin(self, case: Case) -> None:
        self.program = case.program()
        self.engine = DesRun(self.program)
        self.reference = ReferenceScheduler(self.program.ranks)
        self.is_checked = False

    def _engine_is_behind(self) -> bool:
        assert self.engine is not None and self.reference is not None
        return self.engine.next_event_s() <= self.reference.now_s

    @initialize(batch=st.lists(cases(), min_size=1, max_size=3))
    def start(self, batch: list[Case]) -> None:
        self.queue = batch[1:]
        self._begin(batch[0])

    @rule(engine_events=st.integers(0, 3))
    def step(self, engine_events: int) -> None:
        assert self.engine is not None and self.reference is not None and self.program is not None
        if not self.reference.is_finished:
            self.reference.step()
        elif not self._engine_is_behind():
            if not self.is_checked:
                trace = self.engine.finish()
                assert trace.makespan_s == max((t.end_s for t in self.reference.computed), default=0.0)
                assert find_trace_violations(self.program, trace) == []
                self.is_checked = True
                event("a case ran to the end")
            if self.queue:
                self._begin(self.queue.pop(0))
            return
        limit = engine_events if not self.reference.is_finished else None
        done = 0
        while self._engine_is_behind() and (limit is None or done < limit):
            self.engine.step()
            done += 1

    @invariant()
    def engine_never_disagrees_with_the_reference(self) -> None:
        if self.engine is not None and self.reference is not None:
            assert disagreements(self.engine, self.reference) == []


def disagreements(engine: DesRun, reference: ReferenceScheduler) -> list[str]:
    """What the engine did that the reference did not, at the same times, as ``"compute (r, pos, start, end)"``;
    once the engine has caught up with the reference's clock, also what it has not done yet."""
    done, sends = engine.completed(until_s=reference.now_s)
    computed = set(done)
    # The engine knows a send's times when its op ends; count it, as the reference does, once it arrived.
    sent = {send for send in sends if send[3] <= reference.now_s}
    expected_computed = {(t.rank, t.position, t.start_s, t.end_s) for t in reference.computed}
    expected_sent = {(t.rank, t.position, t.start_s, t.end_s, t.peer) for t in reference.sent
                     if t.end_s <= reference.now_s}
    found = [f"compute {item} not in the reference" for item in sorted(computed - expected_computed)]
    found += [f"send {item} not in the reference" for item in sorted(sent - expected_sent)]
    if engine.next_event_s() > reference.now_s:
        found += [f"compute {item} not in the engine" for item in sorted(expected_computed - computed)]
        found += [f"send {item} not in the engine" for item in sorted(expected_sent - sent)]
    return found


def test_the_comparison_catches_an_engine_that_differs() -> None:
    profile = uniform_profile(num_layers=2, forward_s=1e-3, backward_s=2e-3, activation_bytes=1e6)
    plan = make_plan(profile, schedule="1f1b", num_stages=2, num_microbatches=2)
    program = prepare(profile, Topology.uniform(num_devices=2, bandwidth="1GB/s"), plan)
    engine = DesRun(program)
    engine.finish()
    reference = ReferenceScheduler(program.ranks)
    reference.run()
    assert disagreements(engine, reference) == []
    # The reference sees 1F1 take 1 ms longer: from 1F1 on, rank 1's spans no longer match.
    slower = [op if str(op.op) != "1F1" else dataclasses.replace(op, duration_s=op.duration_s + 1e-3)
              for op in program.ranks[1]]
    reference = ReferenceScheduler((program.ranks[0], tuple(slower)))
    reference.run()
    found = disagreements(engine, reference)
    # rank 1 runs 1F0 1B0 1F1 ...: its first two spans still agree, 1F1 (position 2) does not.
    assert any(item.startswith("compute (1, 2,") for item in found), found
    assert not any(item.startswith(("compute (1, 0,", "compute (1, 1,", "compute (0, 0,")) for item in found)


TestEngineBesideReference = EngineBesideReference.TestCase
TestEngineBesideReference.settings = settings(stateful_step_count=100)
