"""Built-in models and build_model(). A model's config is plain JSON so it can be rebuilt without pickle."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class MLP(nn.Module):
    """Linear → GELU → Dropout per hidden layer, then a linear head producing logits."""

    def __init__(self, in_features: int, out_features: int, hidden_sizes: list[int], dropout: float) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for h in hidden_sizes:
            layers += [nn.Linear(width, h), nn.GELU(), nn.Dropout(dropout)]
            width = h
        layers.append(nn.Linear(width, out_features))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


def build_model(config: dict[str, Any]) -> nn.Module:
    """Rebuild a model from its JSON config: {"name": ..., plus the constructor's keyword arguments}."""
    kwargs = dict(config)
    name = kwargs.pop("name")
    if name == "mlp":
        return MLP(**kwargs)
    raise ValueError(f"unknown model {name!r}")
