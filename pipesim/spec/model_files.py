"""Models named on the command line: a preset name, or a model file (placeholder until the reader lands)."""

from __future__ import annotations

from pipesim.spec.transformer import TransformerConfig, preset


def load_model(name_or_path: str) -> TransformerConfig:
    """The preset called ``name_or_path``."""
    return preset(name_or_path)
