"""The schema ingest infers once and writes beside the processed table; later stages read it instead of params."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from trainflow.errors import DataError
from trainflow.io import read_json


@dataclass(frozen=True)
class Schema:
    source: str
    target: str
    features: list[str]
    task: str  # "classification" (regression arrives with the data layer issue)
    classes: list[str]  # label values in index order: class i is classes[i]
    n_rows: int

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def read(cls, path: Path) -> Schema:
        return cls(**read_json(path))


def infer_schema(
    frame: pd.DataFrame, source: str, target: str, features: list[str] | None, exclude: list[str]
) -> Schema:
    """Check the columns against the params and decide features and classes. Raises DataError naming the column."""
    where = f"data.source {source!r}"
    if frame.empty:
        raise DataError(f"{where}: the table is empty (0 rows); point data.source at a file with data")
    columns = [str(c) for c in frame.columns]
    frame.columns = columns
    if target not in columns:
        raise DataError(
            f"{where}: data.target column {target!r} not found; the columns are: {', '.join(columns)}. "
            "Set data.target to one of them."
        )
    missing = [c for c in (features or []) + exclude if c not in columns]
    if missing:
        raise DataError(f"{where}: columns {missing} named in data.features/data.exclude do not exist")
    chosen = features if features is not None else [c for c in columns if c != target and c not in exclude]
    if not chosen:
        raise DataError(f"{where}: no feature columns left after data.features/data.exclude")
    bad = [c for c in chosen if not (pd.api.types.is_numeric_dtype(frame[c]) or pd.api.types.is_bool_dtype(frame[c]))]
    if bad:
        col = bad[0]
        row = frame[col].first_valid_index()
        example = frame[col].loc[row] if row is not None else None
        raise DataError(
            f"{where}: feature column(s) {bad} are not numeric (e.g. column {col!r}, row {row}: {example!r}); "
            "the MLP takes numbers only. Add them to data.exclude or convert them to numbers."
        )
    labels = frame[target]
    if labels.isna().any():
        row = labels[labels.isna()].index[0]
        raise DataError(f"{where}: target column {target!r} has missing values (first at row {row}); drop those rows")
    classes = sorted(str(v) for v in labels.astype(str).unique())
    if len(classes) < 2:
        raise DataError(f"{where}: target column {target!r} has a single class {classes}; nothing to learn")
    return Schema(
        source=source, target=target, features=chosen, task="classification", classes=classes, n_rows=len(frame)
    )
