"""User models that fail on purpose, for the harness's failure tests (loaded as FILE.py:CALLABLE)."""

from __future__ import annotations

import time

import torch
from torch import nn

# Grad-enabled calls of the faulty layer before it fails: the warm-up's forward is call 1, so
# the fourth call is the forward of microbatch 2 (op 1F2 when the layer sits on stage 1).
FAIL_ON_CALL = 4


class Faulty(nn.Module):
    """A Linear that raises, or never returns, on its FAIL_ON_CALL-th forward with grad enabled."""

    def __init__(self, width: int, mode: str) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.mode = mode
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        if torch.is_grad_enabled():
            self.calls += 1
            if self.calls == FAIL_ON_CALL:
                if self.mode == "raise":
                    raise ValueError("injected failure in the faulty layer")
                while True:
                    time.sleep(1.0)
        return self.linear(x)


def raising() -> nn.Sequential:
    """Linear | Faulty(raise)."""
    return nn.Sequential(nn.Linear(8, 8), Faulty(8, "raise"))


def hanging() -> nn.Sequential:
    """Linear | Faulty(hang)."""
    return nn.Sequential(nn.Linear(8, 8), Faulty(8, "hang"))
