"""Plots of traces and metrics; the only package that imports matplotlib (lazily, inside functions)."""

from pipesim.plots.files import save_figure, use_headless_backend
from pipesim.plots.timeline import timeline

__all__ = ["save_figure", "timeline", "use_headless_backend"]
