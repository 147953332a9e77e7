"""The schema ingest infers once and writes beside the processed table; later stages read it instead of params."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from trainflow.io import read_json

Kind = Literal["numeric", "categorical", "boolean", "datetime", "text"]


@dataclass(frozen=True)
class Schema:
    """What ingest decided about the data; train, evaluate and predict follow it.

    The processed table holds `features`, then `text_column` (if any), then `target`, typed by kind: numeric as
    float64 (NaN = missing), boolean as pandas "boolean", categorical and text as strings (None = missing), datetime
    as datetime64[ns] (NaT = missing); the target as str labels (classification) or float64 (regression).
    """

    source: str
    target: str
    task: Literal["classification", "regression"]
    features: list[str]  # tabular feature columns, in order (the text column is not among them)
    kinds: dict[str, Kind]  # feature (and text column) -> kind
    classes: list[str]  # classification labels in index order (class i is classes[i]); [] for regression
    n_rows: int
    text_column: str | None = None
    dropped: dict[str, int] = field(default_factory=dict)  # rows dropped at ingest, by reason

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def read(cls, path: Path) -> Schema:
        return cls(**read_json(path))
