"""The small run of a two-feature linear model that tests/engine/test_engine.py works out by hand: its data,
its trainer settings and the run itself. Needs tests/engine on sys.path (engine_kit), as the engine tests have it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from engine_kit import make_trainer
from torch import nn

from trainflow.engine.loaders import TensorData

X = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.5], [0.5, -1.0], [2.0, 1.0]])
Y = torch.tensor([0, 1, 1, 0, 0, 1])
VX = torch.tensor([[0.5, 0.5], [-0.5, 1.0], [1.5, -0.5], [0.0, -1.0], [1.0, 2.0]])
VY = torch.tensor([1, 0, 0, 1, 1])
# Trainer params of the small run: windows of 2 x 2 over 6 samples, so each epoch is a window of 4 and one of 2.
RUN: dict[str, Any] = {
    "batch_size": 2, "accumulate": 2, "epochs": 2, "optimizer": "sgd", "momentum": 0.0, "lr": 0.5, "min_lr": 0.05,
    "weight_decay": 0.1, "max_grad_norm": 0.5, "schedule": "linear", "warmup_fraction": 0.25, "log_every": 1,
}  # fmt: skip


class Lin(nn.Linear):
    """nn.Linear called as the engine calls models: forward(x=...)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x)


def linear() -> Lin:
    m = Lin(2, 2)
    with torch.no_grad():
        m.weight.copy_(torch.tensor([[0.5, -0.25], [0.125, 0.75]]))
        m.bias.copy_(torch.tensor([0.1, -0.2]))
    return m


def data() -> tuple[TensorData, TensorData]:
    return TensorData(X, Y), TensorData(VX, VY)


def fit(tmp: Path, **kw: Any) -> Any:
    t = make_trainer(tmp, linear(), **{**RUN, **kw})
    train, val = data()
    t.fit(train, val)
    return t
