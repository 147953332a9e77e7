"""Small torch models for the engine tests, called as trainflow calls its models: model(x=...)."""

from __future__ import annotations

import torch
from torch import nn


class Net(nn.Sequential):
    """A stack of layers called as trainflow calls its models: model(x=...)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x)
