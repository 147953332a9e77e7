"""The metric functions of the test split, each one definition: the evaluate stage writes them to metrics.json and the
promotion gate (trainflow.registry.gate) compares models with them, so both always mean the same number."""

from __future__ import annotations

import numpy as np
import pandas as pd

ECE_BINS = 15  # as val_ece (trainflow/engine/objective.py): equal-width bins of the top-class confidence


def classification_metrics(labels: np.ndarray, proba: np.ndarray) -> dict[str, float]:
    from sklearn.metrics import accuracy_score, f1_score, log_loss

    predicted = proba.argmax(axis=1)
    # Macro F1 averages over the classes that occur in the labels or the predictions: a class absent from both (a
    # rare class that missed this test split) has no F1 to speak of, and counting it as 0 would punish a perfect model.
    return {
        "accuracy": float(accuracy_score(labels, predicted)),
        "f1_macro": float(f1_score(labels, predicted, average="macro", zero_division=0)),
        "log_loss": float(log_loss(labels, proba.astype(np.float64), labels=range(proba.shape[1]))),
        **ranked_metrics(labels, proba),
        "ece": expected_calibration_error(labels, proba),
    }


def ranked_metrics(labels: np.ndarray, proba: np.ndarray) -> dict[str, float]:
    """roc_auc and pr_auc (average precision). Binary: of the positive class (index 1). Multiclass: the macro average
    one-vs-rest over the classes that can be scored (ROC: the class and another one occur in `labels`; AP: the class
    occurs), so a class that missed the test split is skipped, not a crash (sklearn raises) nor a 0 that would punish
    a perfect model. NaN when no class can be scored (a test split of one class)."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    k = proba.shape[1]
    roc, ap = [], []
    for c in [1] if k == 2 else range(k):
        hit, score = labels == c, proba[:, c].astype(np.float64)
        if hit.any():
            ap.append(average_precision_score(hit, score))
            if not hit.all():
                roc.append(roc_auc_score(hit, score))
    return {"roc_auc": float(np.mean(roc)) if roc else np.nan, "pr_auc": float(np.mean(ap)) if ap else np.nan}


def expected_calibration_error(labels: np.ndarray, proba: np.ndarray, bins: int = ECE_BINS) -> float:
    """sum over bins b of |B_b| / n * |accuracy(B_b) - mean confidence(B_b)|, B_b the samples whose top-class
    probability lies in (b / bins, (b + 1) / bins]."""
    confidence = proba.max(axis=1).astype(np.float64)
    correct = (proba.argmax(axis=1) == labels).astype(np.float64)
    edges = np.arange(bins + 1) / bins
    which = np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, bins - 1)
    gaps = np.bincount(which, weights=correct - confidence, minlength=bins)  # per bin: |B| * (accuracy - confidence)
    return float(np.abs(gaps).sum() / max(len(labels), 1))


PER_CLASS_COLUMNS = ["class", "precision", "recall", "f1", "support"]


def per_class(labels: np.ndarray, predicted: np.ndarray, classes: list[str]) -> pd.DataFrame:
    """Precision, recall, F1 and support (test rows) of every class the model knows; 0 where undefined."""
    from sklearn.metrics import precision_recall_fscore_support

    precision, recall, f1, support = precision_recall_fscore_support(
        labels, predicted, labels=range(len(classes)), zero_division=0
    )
    return pd.DataFrame({"class": classes, "precision": precision, "recall": recall, "f1": f1, "support": support})


def regression_metrics(y: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

    return {
        "r2": float(r2_score(y, predicted)),
        "rmse": float(np.sqrt(mean_squared_error(y, predicted))),
        "mae": float(mean_absolute_error(y, predicted)),
    }
