"""infer_schema (trainflow.data.validate) on a table given by hand: a stand-in for the RawTable read from
data/raw/f.csv, the data params, the ingest and the error it raises, and one column typed alone."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from trainflow.core.errors import DataError
from trainflow.data import validate as v
from trainflow.data.schema import Schema
from trainflow.params import DataParams

SRC = "data/raw/f.csv"


class T:
    """Stand-in for RawTable: row r of the frame is line r + 2 of f.csv; extra attributes (delimiter, image_column)
    as given."""

    def __init__(self, frame: Any, **extra: Any) -> None:
        self.frame, self.source = frame, SRC
        for k, val in extra.items():
            setattr(self, k, val)

    def where(self, row: int, column: str | None = None) -> str:
        return f"f.csv, line {row + 2}" + (f", column {column!r}" if column is not None else "")


def P(**params: Any) -> DataParams:
    params.setdefault("target", "y")
    return DataParams(**params)


def ingest(frame: Any, previous: Schema | None = None, table: dict[str, Any] | None = None, **params: Any) -> Any:
    return v.infer_schema(T(pd.DataFrame(frame), **(table or {})), P(**params), previous)


def fails(frame: Any, previous: Schema | None = None, table: dict[str, Any] | None = None, **params: Any) -> str:
    with pytest.raises(DataError) as info:
        ingest(frame, previous, table, **params)
    return str(info.value)


def col(frame: Any, name: str = "c", **params: Any) -> v._Column:
    """_column of one column of `frame` (a dict of columns or a frame)."""
    f = pd.DataFrame(frame)
    return v._column(T(f), P(**params), name)
