"""Schemas, a small training table and a fit, for the tests of preprocessing (trainflow.data.preprocess) and of the
streamed matrix built with it (trainflow.data.stream)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from trainflow.data.preprocess import Preprocessor
from trainflow.data.schema import Kind, Schema
from trainflow.params import FeatureParams


def schema(
    kinds: dict[str, Kind],
    task: str = "classification",
    classes: list[str] | None = None,
    text_column: str | None = None,
    image_column: str | None = None,
) -> Schema:
    features = [c for c in kinds if c not in (text_column, image_column)]
    return Schema(
        source="test",
        target="y",
        task=task,  # type: ignore[arg-type]
        features=features,
        kinds=kinds,
        classes=classes if classes is not None else (["a", "b"] if task == "classification" else []),
        n_rows=0,
        text_column=text_column,
        image_column=image_column,
    )


def fit(frame: pd.DataFrame, s: Schema, **params: object) -> Preprocessor:
    return Preprocessor.fit(frame, s, FeatureParams(**params))  # type: ignore[arg-type]


def message(exc: pytest.ExceptionInfo[BaseException]) -> str:
    return str(exc.value)


def tabular_train() -> pd.DataFrame:
    """Five rows, one feature of each tabular kind, each with a missing value."""
    return pd.DataFrame(
        {
            "num": [1.0, np.nan, 3.0, 4.0, np.inf],  # present 1, 3, 4: median 3; inf is missing
            "flag": pd.array([True, False, True, None, True], dtype="boolean"),  # 3 of 4 true: mode true
            "cat": pd.Series(["b", "a", "b", None, "c"], dtype="string"),  # b twice, a and c once: a wins the tie
            "y": ["a", "b", "a", "b", "a"],
        }
    )


TABULAR: dict[str, Kind] = {"num": "numeric", "flag": "boolean", "cat": "categorical"}
