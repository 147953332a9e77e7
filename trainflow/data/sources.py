"""Raw data sources: a table file (CSV, TSV, Parquet, JSONL) or a dataset that ships inside scikit-learn."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from trainflow.errors import DataError

# Datasets that ship inside scikit-learn's wheel: read from disk, never downloaded.
BUILTIN = ("digits", "iris", "wine", "breast_cancer")


def read_builtin(name: str) -> pd.DataFrame:
    from sklearn import datasets

    if name not in BUILTIN:
        raise DataError(f"data.source: unknown built-in dataset {name!r}; choose one of {', '.join(BUILTIN)}")
    bunch = getattr(datasets, f"load_{name}")(as_frame=True)
    frame: pd.DataFrame = bunch.frame
    return frame


def read_file(path: Path) -> pd.DataFrame:
    if not path.exists():
        raise DataError(f"data.source: file {path} does not exist; put the data there or fix data.source")
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            return pd.read_parquet(path)
        if suffix in (".jsonl", ".ndjson"):
            return pd.read_json(path, lines=True)
        if suffix in (".csv", ".tsv", ".txt"):
            return pd.read_csv(path, sep="\t" if suffix == ".tsv" else ",")
    except (ValueError, OSError) as exc:
        raise DataError(f"data.source: cannot read {path}: {exc}") from None
    raise DataError(f"data.source: {path} has an unsupported extension {suffix!r}; use .csv, .tsv, .parquet or .jsonl")


def read_source(source: str, root: Path) -> pd.DataFrame:
    """The raw table named by `data.source` (a path relative to `root`, or builtin:<name>)."""
    if source.startswith("builtin:"):
        return read_builtin(source.removeprefix("builtin:"))
    path = Path(source)
    return read_file(path if path.is_absolute() else root / path)
