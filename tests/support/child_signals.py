"""What a test's child process needs of its signals to behave as a terminal's foreground job."""

from __future__ import annotations

import signal


def default_sigint() -> None:
    """In the child before it starts (``Popen(preexec_fn=...)``): Ctrl-C's default action, so that
    Python turns it into KeyboardInterrupt even where the suite runs under a shell that ignores
    SIGINT (a job started with ``&`` in a script, as ``.ci/run`` runs it, inherits SIG_IGN, and
    Python then installs no handler)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
