"""Plots of traces and metrics; the only package that imports matplotlib (lazily, inside functions)."""

from pipesim.plots.files import figure_bytes, save_figure, use_headless_backend
from pipesim.plots import notebook
from pipesim.plots.memory import memory, memory_breakdown
from pipesim.plots.staleness import staleness
from pipesim.plots.sweeps import bubble, heatmap, pareto
from pipesim.plots.timeline import timeline

# In a notebook, results and traces then display with their timeline.
notebook.register()

__all__ = [
    "bubble",
    "figure_bytes",
    "heatmap",
    "memory",
    "memory_breakdown",
    "pareto",
    "save_figure",
    "staleness",
    "timeline",
    "use_headless_backend",
]
