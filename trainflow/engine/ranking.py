"""ROC AUC and average precision of validation scores, on the device, without a host sync.

They need every score at once (a sum per batch cannot hold a ranking), so the trainer gathers the val set's class
probabilities and labels into preallocated device tensors and calls `roc_pr_auc` once, at the end of an evaluation.
The numbers are sklearn's: `roc_auc_score` (the trapezoid under the ROC curve, where tied scores form one diagonal
step) and `average_precision_score` (sum over thresholds of (recall gain) * precision, no interpolation).
"""

from __future__ import annotations

import torch


def roc_pr_auc(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """[ROC AUC, average precision] (float64, on the device) of class scores [N, k] against labels [N].

    k == 2: of the positive class (index 1). k > 2: the macro average one-vs-rest over the classes that can be
    scored: ROC needs a sample of the class and one of another, AP a sample of the class; classes missing from the
    labels are skipped (sklearn raises on them). NaN when no class can be scored. Memory: a few [N, k] float64."""
    n, k = scores.shape
    if n == 0:
        return torch.full((2,), float("nan"), dtype=torch.float64, device=scores.device)
    if k == 2:
        scores, hits = scores[:, 1:], (labels == 1).unsqueeze(1)
    else:
        hits = labels.unsqueeze(1) == torch.arange(k, device=labels.device)
    # Every column sorted by descending score; positives (tp) and negatives (fp) counted down the ranking.
    ranked, order = scores.double().sort(dim=0, descending=True, stable=True)
    hit = hits.gather(0, order).double()
    tp, fp = hit.cumsum(0), (1.0 - hit).cumsum(0)
    # A threshold ends where the next score differs: tied scores move the curve in one step.
    last = torch.ones_like(ranked, dtype=torch.bool)
    last[:-1] = ranked[1:] != ranked[:-1]
    tp_at, fp_at = torch.where(last, tp, 0.0), torch.where(last, fp, 0.0)
    # The counts at the previous threshold: they only grow, so a running max of the thresholds' counts, shifted.
    start = torch.zeros_like(tp[:1])
    tp_before = torch.cat([start, tp_at.cummax(0).values[:-1]])
    fp_before = torch.cat([start, fp_at.cummax(0).values[:-1]])
    positives, negatives = tp[-1], fp[-1]
    area = torch.where(last, (fp_at - fp_before) * (tp_at + tp_before), 0.0).sum(0) / 2 / (positives * negatives)
    # Precision at a threshold's end (tp_at + fp_at >= 1 there; elsewhere the 0/0 is masked out).
    precision = tp_at / (tp_at + fp_at)
    ap = torch.where(last, (tp_at - tp_before) * precision, 0.0).sum(0) / positives
    return torch.stack([_mean_where(area, (positives > 0) & (negatives > 0)), _mean_where(ap, positives > 0)])


def _mean_where(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The mean of `values` over `keep` (NaN if none), as device ops: no boolean indexing, which would sync."""
    return torch.where(keep, values, 0.0).sum() / keep.sum()
