"""The schema ingest infers once and writes beside the processed table (later stages read it instead of params), and
how trainflow writes its tables (`parquet_options`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from trainflow.core.io import read_json

Kind = Literal["numeric", "categorical", "boolean", "datetime", "text", "image"]
# Spellings of a missing value in text: pandas' defaults plus "?" (UCI-style exports). Ingest reads them as missing,
# and preprocessing does too, so a table a user reads with pandas scores as ingest saw it.
PATH_SUFFIX = "_path"  # an image column `image` keeps its files' paths in `image_path` (carried, for messages)
NA_VALUES: list[str] = ["", "NA", "N/A", "n/a", "NaN", "nan", "NULL", "null", "None", "none", "#N/A", "?"]
# The columns `trainflow predict` adds to the rows it scores: `prediction`, and `proba_<class>` per class. An input that
# already holds one is refused there (it would be overwritten), so no model may need a column of such a name.
PREDICTION = "prediction"
PROBA_PREFIX = "proba_"
ROW_KEY = "__row_key__"  # processed table: each row's key, the hash of its raw values (the split uses and drops it)


def predict_writes(name: str) -> bool:
    """Whether `trainflow predict` writes a column of this name into its output."""
    return name == PREDICTION or name.startswith(PROBA_PREFIX)


@dataclass(frozen=True)
class Schema:
    """What ingest decided about the data; train, evaluate and predict follow it.

    The processed table holds `features`, then `text_column` or `image_column` (if any: an image column holds each
    image's encoded file bytes, PNG/JPEG/... as read), then `target`, typed by kind: numeric as
    float64 (NaN = missing), boolean as pandas "boolean", categorical and text as strings (None = missing), datetime
    as datetime64[ns] (NaT = missing); the target as str labels (classification) or float64 (regression). Then the
    `carried` columns as read, and the row keys (validate.ROW_KEY).
    """

    source: str
    target: str
    task: Literal["classification", "regression"]
    features: list[str]  # tabular feature columns, in order (the text column is not among them)
    kinds: dict[str, Kind]  # feature (and text or image column) -> kind
    classes: list[str]  # classification labels in index order (class i is classes[i]); [] for regression
    n_rows: int
    text_column: str | None = None
    dropped: dict[str, int] = field(default_factory=dict)  # rows dropped at ingest, by reason
    task_reason: str = ""  # why the task is what it is, in words ("target 'fare' holds non-integer numbers")
    carried: list[str] = field(default_factory=list)  # the other raw columns, as read (not features of this model)
    data_params: dict[str, Any] = field(default_factory=dict)  # the data params this schema follows from
    image_column: str | None = None  # the column of image bytes (its files' paths in <column>_path, carried)

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def read(cls, path: Path) -> Schema:
        return cls(**read_json(path))


def parquet_options(table: Any) -> dict[str, Any]:
    """How trainflow writes its tables: the keywords of pyarrow's ParquetWriter (and of DataFrame.to_parquet) for
    `table`, the pyarrow Schema written or the DataFrame. Dictionary encoding for every column but floats and the row
    key: a float column rarely repeats its values, and a row key (a 64-bit hash) never does, so the writer builds a
    dictionary per row group only to give it up: a slower write, and a file no smaller
    (benchmarks/history/2026-11-27-out-of-core-634aa0d.md)."""
    import pyarrow as pa

    if isinstance(table, pa.Schema):
        plain = {f.name: pa.types.is_floating(f.type) for f in table}
    else:
        plain = {str(c): t.kind == "f" for c, t in table.dtypes.items()}
    return {"use_dictionary": [name for name, p in plain.items() if not p and name != ROW_KEY]}
