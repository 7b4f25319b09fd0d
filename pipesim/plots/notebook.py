"""Results and traces in notebooks: their summary table with the timeline under it, as inline SVG.

``Result`` and ``Trace`` show a summary table by themselves (``_repr_html_``); drawing needs
matplotlib, which only this package imports, so importing ``pipesim.plots`` in an IPython or
Jupyter session registers these richer HTML forms with its display formatter.
"""

from __future__ import annotations

import sys
from typing import Any

from pipesim.engine.trace import Trace
from pipesim.plots.files import figure_bytes
from pipesim.plots.timeline import timeline
from pipesim.simulation import Result


def _timeline_svg(trace: Trace) -> str:
    text = figure_bytes(timeline(trace), "svg").decode("utf-8")
    return text[text.index("<svg"):]  # inline: without the XML declaration and doctype


def trace_html(trace: Trace) -> str:
    """The trace's summary table and its timeline (inline SVG)."""
    return f"{trace._repr_html_()}\n{_timeline_svg(trace)}"


def result_html(result: Result) -> str:
    """The result's summary table and its timeline (inline SVG)."""
    return f"{result._repr_html_()}\n{_timeline_svg(result.trace)}"


def register() -> bool:
    """Register ``result_html`` and ``trace_html`` with the running IPython's HTML formatter;
    False when no IPython session is running (nothing to register with)."""
    ipython_module: Any = sys.modules.get("IPython")
    shell = ipython_module.get_ipython() if ipython_module is not None else None
    if shell is None:
        return False
    formatter = shell.display_formatter.formatters["text/html"]
    formatter.for_type(Result, result_html)
    formatter.for_type(Trace, trace_html)
    return True
