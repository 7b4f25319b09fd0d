"""The priority of a measurement's processes: a nice value set before any starts so that all of them
inherit it, and the real-time policy an emulated device's ranks take."""

from __future__ import annotations

import os
from pathlib import Path

from pipesim.errors import ConfigError
from pipesim.harness.config import MAX_REALTIME_PRIORITY

AUTOGROUP = Path("/proc/self/autogroup")


def raise_priority(nice: int) -> None:
    """Set this process's nice value to ``nice`` (negative: ahead of other programs), before it starts
    any process or thread, so that every process of a measurement (the fork server, the ranks and
    their communication threads) inherits it; 0 leaves the priority as it is.

    Where Linux groups the CPU by session (autogroup), a nice value only orders the processes of
    one session, so the session's group gets the same nice value: this affects every process of
    the caller's session (a terminal's, a job's) while it runs.

    Raises:
        ConfigError: ``nice`` is outside -20..19, or this process may not take it (root or
            CAP_SYS_NICE is needed below the current value).
    """
    if nice == 0:
        return
    if not -20 <= nice <= 19:
        raise ConfigError("nice", nice, "must be in -20..19")
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
        if AUTOGROUP.exists():
            AUTOGROUP.write_text(str(nice), encoding="ascii")
    except OSError as error:
        raise ConfigError("nice", nice, f"could not be set ({error.strerror}); below 0 needs root or "
                                        "CAP_SYS_NICE") from None


def check_realtime(priority: int, compute: str = "emulated") -> None:
    """Refuse, before any rank starts, a real-time priority the ranks could not take: outside
    0..99, with ``compute`` other than emulated (computing ranks must share the cores as usual),
    or SCHED_RR refused to this process (tried on this thread, then given back).

    Raises:
        ConfigError: as above (root or CAP_SYS_NICE is needed).
    """
    if priority and compute != "emulated":
        raise ConfigError("realtime_priority", priority, "must be 0 unless compute is emulated")
    if not 0 <= priority <= MAX_REALTIME_PRIORITY:
        raise ConfigError("realtime_priority", priority, f"must be in 0..{MAX_REALTIME_PRIORITY}")
    if priority == 0:
        return
    before = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(priority))
    except OSError as error:
        raise ConfigError("realtime_priority", priority, f"could not be set ({error.strerror}); SCHED_RR needs "
                                                         "root or CAP_SYS_NICE") from None
    os.sched_setscheduler(0, *before)
