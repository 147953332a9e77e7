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

from trainflow.engine.loaders import IGNORE_INDEX
from trainflow.engine.ranking import roc_pr_auc

Task = Literal["classification", "regression"]

# val_ece: equal-width bins of the top-class confidence, as the test split's ece (stages/evaluate.py). Per bin, the
# sums of samples, confidences and correct predictions: ECE = sum over bins |correct - confidence| / n.
ECE_BINS = 15
CALIBRATION = tuple(f"bin{b}_{what}" for what in ("count", "confidence", "correct") for b in range(ECE_BINS))
# val_roc_auc, val_pr_auc: a ranking of every val score, not a sum per batch. The trainer gathers the scores only
# when train.monitor names one of them (memory: the val set's class probabilities, [N, classes]).
RANKED = ("roc_auc", "pr_auc")


class Objective:
    """Cross-entropy for classification (per sample or per token), squared error for regression."""

    ranked_names = RANKED  # what ranked_sums returns, in order

    def __init__(
        self,
        task: Task,
        target_scale: float = 1.0,
        label_smoothing: float = 0.0,
        class_weights: torch.Tensor | None = None,
    ) -> None:
        self.task = task
        # Classification's training loss only: val_loss and the test metrics stay the plain cross-entropy, so they
        # mean the same whatever the regularisers (and early stopping compares like with like).
        self.label_smoothing = label_smoothing
        self.class_weights = class_weights  # per class, on the training device; each term weighs w[its class]
        # Regression: the std the targets were divided by; reported squared errors are multiplied by its square.
        self.loss_unit = target_scale**2 if task == "regression" else 1.0
        # Validation sums kept on the device; names of what `metrics()` reads from them.
        self.sum_names = (
            ("loss", "count", "correct", *CALIBRATION) if task == "classification" else ("loss", "count", "y", "y2")
        )

    def loss_sum(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        out = out.float()  # the loss in fp32 whatever the autocast dtype
        if self.task == "classification":
            return F.cross_entropy(
                out.reshape(-1, out.shape[-1]), target.reshape(-1), reduction="sum", ignore_index=IGNORE_INDEX
            )
        return F.mse_loss(out.reshape(target.shape), target.float(), reduction="sum")

    def train_loss_sum(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The training loss summed over the terms: with class weights, sum of w[y] * loss (still divided by the
        number of terms, not the weights' sum, so accumulation stays exact: balanced weights average 1 over train)."""
        if self.task != "classification" or (self.label_smoothing == 0 and self.class_weights is None):
            return self.loss_sum(out, target)
        out = out.float()
        return F.cross_entropy(
            out.reshape(-1, out.shape[-1]),
            target.reshape(-1),
            weight=self.class_weights,
            reduction="sum",
            ignore_index=IGNORE_INDEX,
            label_smoothing=self.label_smoothing,
        )

    def eval_sums(self, out: torch.Tensor, target: torch.Tensor, count: int) -> list[torch.Tensor | float]:
        """This batch's contribution to each of `sum_names`, in order (the CALIBRATION bins as one vector)."""
        if self.task == "classification":
            out, target = out.reshape(-1, out.shape[-1]), target.reshape(-1)  # per token: one row per target token
            log_p = out.float().log_softmax(-1)
            loss = F.nll_loss(log_p, target, reduction="sum", ignore_index=IGNORE_INDEX)  # loss_sum's cross-entropy
            pred = out.argmax(dim=-1)
            labelled = target != IGNORE_INDEX
            correct = (pred == target) & labelled
            confidence = log_p.gather(1, pred.unsqueeze(1)).squeeze(1).exp()  # of the predicted class
            return [loss, count, correct.sum(), calibration_sums(confidence, correct, labelled)]
        loss = self.loss_sum(out, target)
        y = target.float()
        return [loss, count, y.sum(), (y * y).sum()]

    def wants_scores(self, monitor: str) -> bool:
        """Whether an evaluation must gather every val score for `monitor` (see RANKED)."""
        return self.task == "classification" and monitor.removeprefix("val_") in RANKED

    def scores(self, out: torch.Tensor) -> torch.Tensor:
        """What `ranked_sums` ranks: the class probabilities of a batch of per-sample outputs, [N, classes]."""
        return out.float().softmax(-1)

    def ranked_sums(self, scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The RANKED metrics of the whole val set (float64 on the device, one per name), read with the sums."""
        return roc_pr_auc(scores, labels)

    def metrics(self, sums: dict[str, float], prefix: str = "val_") -> dict[str, float]:
        n = max(sums["count"], 1.0)
        out = {f"{prefix}loss": sums["loss"] / n * self.loss_unit}
        if self.task == "classification":
            out[f"{prefix}accuracy"] = sums["correct"] / n
            gaps = (abs(sums[f"bin{b}_correct"] - sums[f"bin{b}_confidence"]) for b in range(ECE_BINS))
            out[f"{prefix}ece"] = sum(gaps) / n  # sum over bins of |B|/n * |accuracy(B) - confidence(B)|
            out.update({f"{prefix}{name}": sums[name] for name in RANKED if name in sums})
        else:
            total = sums["y2"] - sums["y"] ** 2 / n  # n * variance of the targets (scale-free, as is R²)
            out[f"{prefix}rmse"] = (sums["loss"] / n * self.loss_unit) ** 0.5
            out[f"{prefix}r2"] = 1.0 - sums["loss"] / total if total > 0 else float("nan")
        return out


def calibration_sums(confidence: torch.Tensor, correct: torch.Tensor, labelled: torch.Tensor) -> torch.Tensor:
    """The CALIBRATION sums of one batch, float64 [3 * ECE_BINS]: per bin the labelled terms, their confidences and
    their correct predictions. Bin b holds confidences in (b / ECE_BINS, (b + 1) / ECE_BINS] (the first also 0)."""
    edges = torch.arange(ECE_BINS + 1, dtype=torch.float64, device=confidence.device) / ECE_BINS
    confidence = confidence.double()
    bins = (torch.bucketize(confidence, edges) - 1).clamp_(0, ECE_BINS - 1)
    # One-hot by comparison: F.one_hot reads its input's range back to the host on CPU (the host-sync test's device).
    member = (bins.unsqueeze(1) == torch.arange(ECE_BINS, device=bins.device)).double()  # [N, bins]
    weights = torch.stack([labelled.double(), confidence * labelled, correct.double()])  # [3, N]
    return (weights @ member).reshape(-1)  # float64 matmul: no TF32 rounding of the confidences
