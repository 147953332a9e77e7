"""Preprocessing fitted on the training split only, saved as JSON, applied identically at evaluation and prediction."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from trainflow.data.schema import Schema
from trainflow.errors import DataError
from trainflow.io import read_json, write_json


@dataclass(frozen=True)
class Preprocessor:
    """Numeric imputation (train mean) and standardisation (train mean/std), label encoding from the schema."""

    features: list[str]
    target: str
    classes: list[str]
    mean: list[float]
    std: list[float]

    @classmethod
    def fit(cls, train: pd.DataFrame, schema: Schema) -> Preprocessor:
        x = train[schema.features].to_numpy(dtype=np.float64)
        mean = np.nanmean(x, axis=0)
        mean = np.where(np.isnan(mean), 0.0, mean)  # an all-missing column imputes to 0
        std = np.nanstd(x, axis=0)
        std = np.where(~np.isfinite(std) | (std < 1e-12), 1.0, std)  # constant columns pass through centred
        return cls(schema.features, schema.target, schema.classes, mean.tolist(), std.tolist())

    def features_array(self, frame: pd.DataFrame, where: str = "input") -> np.ndarray:
        missing = [c for c in self.features if c not in frame.columns]
        if missing:
            raise DataError(f"{where}: feature columns {missing} are missing")
        x = frame[self.features].to_numpy(dtype=np.float64)
        mean = np.asarray(self.mean)
        x = np.where(np.isnan(x), mean, x)
        return ((x - mean) / np.asarray(self.std)).astype(np.float32)

    def labels_array(self, frame: pd.DataFrame, where: str = "input") -> np.ndarray:
        index = {c: i for i, c in enumerate(self.classes)}
        labels = frame[self.target].astype(str)
        unknown = sorted(set(labels) - index.keys())
        if unknown:
            raise DataError(f"{where}: target column {self.target!r} has labels {unknown} not seen at ingest")
        return np.array(labels.map(index), dtype=np.int64)

    def save(self, path: Path) -> None:
        write_json(path, asdict(self))

    @classmethod
    def load(cls, path: Path) -> Preprocessor:
        return cls(**read_json(path))
