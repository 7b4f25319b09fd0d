"""Plots of traces and metrics; the only package that imports matplotlib (lazily, inside functions)."""

from pipesim.plots.files import save_figure
from pipesim.plots.timeline import timeline

__all__ = ["save_figure", "timeline"]
