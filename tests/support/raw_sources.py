"""Raw source files written by hand and read with read_source, for the tests of the readers (trainflow.data.sources):
the params, the reads in memory and spilled, the error a read raises, and the words its messages share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from trainflow.core.errors import DataError, UserError
from trainflow.data.sources import RawTable, read_source
from trainflow.params import DataParams

UTF8_HINT = "set data.encoding to the file's encoding (latin-1 or cp1252 for most Western exports)"
INDEX_NOTE = (
    ": dropped its first column: it has no header and holds a different integer in every row, the index pandas' "
    "to_csv writes by default (row labels, not data)"
)
HEADER_ROWS = (  # what a header's repeated names add about data.header_rows
    "; if the header spans several lines (names over names, as a spreadsheet exports them), set data.header_rows to "
    "their count: each column is then named by its cells on them joined by '.'"
)


def params(source: str = "x.csv", **kw: Any) -> DataParams:
    return DataParams.model_validate({"source": source, **kw})


def write(root: Path, rel: str, content: str | bytes) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def read(root: Path, source: str = "x.csv", **kw: Any) -> RawTable:
    return read_source(params(source, **kw), root)


def error(root: Path, source: str = "x.csv", spill_to: Path | None = None, **kw: Any) -> str:
    """The message of the DataError reading `source` raises: one line, a user's error (exit code 2)."""
    with pytest.raises(DataError) as info:
        read_source(params(source, **kw), root, spill_to)
    message = str(info.value)
    assert "\n" not in message, message
    assert isinstance(info.value, UserError) and info.value.exit_code == 2
    return message


def as_dict(frame: Any) -> dict[str, list[Any]]:
    """The frame's columns as lists, a missing value as None."""
    return {c: [None if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)) else v
                for v in frame[c].tolist()] for c in frame.columns}  # fmt: skip
