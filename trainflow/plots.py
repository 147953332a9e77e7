"""Plots as data files DVC renders (`dvc plots show`) and as PNGs for people who would rather look than read."""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pandas as pd

from trainflow.core.io import atomic_path


def _figure():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_csv(frame: pd.DataFrame, path: Path) -> None:
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)


def training_curves(history: pd.DataFrame, png: Path) -> None:
    plt = _figure()
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    ax_loss.plot(history["epoch"], history["train_loss"], label="train")
    ax_loss.plot(history["epoch"], history["val_loss"], label="val")
    ax_loss.set(xlabel="epoch", ylabel="loss (mean per sample)", title="Loss")
    ax_loss.legend()
    metric = next(m for m in ("val_accuracy", "val_r2", "val_loss") if m in history)
    name = metric.removeprefix("val_").replace("r2", "R²")
    ax_acc.plot(history["epoch"], history[metric], color="tab:green")
    ax_acc.set(xlabel="epoch", ylabel=name, title=f"Validation {name}")
    fig.tight_layout()
    with atomic_path(png) as tmp:
        fig.savefig(tmp, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)


MAX_CLASSES = 20  # a confusion matrix shows at most this many classes: the most frequent, then "other"
OTHER = "(other)"


def top_classes(actual: np.ndarray, predicted: np.ndarray, classes: list[str]) -> tuple[np.ndarray, ...]:
    """(actual, predicted, names) with classes beyond the MAX_CLASSES - 1 most frequent in `actual` merged as OTHER,
    so a 220-class problem gives a readable 20 x 20 matrix."""
    k = len(classes)
    if k <= MAX_CLASSES:
        return actual, predicted, np.asarray(classes, dtype=object)
    support = np.bincount(actual, minlength=k)
    keep = np.argsort(-support, kind="stable")[: MAX_CLASSES - 1]
    index = np.full(k, MAX_CLASSES - 1)
    index[keep] = np.arange(len(keep))
    names = np.array([*(classes[i] for i in keep), OTHER], dtype=object)
    return index[actual], index[predicted], names


def decile_bins(actual: np.ndarray, predicted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Regression values as the deciles of the actual values ("2.50-5.10"), for a confusion matrix of the bins."""
    edges = np.unique(np.quantile(actual, np.linspace(0, 1, 11)))
    names = [f"{lo:.3g}-{hi:.3g}" for lo, hi in zip(edges[:-1], edges[1:])] or [f"{edges[0]:.3g}"]
    last = len(names) - 1

    def binned(values: np.ndarray) -> np.ndarray:
        return np.asarray(names, dtype=object)[np.clip(np.searchsorted(edges, values, side="right") - 1, 0, last)]

    return binned(actual), binned(predicted)


def display_order(names: list[str]) -> list[int]:
    """The order to show classes in: by value when every name is a number ("2" before "10"), else as given, which is
    the model's own order (index i is class i: ingest sorts the labels, by value when they are numbers). OTHER, the
    merged rare classes, stays last."""
    body = [i for i, n in enumerate(names) if n != OTHER]
    with contextlib.suppress(ValueError):  # text labels: the model's order
        body.sort(key=lambda i: float(names[i]))  # stable: equal values keep the model's order
    return body + [i for i, n in enumerate(names) if n == OTHER]


def confusion_counts(actual: np.ndarray, predicted: np.ndarray, classes: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(counts, names): counts[i, j] = test rows of actual class names[i] predicted as names[j], for at most
    MAX_CLASSES classes (top_classes), in display_order."""
    actual, predicted, names = top_classes(actual, predicted, classes)
    k = len(names)
    counts = np.zeros((k, k), dtype=np.int64)
    np.add.at(counts, (actual, predicted), 1)
    order = display_order(list(names))
    return counts[np.ix_(order, order)], names[order]


def row_rates(counts: np.ndarray) -> np.ndarray:
    """Each row of `counts` as shares of its sum (the recall of its class on the diagonal); NaN for a class without
    test rows."""
    totals = counts.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(totals > 0, counts / np.maximum(totals, 1), np.nan)


MIN_SIDE = 5.0  # inches (500 px at dpi 100): two classes still fit their two-line cells, the title and the colour bar


def confusion_matrix(actual: np.ndarray, predicted: np.ndarray, classes: list[str], png: Path) -> None:
    """A confusion matrix image of at most MAX_CLASSES classes (the most frequent; the rest as "other"): each cell the
    share of its row (how the test rows of that actual class were predicted) over the count, coloured by the share,
    so a rare class reads as well as a common one."""
    plt = _figure()
    counts, names = confusion_counts(actual, predicted, classes)
    rates = row_rates(counts)
    k = len(names)
    side = min(11.0, max(MIN_SIDE, 1.0 + 0.5 * k))
    fig, ax = plt.subplots(figsize=(side + 1.0, side))  # + an inch for the colour bar: at most 1,200 x 1,100 pixels
    image = ax.imshow(np.nan_to_num(rates), cmap="Blues", vmin=0.0, vmax=1.0)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="share of the actual class's test rows")
    size = 11 if k <= 5 else 9 if k <= 10 else 7
    for i in range(k):
        for j in range(k):
            if counts[i, j]:
                ax.text(
                    j,
                    i,
                    f"{rates[i, j]:.0%}\n({counts[i, j]})" if rates[i, j] >= 0.005 else f"<1%\n({counts[i, j]})",
                    ha="center",
                    va="center",
                    fontsize=size,
                    color="white" if rates[i, j] > 0.5 else "black",
                )
    title = (
        "Confusion matrix (test)" if k == len(classes) else f"Confusion matrix (test): top {k - 1} of {len(classes)}"
    )
    ax.set(
        xticks=range(k),
        yticks=range(k),
        xticklabels=names,
        yticklabels=names,
        xlabel="predicted",
        ylabel="actual",
    )
    ax.set_title(f"{title}\neach cell: % of the actual class's rows (count)", fontsize=11)
    plt.setp(ax.get_xticklabels(), rotation=45, ha="right")
    fig.tight_layout()
    with atomic_path(png) as tmp:
        fig.savefig(tmp, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)


