"""Plots as data files DVC renders (`dvc plots show`) and as PNGs for people who would rather look than read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from trainflow.io import atomic_path


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


def confusion_matrix(actual: np.ndarray, predicted: np.ndarray, classes: list[str], png: Path) -> None:
    plt = _figure()
    k = len(classes)
    counts = np.zeros((k, k), dtype=np.int64)
    np.add.at(counts, (actual, predicted), 1)
    fig, ax = plt.subplots(figsize=(1.0 + 0.5 * k, 1.0 + 0.5 * k))
    ax.imshow(counts, cmap="Blues")
    for i in range(k):
        for j in range(k):
            if counts[i, j]:
                ax.text(
                    j,
                    i,
                    str(counts[i, j]),
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white" if counts[i, j] > counts.max() / 2 else "black",
                )
    ax.set(
        xticks=range(k),
        yticks=range(k),
        xticklabels=classes,
        yticklabels=classes,
        xlabel="predicted",
        ylabel="actual",
        title="Confusion matrix (test)",
    )
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
