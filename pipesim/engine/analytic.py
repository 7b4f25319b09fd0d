"""The analytic engine: the DES engine's timeline without events, the timing kernel over a worklist."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import numpy.typing as npt

from pipesim import jit
from pipesim.engine.assemble import trace_from_times
from pipesim.engine.kernel import END, KernelState, deadlock_error, solve
from pipesim.engine.lowering import Program
from pipesim.engine.noise import run_durations
from pipesim.engine.trace import Trace
from pipesim.errors import ConfigError

FloatArray = npt.NDArray[np.float64]


def analytic_unsupported(program: Program) -> str | None:
    """Why the analytic engine cannot reproduce the DES engine for this run, or None if it can.

    It applies wherever every link is dedicated to its rank pair: then each op's start is a
    max of known ends and each link a first-in first-out queue in its rank's order. Links over
    shared NICs (contention) split bandwidth by the order of events, which only the DES follows.
    """
    if program.has_link_contention:
        return "the topology shares links between flows (contention), which only the des engine models"
    return None


def run_analytic(
    program: Program,
    *,
    jitter: float = 0.0,
    seed: int = 0,
    durations: npt.ArrayLike | None = None,
    compiled: bool | None = None,
) -> Trace:
    """The Trace the DES engine gives for ``program`` (same arguments, same bits), without events.

    Every rank runs the timing kernel (``kernel.advance``) until it waits for an input not
    known yet; the rank that computes that input puts it back on the worklist.

    Args:
        jitter, seed, durations: the ops' durations, as for ``des.run_des`` (drawn up front).
        compiled: run numba's kernels (default: ``jit.use_compiled(num_ops)``).

    Raises:
        DeadlockError: some rank cannot proceed; names each stuck op and what it waits for.
        ConfigError: the analytic engine does not apply (see ``analytic_unsupported``), or
            the durations break a rule.
    """
    _check_applies(program)
    chosen = run_durations(program, jitter=jitter, seed=seed, durations=durations)
    use = jit.use_compiled(program.ops.num_ops) if compiled is None else compiled
    state = KernelState.build(program, chosen, compiled=use)
    _solve(program, state, use)
    spans = state.span_columns()
    info = program.info.ran("analytic", jitter=jitter, seed=seed if jitter or durations is not None else None)
    return trace_from_times(program, spans, info, compiled=use)


def span_ends(program: Program, runs: Iterable[FloatArray], *, compiled: bool | None = None) -> Iterator[FloatArray]:
    """The end of every span (the Trace's span order) of one run per durations vector in
    ``runs`` (one per op, OpTable order), without the rest of a Trace: what many runs of one
    program (``--samples``) are summarised from. One kernel state serves every run; each array
    is valid until the next is asked for.

    Raises:
        DeadlockError, ConfigError: as ``run_analytic``.
    """
    _check_applies(program)
    use = jit.use_compiled(program.ops.num_ops) if compiled is None else compiled
    state: KernelState | None = None
    for durations in runs:
        chosen = run_durations(program, durations=durations)
        if state is not None and state.compiled:
            state.rerun(chosen)
        else:
            state = KernelState.build(program, chosen, compiled=use)
        _solve(program, state, use)
        yield state.column(END, state.num_spans)


def _check_applies(program: Program) -> None:
    """Raise ConfigError where the analytic engine does not apply (``analytic_unsupported``)."""
    reason = analytic_unsupported(program)
    if reason is not None:
        raise ConfigError("engine", "analytic", reason)


def _solve(program: Program, state: KernelState, compiled: bool) -> None:
    """Run the timing kernel over every rank of ``state``; raise DeadlockError if some rank is stuck."""
    if jit.pick(solve, compiled)(state.order, state.ints, state.floats):
        raise deadlock_error(program, state.stuck(program), state.arrival_s())
