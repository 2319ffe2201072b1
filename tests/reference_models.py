"""Models from the reference's tests (unit-scaling 0.3.5), shared by the files that translate them."""

from __future__ import annotations

import torch
from torch import nn


class InPlaceResiduals(nn.Module):
    """The reference's residual test model: constants added and residuals joined in place."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.l1, self.l2 = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = x
        x = self.l1(x + 1) + skip
        skip = x
        x += 1
        x = self.l2(x)
        x += skip
        return x
