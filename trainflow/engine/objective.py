"""Losses as sums over loss terms, and validation metrics accumulated on the device.

The engine divides a window's loss sum once by the window's `Batch.count`; an objective never averages itself.

Regression trains on standardised targets ((y - mean) / std, fitted on train), but every loss and metric it reports
is in the target's own units: the squared error (val_loss, train_loss) times std**2, val_rmse times std. So val_rmse
and the test split's rmse mean the same thing, and min_delta of an early-stopping rule is in the units users know.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch.nn import functional as F

from trainflow.engine.data import IGNORE_INDEX

Task = Literal["classification", "regression"]


class Objective:
    """Cross-entropy for classification (per sample or per token), squared error for regression."""

    def __init__(self, task: Task, target_scale: float = 1.0) -> None:
        self.task = task
        # Regression: the std the targets were divided by; reported squared errors are multiplied by its square.
        self.loss_unit = target_scale**2 if task == "regression" else 1.0
        # Validation sums kept on the device; names of what `metrics()` reads from them.
        self.sum_names = ("loss", "count", "correct") if task == "classification" else ("loss", "count", "y", "y2")

    def loss_sum(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        out = out.float()  # the loss in fp32 whatever the autocast dtype
        if self.task == "classification":
            return F.cross_entropy(
                out.reshape(-1, out.shape[-1]), target.reshape(-1), reduction="sum", ignore_index=IGNORE_INDEX
            )
        return F.mse_loss(out.reshape(target.shape), target.float(), reduction="sum")

    def eval_sums(self, out: torch.Tensor, target: torch.Tensor, count: int) -> list[torch.Tensor | float]:
        """This batch's contribution to each of `sum_names`."""
        loss = self.loss_sum(out, target)
        if self.task == "classification":
            pred = out.argmax(dim=-1)
            correct = ((pred == target) & (target != IGNORE_INDEX)).sum()
            return [loss, count, correct]
        y = target.float()
        return [loss, count, y.sum(), (y * y).sum()]

    def metrics(self, sums: dict[str, float], prefix: str = "val_") -> dict[str, float]:
        n = max(sums["count"], 1.0)
        out = {f"{prefix}loss": sums["loss"] / n * self.loss_unit}
        if self.task == "classification":
            out[f"{prefix}accuracy"] = sums["correct"] / n
        else:
            total = sums["y2"] - sums["y"] ** 2 / n  # n * variance of the targets (scale-free, as is R²)
            out[f"{prefix}rmse"] = (sums["loss"] / n * self.loss_unit) ** 0.5
            out[f"{prefix}r2"] = 1.0 - sums["loss"] / total if total > 0 else float("nan")
        return out