def predicted_vs_actual(actual: np.ndarray, predicted: np.ndarray, png: Path) -> None:
    plt = _figure()
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.scatter(actual, predicted, s=6, alpha=0.5)
    lo, hi = float(min(actual.min(), predicted.min())), float(max(actual.max(), predicted.max()))
    ax.plot([lo, hi], [lo, hi], color="tab:red", linewidth=1)
    ax.set(xlabel="actual", ylabel="predicted", title="Predicted vs actual (test)")
    fig.tight_layout()
    with atomic_path(png) as tmp:
        fig.savefig(tmp, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)


def history_frame(history: list[dict[str, float]]) -> pd.DataFrame:
    """The evaluations as a table in one column order (update, epoch, train_loss, val metrics, lr), whether the
    records were made in this process or restored from a checkpoint (whose JSON sorts keys)."""
    frame = pd.DataFrame(history)
    first, last = ["update", "epoch", "train_loss"], ["lr"]
    middle = sorted(c for c in frame.columns if c not in first + last)
    return frame[[c for c in [*first, *middle, *last] if c in frame.columns]]


MAX_CURVES = 10  # ROC and PR curves: one per class, for at most this many (the most frequent in the test labels)
MAX_POINTS = 1000  # points kept per curve in the CSVs (a PR curve has one per distinct score)
ROC_COLUMNS = ["class", "fpr", "tpr", "threshold"]
PR_COLUMNS = ["class", "recall", "precision", "threshold"]


def curve_classes(labels: np.ndarray, k: int) -> list[int]:
    """The classes to draw curves for: binary, the positive class (index 1); else one-vs-rest for the MAX_CURVES
    most frequent classes of `labels` (a class without a test row has no curve)."""
    if k == 2:
        return [1] if 0 < (labels == 1).sum() < len(labels) else []
    support = np.bincount(labels, minlength=k)
    return [int(c) for c in np.argsort(-support, kind="stable")[:MAX_CURVES] if 0 < support[c] < len(labels)]


def _thin(frame: pd.DataFrame) -> pd.DataFrame:
    if len(frame) <= MAX_POINTS:
        return frame
    return frame.iloc[np.unique(np.linspace(0, len(frame) - 1, MAX_POINTS).round().astype(int))]


def curves(labels: np.ndarray, proba: np.ndarray, classes: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(ROC, precision-recall) points of `curve_classes`, one row per point (ROC_COLUMNS, PR_COLUMNS), for DVC.

    The ROC curve starts at threshold inf (nothing predicted positive); the PR curve ends at recall 0, precision 1
    (no threshold). Long curves are thinned to MAX_POINTS evenly spaced points."""
    from sklearn.metrics import precision_recall_curve, roc_curve

    roc, pr = [], []
    for c in curve_classes(labels, proba.shape[1]):
        fpr, tpr, at = roc_curve(labels == c, proba[:, c])
        roc.append(_thin(pd.DataFrame({"class": classes[c], "fpr": fpr, "tpr": tpr, "threshold": at})))
        precision, recall, at = precision_recall_curve(labels == c, proba[:, c])
        at = np.append(at, np.nan)  # the last point (recall 0) has no threshold
        pr.append(_thin(pd.DataFrame({"class": classes[c], "recall": recall, "precision": precision, "threshold": at})))
    return (
        pd.concat(roc, ignore_index=True) if roc else pd.DataFrame(columns=ROC_COLUMNS),
        pd.concat(pr, ignore_index=True) if pr else pd.DataFrame(columns=PR_COLUMNS),
    )


def roc_pr_curves(labels: np.ndarray, proba: np.ndarray, classes: list[str], png: Path) -> None:
    """ROC (left) and precision-recall (right) curves of `curve_classes`, each labelled with its area."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    plt = _figure()
    roc, pr = curves(labels, proba, classes)
    fig, (ax_roc, ax_pr) = plt.subplots(1, 2, figsize=(10, 4.5))
    ax_roc.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1)
    k = proba.shape[1]
    for c in curve_classes(labels, k):
        name, hit = classes[c], labels == c
        points = roc[roc["class"] == name]
        ax_roc.plot(points["fpr"], points["tpr"], label=f"{name} (AUC {roc_auc_score(hit, proba[:, c]):.3f})")
        points = pr[pr["class"] == name]
        ap = average_precision_score(hit, proba[:, c])
        ax_pr.plot(points["recall"], points["precision"], drawstyle="steps-post", label=f"{name} (AP {ap:.3f})")
    which = "positive class" if k == 2 else "one vs rest" if k <= MAX_CURVES else f"top {MAX_CURVES} of {k} classes"
    ax_roc.set(xlabel="false positive rate", ylabel="true positive rate", title=f"ROC (test, {which})")
    ax_pr.set(xlabel="recall", ylabel="precision", title=f"Precision-recall (test, {which})", ylim=(0, 1.02))
    if len(roc):
        ax_roc.legend(fontsize=8, loc="lower right")
        ax_pr.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    with atomic_path(png) as tmp:
        fig.savefig(tmp, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
