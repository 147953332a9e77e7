"""Seeded, optionally stratified train/val/test split of the processed table."""

from __future__ import annotations

import numpy as np
import pandas as pd

from trainflow.errors import DataError

SPLITS = ("train", "val", "test")


def split_frame(
    frame: pd.DataFrame, labels: pd.Series | None, val_fraction: float, test_fraction: float, seed: int
) -> dict[str, pd.DataFrame]:
    """Row subsets for train/val/test. Stratified on `labels` when given; each subset keeps the table's row order."""
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(frame))
    try:
        rest, test = train_test_split(idx, test_size=test_fraction, random_state=seed, stratify=labels)
        rest_labels = labels.iloc[rest] if labels is not None else None
        train, val = train_test_split(
            rest, test_size=val_fraction / (1 - test_fraction), random_state=seed + 1, stratify=rest_labels
        )
    except ValueError as exc:
        raise DataError(
            f"split: cannot split {len(frame)} rows with val_fraction={val_fraction}, test_fraction={test_fraction}"
            f"{' stratified by class' if labels is not None else ''}: {exc}. "
            "Set split.stratify: false, change the fractions, or add rows for the small classes."
        ) from None
    return {name: frame.iloc[np.sort(part)].reset_index(drop=True) for name, part in zip(SPLITS, (train, val, test))}
