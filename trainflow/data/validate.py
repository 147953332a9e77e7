"""Ingest's checks: decide the schema once from the raw table, and type the table by it.

`infer_schema(table, d, previous)` returns the `Schema` and the cleaned table (features, then the text column, then
the target, typed as `Schema`'s docstring says). Every problem the user can fix raises DataError with one line that
names the file, line and column (via `table.where`) and what to change. The success path is vectorised pandas/numpy:
per-value Python runs only over a column's distinct values or to build an error message.

Every check reads one whole column at a time, so a source bigger than memory (`spill.SpilledFrame`) goes through the
same code: each typed column is written to a spill as soon as it is made (a numeric column typed as read is linked to
the raw spill instead, `ColumnSpill.link`), and the table comes back as a `SpilledTable` that writes the same Parquet
file as the in-memory frame.
"""

from __future__ import annotations

import contextlib
import json
import math
import shlex
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import pandas as pd
import pyarrow as pa
import yaml
from pandas.api.types import (
    infer_dtype,
    is_bool_dtype,
    is_datetime64_any_dtype,
    is_numeric_dtype,
    is_object_dtype,
)

from trainflow.core.errors import DataError
from trainflow.data.schema import ROW_KEY, Kind, Schema, predict_writes
from trainflow.data.spill import ColumnSpill, SpilledFrame, ahead, row_hashes
from trainflow.params import DataParams

Task = Literal["classification", "regression"]

# A string column is numeric (and its other values are typos) when at least this share of its values are numbers;
# the same rule makes a column of ISO dates with a few stray values a datetime column with errors.
TYPED_SHARE = 0.95
# task auto (see `auto_task`): integer targets are classes with at most this many distinct values ...
CLASSES_MAX_DISTINCT = 20
# ... and at least this many rows per distinct value on average;
CLASSES_MIN_ROWS = 10
# integer codes 0..K-1 or 1..K (every value present) are classes up to this K.
INT_CODED_MAX = 100
# A classification target (task auto) whose classes are mostly one row each is a number read as labels: an error.
SINGLETON_CLASSES_MAX = 0.5
# An id-like feature (see `_id_like`) is warned of in tables of at least this many rows.
ID_MIN_ROWS = 20
BOOL_WORDS = {"true": True, "false": False, "yes": True, "no": False}
ISO_DATE = r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}(?::?\d{2})?)?)?"
ISO_TZ = r"(?:Z|[+-]\d{2}(?::?\d{2})?)$"
MISSING_KIND = "entirely missing"  # internal kind of a column with no values (an error unless it is not used)


class Table(Protocol):
    """What infer_schema reads of trainflow.data.sources.RawTable."""

    @property
    def frame(self) -> pd.DataFrame: ...

    @property
    def source(self) -> str: ...

    def where(self, row: int, column: str | None = None) -> str: ...

    # the column of image bytes the reader made (RawTable.image_column); fakes without it have no images


@dataclass
class _Column:
    name: str
    kind: str  # a Kind, or MISSING_KIND
    # np.ndarray or pandas ExtensionArray, one value per raw row (None once spilled: `get`); with `codes`, the
    # distinct values (str) that the codes index
    values: Any
    problem: DataError | None = None  # raised after the drift check, so drift is reported first
    distinct: int | None = None  # categorical: how many distinct values (one per row: an id)
    id_like: str | None = None  # a feature: why it looks like a row id (`_id_like`)
    store: ColumnSpill | None = None  # where the values are once spilled
    codes: np.ndarray | None = None  # categorical: each row's index into `values` (-1: missing)
    raw: Any = None  # the frame label of the raw column whose values, as float64, these are

    def spill(self, store: ColumnSpill) -> None:
        """Write the values to `store` and let go of them (a table bigger than memory: one column at a time). A
        numeric column that is its raw column as float64 is not written: the store reads the raw spill again."""
        if self.codes is not None:
            store.put_coded(self.name, self.codes, list(self.values))
        elif self.raw is not None and store.linkable(self.raw):
            store.link(self.name, self.raw, self.values)
        else:
            store.put(self.name, _series(self.values))
        self.values, self.codes, self.store = None, None, store

    def get(self) -> Any:
        """The values, read back from the spill when they are there (the same array type, dtype and values)."""
        if self.store is None:
            return self.values if self.codes is None else _per_row(self.values, None, self.codes)
        s = self.store.series(self.name)
        if self.kind == "boolean":
            return pd.array(s, dtype="boolean")
        if self.kind in ("categorical", "text", "image", MISSING_KIND) and not is_numeric_dtype(s.dtype):
            return s.to_numpy(dtype=object, na_value=None)
        return s.to_numpy()


@dataclass
class _Target:
    task: Task
    values: Any  # float64, one per raw row (regression; classification: None, the labels by `codes`: `per_row`)
    classes: list[str] = field(default_factory=list)
    unseen: np.ndarray | None = None  # rows whose label the previous schema does not know
    codes: np.ndarray | None = None  # classification: index into `labels` per row
    labels: list[str] = field(default_factory=list)  # classification: the distinct labels, codes index them
    reason: str = ""  # why the task is what it is
    missing: np.ndarray | None = None  # rows without a target value, to drop (data.missing_target: drop)

    def per_row(self) -> Any:
        """The value of each raw row: its number, or its label (None where missing)."""
        if self.values is not None:
            return self.values
        assert self.codes is not None
        return _per_row(np.asarray(self.labels, dtype=object), None, self.codes)


def infer_schema(
    table: Table, d: DataParams, previous: Schema | None = None
) -> tuple[Schema, pd.DataFrame | SpilledTable]:
    """The schema of `table` under `d`, checked against `previous` (the schema the current model was trained on), and
    the table typed by it with rows dropped as `d` says. Raises DataError naming file, line and column.

    A table read a column at a time (`spill.SpilledFrame`) is typed a column at a time by the same code, each typed
    column written to a spill beside it, and returned as a `SpilledTable` that writes the same Parquet file."""
    frame = table.frame
    store = ColumnSpill(frame.folder / "typed", frame.batch_rows, frame) if isinstance(frame, SpilledFrame) else None
    columns = _check_columns(table, d)
    image: str | None = getattr(table, "image_column", None)
    features = _features(table, d, columns, image)
    _check_not_written_by_predict(table, d, features, image)
    n = len(frame)
    cols = []
    for c in features:
        col = _column(table, d, columns[c])
        col.id_like = _id_like(col, n) if col.problem is None else None
        cols.append(col)
        if store is not None:
            col.spill(store)
    if d.text_column is not None:
        cols.append(_text(table, d.text_column, columns[d.text_column]))
    if store is not None:
        for col in cols[len(features) :]:
            col.spill(store)
    if image is not None:  # the reader checked every image: each is a decodable file's bytes
        if isinstance(frame, SpilledFrame) and store is not None:  # copied a chunk at a time, never read whole
            store.put_chunks(image, (block[columns[image]] for block in frame.row_blocks([columns[image]])))
            cols.append(_Column(image, "image", None, store=store))
        else:
            cols.append(_Column(image, "image", frame[columns[image]].to_numpy(dtype=object)))
    kinds = {c.name: c.kind for c in cols}
    if previous is not None:
        _check_drift(table, d, previous, features, kinds, columns)
    for col in cols:
        if col.problem is not None:
            raise col.problem
    _warn_of_ids(d, [c for c in cols if c.name in features])
    target = _target(table, d, columns[d.target], previous)

    keep: np.ndarray | None = None  # None = every row
    dropped: dict[str, int] = {}
    if target.missing is not None:
        keep = ~target.missing
        dropped["missing_target"] = int(target.missing.sum())
    if target.unseen is not None:
        keep = ~target.unseen if keep is None else keep & ~target.unseen
        dropped["unseen_labels"] = int(target.unseen.sum())
    if d.missing != "impute":
        keep = _missing(table, d, cols, keep, dropped)

    # The other columns travel along as read (a model trained on them earlier reads them with its own
    # preprocessing), and every row gets the key of its raw values, which no typing or column choice changes.
    carried = [c for c in columns if c not in {*(c.name for c in cols), d.target}]
    out: pd.DataFrame | SpilledTable
    if store is None:
        # no copies: float64 columns of the raw table are shared, object arrays stay object (pandas would make them
        # "str")
        data = {c.name: _series(c.get()) for c in cols}
        data[d.target] = _series(target.per_row())
        out = pd.DataFrame(data, copy=False)
        if d.duplicates != "keep":
            keep = _duplicates(table, d, _FrameColumns(out), keep, dropped)
        out = out.assign(**{c: _carried(frame[columns[c]]) for c in carried}, **{ROW_KEY: raw_row_keys(frame)})
        if keep is not None and not keep.all():
            out = out[keep].reset_index(drop=True)
        n_rows = len(out)
    else:
        if target.codes is not None:
            store.put_coded(d.target, target.codes, target.labels)
        else:
            store.put(d.target, _series(target.values))
        target.values = None  # in the spill now; what follows needs only its codes
        if d.duplicates != "keep":
            keep = _duplicates(table, d, _SpillColumns(store, [*(c.name for c in cols), d.target]), keep, dropped)
        for c in carried:
            store.put(c, _carried(frame[columns[c]]))
        out = SpilledTable(store, [*(c.name for c in cols), d.target, *carried], keep, frame)
        n_rows = n if keep is None else int(keep.sum())
    if n_rows == 0:
        reasons = ", ".join(f"{k}: {v}" for k, v in dropped.items())
        raise DataError(
            f"data.source: {table.source}: no rows left after dropping {n} of {n} ({reasons}); "
            "fix the data or set data.missing/data.duplicates/data.unseen_labels to keep them"
        )
    classes = target.classes
    if target.task == "classification" and not classes:
        classes = _classes(table, d, target, keep)
    return (
        Schema(
            source=table.source,
            target=d.target,
            task=target.task,
            features=features,
            kinds={c.name: _kind(c.kind) for c in cols},
            classes=classes,
            n_rows=n_rows,
            text_column=d.text_column,
            dropped=dropped,
            task_reason=target.reason,
            carried=carried,
            data_params=schema_params(d),
            image_column=image,
        ),
        out,
    )


@dataclass
class SpilledTable:
    """The typed table of a spilled ingest: its columns in `store`, the rows where `keep` (all when None), and last
    the row keys (ROW_KEY), hashed from the raw rows in `raw` as the table is written."""

    store: ColumnSpill
    names: list[str]
    keep: np.ndarray | None
    raw: SpilledFrame

    def to_parquet(self, dest: Path) -> None:
        """The Parquet file pd.DataFrame.to_parquet(dest, index=False) writes of the in-memory table.

        The row keys are hashed a block of raw rows at a time in a thread (`spill.ahead`) while the rows before them
        are encoded (the Parquet writer lets go of the GIL), so the two share the machine's cores; the keys are never
        held whole (8 bytes a row). Most of the hashing's time is hidden behind the write
        (benchmarks/history/2026-11-27-out-of-core-b58515e.md)."""
        try:
            self._write(dest, text=False)
        except _Unhashable:  # as in memory: every row hashed as text when one holds an unhashable value
            self._write(dest, text=True)

    def _write(self, dest: Path, text: bool) -> None:
        with contextlib.closing(ahead(raw_row_key_blocks(self.raw, text))) as keys:
            self.store.write_table(dest, self.names, self.keep, keys)


class _FrameColumns:
    """The columns the duplicate check reads: of a frame in memory ..."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame, self.names = frame, list(frame.columns)

    def hashes(self, name: str) -> np.ndarray:
        return pd.util.hash_pandas_object(self.frame[name], index=False).to_numpy(dtype=np.uint64)

    def take(self, rows: np.ndarray) -> pd.DataFrame:
        return self.frame.take(rows)


class _SpillColumns:
    """... or of a spill, read a column at a time."""

    def __init__(self, store: ColumnSpill, names: list[str]) -> None:
        self.store, self.names = store, names

    def hashes(self, name: str) -> np.ndarray:
        return self.store.hashes(name)  # a batch at a time: a column of images is never read whole

    def take(self, rows: np.ndarray) -> pd.DataFrame:
        return self.store.take(rows, self.names)


def schema_params(d: DataParams) -> dict[str, Any]:
    """The data params a schema follows from: a previous schema is the baseline for drift only under the same ones.
    (What happens to rows — missing values, duplicates, unseen labels — does not change the schema, nor does where
    the rows are held.)"""
    return d.model_dump(exclude={"missing", "missing_target", "duplicates", "unseen_labels", "memory_budget_mb"})


def raw_row_keys(frame: pd.DataFrame) -> np.ndarray:
    """A 64-bit hash (uint64) of each raw row, all columns as read: the row's identity for the split, whatever
    columns are features, which is the target, how they are typed."""
    try:
        return _row_keys(frame)
    except TypeError:  # unhashable values (lists or objects from JSON): hash those columns as text
        return _row_keys(_as_text(frame))


class _Unhashable(Exception):
    """A block of raw rows holds a value that cannot be hashed (a list or object from JSON)."""


def raw_row_key_blocks(frame: SpilledFrame, text: bool) -> Iterator[np.ndarray]:
    """raw_row_keys of a spilled frame, a block of rows at a time (a row's hash is its values' alone). `text`: every
    block's columns hashed as text, which raw_row_keys does when a value is unhashable; without it, such a block
    raises _Unhashable."""
    for block in frame.row_blocks():
        try:
            yield _row_keys(_as_text(block) if text else block)
        except TypeError:
            if text:
                raise
            raise _Unhashable from None


def _row_keys(frame: pd.DataFrame) -> np.ndarray:
    return pd.util.hash_pandas_object(frame, index=False).to_numpy(dtype=np.uint64)


def _as_text(frame: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({c: frame[c].astype(str) if is_object_dtype(frame[c].dtype) else frame[c] for c in frame})


def _carried(s: pd.Series) -> pd.Series:
    """An unused column as read; values of mixed types (from JSON) as text, so the table can be written as Parquet."""
    if is_object_dtype(s.dtype) and infer_dtype(s, skipna=True) not in ("string", "empty"):
        return s.astype("string")
    return s


def _series(values: Any) -> pd.Series:
    dtype = object if isinstance(values, np.ndarray) and values.dtype == object else None
    return pd.Series(values, dtype=dtype, copy=False)


# --- columns and params ----------------------------------------------------------------------------------------------


def _names(names: Iterable[object], limit: int = 30) -> str:
    names = [str(c) for c in names]
    shown = ", ".join(repr(c) for c in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _check_columns(table: Table, d: DataParams) -> dict[str, Any]:
    """Map column name -> frame label, after checking the params' column names against the table."""
    frame, src = table.frame, f"data.source: {table.source}"
    columns = {str(c): c for c in frame.columns}
    if len(columns) < frame.shape[1]:
        seen: set[str] = set()
        twice = [c for c in map(str, frame.columns) if c in seen or seen.add(c)]  # type: ignore[func-returns-value]
        raise DataError(f"{src}: column names appear more than once: {_names(dict.fromkeys(twice))}; rename them")
    if len(frame) == 0:
        raise DataError(f"{src}: the data has no rows; point data.source at a file with data")
    available = f"the columns are: {_names(columns)}"
    if d.target not in columns:
        if len(columns) == 1 and (hint := _delimiter_hint(next(iter(columns)), getattr(table, "delimiter", None))):
            raise DataError(f"{src}: data.target {d.target!r} is not a column; {hint}")
        raise DataError(
            f"{src}: data.target {d.target!r} is not a column; {available}. Set data.target to one of them "
            "(-S data.target=<column>)"
        )
    problems = []
    for key, names in (("data.features", d.features or []), ("data.exclude", d.exclude)):
        unknown = [c for c in names if c not in columns]
        if unknown:
            # Often an earlier run's -S, kept in params.yaml, meeting another data set: the setting for this one.
            kept = [c for c in names if c in columns]
            value = _yaml_list(kept) if kept or key == "data.exclude" else "null"
            problems.append(
                f"{key} names columns that do not exist: {_names(unknown)} (for this data: -S '{key}={value}')"
            )
    if d.text_column is not None and d.text_column not in columns:
        problems.append(f"data.text_column {d.text_column!r} is not a column (for this data: -S data.text_column=null)")
    if problems:
        raise DataError(f"{src}: {'; '.join(problems)}; {available}")
    if d.features is not None:
        twice = [c for c in dict.fromkeys(d.features) if d.features.count(c) > 1]
        if twice:
            raise DataError(f"{src}: data.features lists {_names(twice)} more than once; list each column once")
    if d.text_column is not None and d.text_column in (d.features or []):
        raise DataError(
            f"{src}: data.features lists the text column {d.text_column!r}; the text column is modelled on its own, "
            "remove it from data.features"
        )
    if d.text_column is not None and d.text_column in d.exclude:
        raise DataError(
            f"{src}: data.exclude lists the text column {d.text_column!r}; remove it there or unset data.text_column"
        )
    return columns


# Delimiters a header read as one column may be split by instead.
OTHER_DELIMITERS = (";", "\t", "|", ",")


def _delimiter_hint(header: str, delimiter: str | None) -> str | None:
    """The header was read as one column: when it holds another delimiter, the data.delimiter to set."""
    counts = {c: header.count(c) for c in OTHER_DELIMITERS if c != delimiter}
    found = max(counts, key=lambda c: counts[c], default=None)
    if found is None or counts[found] == 0:
        return None
    read_by = f" (delimiter {delimiter!r})" if delimiter else ""
    # The value as quoted YAML (JSON): `,` and `|` alone are not plain YAML strings, "\t" is a tab.
    return (
        f"the whole header {header!r} was read as one column{read_by}, but it holds {counts[found]} {found!r}: the "
        f"file is delimited by {found!r}. Set data.delimiter: -S 'data.delimiter={json.dumps(found)}'"
    )


def _features(table: Table, d: DataParams, columns: dict[str, Any], image: str | None = None) -> list[str]:
    if image is not None:  # an image is modelled on its own (as a text is, but no table features beside it)
        if d.features is not None or d.text_column is not None:
            raise DataError(
                f"data.source: {table.source}: with images (column {image!r}) the other columns are not used; "
                "remove data.features and data.text_column"
            )
        return []
    if d.features is not None:
        features = list(d.features)
    else:  # every column but the target, the text column and data.exclude
        skip = {d.target, d.text_column, *d.exclude}
        features = [c for c in columns if c not in skip]
    if not features and d.text_column is None:
        raise DataError(
            f"data.source: {table.source}: no feature columns are left after data.features/data.exclude "
            f"(the columns are: {_names(columns)}); name some in data.features or shorten data.exclude"
        )
    return features


def _check_not_written_by_predict(table: Table, d: DataParams, features: list[str], image: str | None) -> None:
    """A column the model reads may not bear a name `trainflow predict` writes (`prediction`, `proba_<class>`):
    predict refuses an input holding one, so a model that needs it could never score a row."""
    taken = [c for c in features if predict_writes(c)]
    if taken:
        them = "it" if len(taken) == 1 else "them"
        kept = [c for c in d.features if c not in taken] if d.features is not None else None
        if kept == [] and d.text_column is None:  # no feature would be left
            fix = f"rename {them} in the file and in data.features"
        else:
            setting = (
                "data.exclude=" + _yaml_list([*d.exclude, *taken])
                if kept is None
                else "data.features=" + _yaml_list(kept)
            )
            fix = f"leave {them} out: -S {shlex.quote(setting)}, or rename {them} in the file"
    elif d.text_column is not None and predict_writes(d.text_column):
        taken, fix = [d.text_column], "rename it in the file and set data.text_column to the new name"
    elif image is not None and predict_writes(image):
        taken, fix = [image], "rename it in the file and set data.image_column to the new name"
    else:
        return
    raise DataError(
        f"data.source: {table.source}: the model would read column(s) {_names(taken)}, but `trainflow predict` writes "
        f"'prediction' and 'proba_<class>' columns into its output and refuses input that holds one, so no row could "
        f"be scored; {fix}"
    )


ID_BLOCK = 1 << 20  # rows per block of _id_like's passes over a column


def _id_like(col: _Column, n: int) -> str | None:
    """Why a feature column looks like a row id rather than a measurement, or None: a different value in every row
    (integers or text; a float measurement differs in every row too, so floats are not ids), or integers that follow
    the row order (a row counter, an auto-increment key). An id lets a model learn the row order instead of the data,
    and with rows sorted by the label, the label itself."""
    if n < ID_MIN_ROWS:
        return None  # a different value in each of a few rows is chance
    if col.kind == "categorical":
        return "a different value in every row" if col.distinct == n else None
    if col.kind != "numeric":
        return None
    values = col.values
    head = values[:1024]  # most measurements show a fraction or a gap early: the full-column passes below are skipped
    if np.isnan(head).any() or (head != np.round(head)).any():
        return None
    # The full-column passes, a block at a time (a block's steps include the one from the block before): no copy of
    # the column, which is a few hundred MB at 50M rows.
    rising = falling = strictly_rising = strictly_falling = True
    for lo in range(0, len(values), ID_BLOCK):
        block = values[max(0, lo - 1) : lo + ID_BLOCK]
        if np.isnan(block).any() or (block != np.round(block)).any():
            return None
        steps = np.diff(block)
        rising, falling = rising and bool((steps >= 0).all()), falling and bool((steps <= 0).all())
        strictly_rising = strictly_rising and rising and bool((steps > 0).all())
        strictly_falling = strictly_falling and falling and bool((steps < 0).all())
    if strictly_rising or strictly_falling:
        return "a different integer in every row, in row order"
    distinct = len(pd.unique(values))  # one hash pass, for integer columns only
    if distinct == n:
        return "a different integer in every row"
    if (rising or falling) and distinct * 2 >= n:
        return f"integers that {'rise' if rising else 'fall'} with the row order"
    return None


def _warn_of_ids(d: DataParams, cols: list[_Column]) -> None:
    """A warning, not an error: a unique code can be a real feature (a zip code), which only the user knows."""
    found = {c.name: c.id_like for c in cols if c.id_like}
    if not found:
        return
    if d.features is not None:
        setting = "data.features=" + _yaml_list([c for c in d.features if c not in found])
    else:
        setting = "data.exclude=" + _yaml_list([*d.exclude, *found])
    listed = ", ".join(f"{name!r} ({why})" for name, why in found.items())
    print(
        f"ingest: warning: features that look like ids, not measurements: {listed}. A model memorises rows by an "
        "id instead of learning from the data (and where rows are sorted by the label, an id gives it away). If they "
        f"are ids, leave them out: -S {shlex.quote(setting)}",
        file=sys.stderr,
    )


def _yaml_list(names: list[str]) -> str:
    """`[a, b]` as a flow list in YAML, a name quoted where YAML would read it as something else."""

    def plain(name: str) -> bool:
        try:
            return bool(yaml.safe_load(f"[{name}]") == [name])
        except yaml.YAMLError:
            return False

    return "[" + ", ".join(n if plain(n) else json.dumps(n) for n in names) + "]"  # JSON strings are YAML


def _hint(d: DataParams, column: str) -> str:
    """How to stop using a feature column."""
    if column == d.text_column:
        return "or set data.text_column to another column"
    if d.features is not None:
        return f"or remove {column!r} from data.features"
    return f"or add {column!r} to data.exclude"


def _at(table: Table, row: int, column: str | None, text: str) -> DataError:
    return DataError(f"data.source: {table.where(int(row), column)}: {text}")


def _pct(share: float) -> int:
    return min(99, math.floor(share * 100))


def _kind(kind: str) -> Kind:
    assert kind in ("numeric", "categorical", "boolean", "datetime", "text", "image"), kind
    return kind  # type: ignore[return-value]


# --- features --------------------------------------------------------------------------------------------------------


def _column(table: Table, d: DataParams, label: Any) -> _Column:
    """Infer a feature column's kind from its values and convert it; a fixable problem is returned, not raised."""
    name = str(label)
    s = table.frame[label]
    dtype = s.dtype
    if is_object_dtype(dtype):
        inferred = infer_dtype(s, skipna=True)
        if inferred == "empty":
            return _all_missing(table, d, name, s)
        if inferred == "boolean":
            return _Column(name, "boolean", pd.array(s, dtype="boolean"))
        if inferred in ("integer", "floating", "mixed-integer-float", "decimal"):
            return _numeric(table, d, name, pd.to_numeric(s).to_numpy(dtype=np.float64, na_value=np.nan))
        if inferred in ("datetime", "datetime64", "date"):
            try:
                return _datetime(table, d, name, pd.Series(pd.to_datetime(s, utc=True)))
            except (ValueError, TypeError):
                pass  # mixed values: treat them as strings
        return _strings(table, d, name, s)
    if is_bool_dtype(dtype):
        col = _Column(name, "boolean", s.array if dtype == "boolean" else pd.array(s, dtype="boolean"))
    elif is_numeric_dtype(dtype):
        values = s.to_numpy() if dtype == np.float64 else s.to_numpy(dtype=np.float64, na_value=np.nan)
        col = _numeric(table, d, name, values)
        col.raw = label  # values as read, as float64 (numeric, or entirely missing)
        return col
    elif is_datetime64_any_dtype(dtype):
        return _datetime(table, d, name, s)
    else:  # str, categorical and anything else: decide from the values as text
        return _strings(table, d, name, s)
    if pd.isna(col.values).all():
        return _all_missing(table, d, name, s)
    return col


def _all_missing(table: Table, d: DataParams, name: str, s: pd.Series) -> _Column:
    problem = DataError(
        f"data.source: {table.source}, column {name!r}: every value is missing; fill it in {_hint(d, name)}"
    )
    return _Column(name, MISSING_KIND, s.to_numpy(), problem)


def _numeric(table: Table, d: DataParams, name: str, values: np.ndarray, problem: DataError | None = None) -> _Column:
    nan = np.isnan(values)
    if nan.all():
        return _all_missing(table, d, name, pd.Series(values))
    return _Column(name, "numeric", values, problem or not_finite(table, name, values, _hint(d, name)))


def not_finite(table: Table, name: str, values: np.ndarray, fix: str) -> DataError | None:
    """The error for the first infinity among a numeric column's float64 `values`, at its line of the file (`fix`:
    what else the user may do than fix the value), or None. Ingest refuses them for training, and `trainflow predict`
    for scoring: preprocessing would take one for a missing value."""
    infinite = np.isinf(values)
    if not infinite.any():
        return None
    row = int(np.argmax(infinite))
    return _at(table, row, name, f"{values[row]} is not a finite number; fix the value {fix}")


def _datetime(table: Table, d: DataParams, name: str, s: pd.Series) -> _Column:
    values, out = _to_ns(s)
    if out is not None:
        row = int(np.argmax(out))
        return _Column(name, "datetime", values, _out_of_range(table, d, name, row, s.iloc[row]))
    if np.isnat(values).all():
        return _all_missing(table, d, name, s)
    return _Column(name, "datetime", values)


def _out_of_range(table: Table, d: DataParams, name: str, row: int, value: object) -> DataError:
    return _at(table, row, name, f"{value} is out of the supported date range (1677-2262); fix it {_hint(d, name)}")


def _to_ns(s: pd.Series) -> tuple[np.ndarray, np.ndarray | None]:
    """datetime64[ns] values (timezones converted to UTC, then dropped), and which are out of its range (now NaT)."""
    if getattr(s.dt, "tz", None) is not None:
        s = s.dt.tz_convert("UTC").dt.tz_localize(None)
    try:
        return s.astype("datetime64[ns]").to_numpy(dtype="datetime64[ns]"), None
    except (pd.errors.OutOfBoundsDatetime, OverflowError):
        out = ((s < pd.Timestamp.min) | (s > pd.Timestamp.max)).to_numpy(dtype=bool, na_value=False)
        return s.mask(out).astype("datetime64[ns]").to_numpy(dtype="datetime64[ns]"), out


def _factorize(table: Table, name: str, s: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Codes per row (-1 = missing; int32 where that holds every code) and the distinct values as an object array.
    Text held by Arrow is encoded by Arrow (pd.factorize's codes in order of first appearance, at half the memory:
    4 bytes a row where pandas' hash table and codes take 16)."""
    arrow = getattr(s.array, "_pa_array", None)
    if isinstance(arrow, pa.ChunkedArray) and (pa.types.is_string(arrow.type) or pa.types.is_large_string(arrow.type)):
        encoded = arrow.dictionary_encode()  # one dictionary, shared by every chunk
        dictionary = (
            encoded.chunk(encoded.num_chunks - 1).dictionary if encoded.num_chunks else pa.array([], arrow.type)
        )
        if all(chunk.dictionary.equals(dictionary) for chunk in encoded.chunks):
            indices, lo = np.empty(len(arrow), dtype=np.int32), 0
            for chunk in encoded.chunks:
                indices[lo : lo + len(chunk)] = chunk.indices.fill_null(-1).to_numpy(zero_copy_only=False)
                lo += len(chunk)
            return indices, np.asarray(dictionary.to_pylist(), dtype=object)
    try:
        codes, uniques = pd.factorize(s)
    except TypeError:  # unhashable values: lists or objects from JSON
        row = int(np.argmax(s.map(lambda v: isinstance(v, list | dict | set)).to_numpy(dtype=bool)))
        raise _at(
            table, row, name, f"{s.iloc[row]!r} is a nested value (a list or object); flatten it into columns"
        ) from None
    codes = np.asarray(codes)
    return codes.astype(np.int32) if len(uniques) < 2**31 else codes, np.asarray(uniques, dtype=object)


def _per_row(per_value: Any, fill: Any, codes: np.ndarray) -> np.ndarray:
    """Values per row from values per distinct value; code -1 (missing) gets `fill`."""
    per_value = np.asarray(per_value)
    dtype = object if fill is None else per_value.dtype
    return np.concatenate([per_value.astype(dtype, copy=False), np.array([fill], dtype=dtype)])[codes]


def _row_share(ok: np.ndarray, codes: np.ndarray) -> float:
    """The share of non-missing rows whose distinct value is `ok`."""
    counts = np.bincount(codes[codes >= 0], minlength=len(ok))
    return float(counts[ok].sum() / max(1, counts.sum()))


def _first_row(bad: np.ndarray, codes: np.ndarray) -> int:
    """The first row whose distinct value is `bad`."""
    return int(np.argmax(_per_row(bad, False, codes)))


def _strings(table: Table, d: DataParams, name: str, s: pd.Series) -> _Column:
    codes, raw = _factorize(table, name, s)
    if len(raw) == 0:
        return _all_missing(table, d, name, s)
    text = pd.Series(raw, dtype=object).astype(str)
    stripped = text.str.strip()
    number = pd.to_numeric(stripped, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    is_number = ~np.isnan(number)
    if is_number.all():
        return _numeric(table, d, name, _per_row(number, np.nan, codes))
    if is_number.any() and (share := _row_share(is_number, codes)) >= TYPED_SHARE:
        row = _first_row(~is_number, codes)
        problem = _at(
            table,
            row,
            name,
            f"{raw[codes[row]]!r} is not a number (the column is numeric in {_pct(share)}% of rows); "
            f"fix the value {_hint(d, name)}",
        )
        return _numeric(table, d, name, _per_row(number, np.nan, codes), problem)
    lower = stripped.str.lower()
    if lower.isin(list(BOOL_WORDS)).all():
        truth = lower.map(BOOL_WORDS).to_numpy(dtype=bool)
        return _Column(name, "boolean", pd.arrays.BooleanArray(_per_row(truth, False, codes), codes < 0))
    iso = stripped.str.fullmatch(ISO_DATE).to_numpy(dtype=bool, na_value=False)
    if iso.any() and (share := _row_share(iso, codes)) >= TYPED_SHARE:
        utc = bool(stripped[iso].str.contains(ISO_TZ).any())
        parsed = pd.to_datetime(stripped.where(iso), format="ISO8601", errors="coerce", utc=utc)
        dates, out = _to_ns(pd.Series(parsed))
        nat = np.datetime64("NaT", "ns")
        ok = iso & ~np.isnat(dates)
        if ok.all():
            return _Column(name, "datetime", _per_row(dates, nat, codes))
        dated = ok if out is None else ok | out  # out-of-range dates are dates too, for the share
        share = _row_share(dated, codes)
        if share >= TYPED_SHARE:
            row = _first_row(~ok, codes)
            value = raw[codes[row]]
            if out is not None and out[codes[row]]:
                problem = _out_of_range(table, d, name, row, value)
            else:
                problem = _at(
                    table,
                    row,
                    name,
                    f"{value!r} is not an ISO date or timestamp like 2024-01-31 or 2024-01-31T12:00:00 "
                    f"(the column is dates in {_pct(share)}% of rows); fix the value {_hint(d, name)}",
                )
            return _Column(name, "datetime", _per_row(dates, nat, codes), problem)
    # categorical: distinct values that print the same (1 and "1" in JSON) are one category
    index, categories = pd.factorize(text)
    if len(categories) < len(raw):
        codes = _per_row(index.astype(codes.dtype), -1, codes)  # int32 where the codes are
    return _Column(name, "categorical", np.asarray(categories, dtype=object), distinct=len(categories), codes=codes)


def _text(table: Table, name: str, label: Any) -> _Column:
    s = table.frame[label]
    if is_object_dtype(s.dtype) and infer_dtype(s, skipna=True) == "string":
        values = s.to_numpy(dtype=object, na_value=None)  # the same str objects, NaN -> None
    else:
        values = s.astype("str").to_numpy(dtype=object, na_value=None)
    if s.isna().all():
        problem = DataError(
            f"data.source: {table.source}, column {name!r}: every value of the text column is missing; "
            "fill it in or set data.text_column to another column"
        )
        return _Column(name, MISSING_KIND, values, problem)
    return _Column(name, "text", values)


# --- schema drift ----------------------------------------------------------------------------------------------------


def _check_drift(
    table: Table, d: DataParams, previous: Schema, features: list[str], kinds: dict[str, str], columns: dict[str, Any]
) -> None:
    """The columns of the previous ingest against these (made under the same data params: ingest's caller's rule)."""
    drift: list[str] = []
    extra = [c for c in (previous.text_column, previous.image_column) if c]
    known = [*previous.features, *extra]
    for c in known:
        old = previous.kinds.get(c, "?")
        if c not in columns:
            drift.append(f"{c!r} ({old}) is missing")
        elif c in kinds and kinds[c] != old:
            drift.append(f"{c!r}: {old} -> {kinds[c]}")
    if d.features is None:
        drift += [f"{c!r} ({kinds[c]}) is new" for c in features if c not in known]
    if drift:
        only_new = all(change.endswith(" is new") for change in drift)  # then the old columns are all still there
        before = f"; or keep training on the columns of before: -S 'data.features=[{', '.join(known)}]'"
        raise DataError(
            f"data.source: {table.source}: the data changed since the last ingest under the same data params "
            f"({len(drift)} change{'s' if len(drift) != 1 else ''}: {'; '.join(drift)}). If the new data is right, "
            "accept its schema once with `trainflow stage ingest --accept-schema`, then rerun"
            + (before if only_new else "")
        )


# --- target ----------------------------------------------------------------------------------------------------------


def _num_label(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(float(v))


def auto_task(name: str, distinct: np.ndarray | None, n_rows: int, what: str) -> tuple[Task, str]:
    """data.task auto: the task for a target whose distinct values are `distinct` (numbers; None when they are not
    all numbers: `what` says what they are), and why, in words for the user.

    Numbers with a fraction are measurements: regression. Integers are classes when there are few of them for the
    rows (integer codes 0..K-1 or 1..K, or at most CLASSES_MAX_DISTINCT values with CLASSES_MIN_ROWS rows each on
    average), otherwise counts or amounts: regression. Everything else (text, booleans) is classification.
    """
    if distinct is None:
        return "classification", f"target {name!r} holds {what}"
    k = len(distinct)
    fractional = distinct[distinct != np.round(distinct)]
    if len(fractional):
        return "regression", f"target {name!r} holds numbers with fractions (e.g. {fractional[0]:g})"
    lo, hi = float(distinct.min()), float(distinct.max())
    if k <= INT_CODED_MAX and lo in (0.0, 1.0) and hi - lo + 1 == k:
        return "classification", f"target {name!r} holds the integer codes {lo:g}..{hi:g} ({k} classes)"
    if k <= CLASSES_MAX_DISTINCT and k * CLASSES_MIN_ROWS <= n_rows:
        return "classification", f"target {name!r} holds {k} distinct integers, few for {n_rows:,} rows"
    return "regression", f"target {name!r} holds {k:,} distinct integers, too many to be classes of {n_rows:,} rows"


def _missing_target_rows(s: pd.Series) -> np.ndarray:
    """Rows whose target value is missing: NA, or text that is empty or blank."""
    missing = s.isna().to_numpy(dtype=bool)
    if is_object_dtype(s.dtype) or pd.api.types.is_string_dtype(s.dtype):
        missing = missing | s.astype("string").str.strip().eq("").to_numpy(dtype=bool, na_value=False)
    return missing


def _without_missing(table: Table, d: DataParams, s: pd.Series) -> tuple[pd.Series, np.ndarray | None]:
    """The target column with its missing values filled by an existing value (those rows are dropped later), and
    which rows they are; or a DataError (data.missing_target: error)."""
    missing = _missing_target_rows(s)
    if not missing.any():
        return s, None
    count = int(missing.sum())
    if d.missing_target == "error" or missing.all():
        row = int(np.argmax(missing))
        rows = f"{count} row{'s' if count != 1 else ''}"
        fix = "fill in the label" if missing.all() else "fill in the labels, or set data.missing_target: drop"
        raise _at(table, row, d.target, f"the target value is missing ({rows} without one); {fix}")
    filled = s.copy()
    filled[missing] = s[~missing].iloc[0]  # an existing value: no new class, no new distinct number
    print(
        f"ingest: dropped {count} row{'s' if count != 1 else ''} without a target value {d.target!r} "
        "(data.missing_target: drop)",
        file=sys.stderr,
    )
    return filled, missing


def _target(table: Table, d: DataParams, label: Any, previous: Schema | None) -> _Target:
    """The target column typed for its task: data.task, else the previous ingest's (same data params), else inferred
    (`auto_task`). Missing values: an error, or rows to drop (data.missing_target)."""
    name = d.target
    s, missing_target = _without_missing(table, d, table.frame[label])
    dtype = s.dtype
    inferred = infer_dtype(s, skipna=True) if is_object_dtype(dtype) else ""
    boolean = is_bool_dtype(dtype) or inferred == "boolean"
    numeric = not boolean and (
        (not is_object_dtype(dtype) and is_numeric_dtype(dtype))
        or inferred in ("integer", "floating", "mixed-integer-float")
    )
    task: Task | None = None
    reason = ""
    if d.task != "auto":
        task, reason = d.task, f"data.task is {d.task}"
    elif previous is not None:  # the same source and data params: keep the decision appended rows could flip
        task, reason = previous.task, previous.task_reason or f"the previous ingest found {previous.task}"
    if numeric and task == "regression":  # no distinct values needed
        number = s.to_numpy() if dtype == np.float64 else pd.to_numeric(s).to_numpy(dtype=np.float64, na_value=np.nan)
        if np.isinf(number).any():
            row = int(np.argmax(np.isinf(number)))
            raise _at(table, row, name, f"the target {number[row]} is not a finite number; fix the value")
        return _regression(table, name, number, reason, missing_target)

    codes, raw = _factorize(table, name, s)
    per_value: np.ndarray | None = None  # the number each distinct value stands for, when they all are numbers
    not_number: str | None = None  # else why not, for a regression target
    labels: np.ndarray | None = None  # str per distinct value; for numbers made once the task is known
    what = "text labels"
    bad_row = 0
    if numeric:
        per_value = raw.astype(np.float64)
    else:
        text = pd.Series(raw, dtype=object).astype(str).str.strip()
        parsed = pd.to_numeric(text, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        labels = text.to_numpy(dtype=object)
        if boolean:
            labels = np.array([str(bool(v)) for v in raw], dtype=object)
            not_number = f"the target is boolean ({', '.join(sorted(set(labels)))})"
            what = "booleans"
        elif np.isfinite(parsed).all():  # numbers written as text: labelled as if read as numbers
            per_value, labels = parsed, None
        else:
            bad_row = _first_row(~np.isfinite(parsed), codes)
            not_number = f"{raw[codes[bad_row]]!r} is not a finite number"
    if per_value is not None and not np.isfinite(per_value).all():
        row = _first_row(~np.isfinite(per_value), codes)
        raise _at(table, row, name, f"the target {per_value[codes[row]]} is not a finite number; fix the value")

    if task is None:  # auto
        distinct = per_value if numeric else np.unique(per_value) if per_value is not None else None
        task, reason = auto_task(name, distinct, int((~missing_target).sum()) if missing_target is not None
                                 else len(s), what)  # fmt: skip
    if task == "regression":
        if per_value is None:
            raise _at(
                table,
                bad_row,
                name,
                f"{not_number}, but {reason}: a regression target must be numbers; fix the value, or set "
                "data.task: classification",
            )
        shared = numeric and dtype == np.float64 and missing_target is None  # the raw column as it is: no copy
        return _regression(table, name, s.to_numpy() if shared else _per_row(per_value, np.nan, codes), reason,
                           missing_target)  # fmt: skip

    if labels is None:  # numbers: integer-valued ones print as ints ("1", not "1.0")
        assert per_value is not None
        is_int = numeric and isinstance(dtype, np.dtype) and dtype.kind in "iu"
        labels = np.array([str(v) for v in raw] if is_int else [_num_label(v) for v in per_value], dtype=object)
    label_codes, label_uniques = pd.factorize(labels)  # distinct values that print the same are one class
    codes = _per_row(label_codes.astype(codes.dtype), -1, codes)  # int32 where the codes are: 4 bytes a row
    target = _Target("classification", None, codes=codes, labels=[str(v) for v in label_uniques], reason=reason,
                     missing=missing_target)  # fmt: skip
    if d.task == "auto" and previous is None:
        _check_not_numbers_as_labels(table, d, target, per_value is not None)
    if previous is not None and previous.task == "classification":
        _check_unseen(table, d, previous, target)
    return target


def _check_not_numbers_as_labels(table: Table, d: DataParams, target: _Target, numbers: bool) -> None:
    """task auto chose classification, but most classes have one row: the target is not a set of classes."""
    assert target.codes is not None
    kept = target.codes if target.missing is None else target.codes[~target.missing]
    counts = np.bincount(kept, minlength=len(target.labels))
    counts = counts[counts > 0]
    singletons = int((counts == 1).sum())
    if len(counts) < 10 or singletons <= SINGLETON_CLASSES_MAX * len(counts):
        return
    fix = (
        "it looks like a number to predict: set data.task: regression"
        if numbers
        else "check data.target (is it an id or a free-text column?), or set data.task: classification to train on "
        "it anyway"
    )
    raise DataError(
        f"data.source: {table.source}, column {d.target!r}: as classes, the target has {len(counts):,} of them and "
        f"{singletons:,} have a single row; {fix}"
    )


def _regression(table: Table, name: str, number: np.ndarray, reason: str, missing: np.ndarray | None) -> _Target:
    present = number if missing is None else number[~missing]
    if present.min() == present.max():
        raise DataError(
            f"data.source: {table.source}, column {name!r}: every target value is {present[0]:g}; there is nothing "
            "to learn, check data.target"
        )
    return _Target("regression", number, reason=reason, missing=missing)


def _check_unseen(table: Table, d: DataParams, previous: Schema, target: _Target) -> None:
    """New data cannot renumber classes: keep the previous order; labels it does not know are errors or dropped."""
    assert target.codes is not None
    known = set(previous.classes)
    unseen_label = np.array([lab not in known for lab in target.labels], dtype=bool)
    target.classes = list(previous.classes)
    if not unseen_label.any():
        return
    unseen = unseen_label[target.codes]
    names = _names(sorted(lab for lab, u in zip(target.labels, unseen_label) if u))
    count = int(unseen.sum())
    if d.unseen_labels == "error":
        row = int(np.argmax(unseen))
        raise _at(
            table,
            row,
            d.target,
            f"label {target.labels[target.codes[row]]!r} is not among the classes the current model was trained on "
            f"({_names(previous.classes)}); unseen labels {names} in {count} row{'s' if count != 1 else ''}. "
            "Set data.unseen_labels: drop to drop those rows, or accept the new labels once with "
            "`trainflow stage ingest --accept-schema`, then rerun",
        )
    print(
        f"ingest: dropped {count} row{'s' if count != 1 else ''} whose target {d.target!r} has a label the current "
        f"model was not trained on ({names}; data.unseen_labels: drop)",
        file=sys.stderr,
    )
    target.unseen = unseen


def _classes(table: Table, d: DataParams, target: _Target, keep: np.ndarray | None) -> list[str]:
    """The labels present in the kept rows, sorted (by value when they are all numbers); warns of case variants."""
    assert target.codes is not None
    codes = target.codes if keep is None else target.codes[keep]
    present = [lab for lab, n in zip(target.labels, np.bincount(codes, minlength=len(target.labels))) if n]
    try:
        classes = sorted(present, key=float)
    except ValueError:
        classes = sorted(present)
    if len(classes) < 2:
        raise DataError(
            f"data.source: {table.source}, column {d.target!r}: the target has a single class ({_names(classes)}); "
            "a classifier needs at least two, check data.target and the data"
        )
    by_case: dict[str, list[str]] = {}
    for c in classes:
        by_case.setdefault(c.casefold(), []).append(c)
    variants = ["/".join(repr(c) for c in group) for group in by_case.values() if len(group) > 1]
    if variants:
        print(
            f"ingest: warning: target {d.target!r} has labels that differ only in case ({', '.join(variants)}); "
            "they stay separate classes, fix the data if they are the same",
            file=sys.stderr,
        )
    return classes


# --- rows ------------------------------------------------------------------------------------------------------------


def _missing(
    table: Table, d: DataParams, cols: list[_Column], keep: np.ndarray | None, dropped: dict[str, int]
) -> np.ndarray | None:
    """data.missing drop/error: rows with a missing feature (or text) value."""
    if not cols:
        return keep
    missing = np.zeros(len(table.frame), dtype=bool)
    cols = [c for c in cols if c.kind != "image"]  # never missing: the reader refuses a row without an image
    for c in cols:  # one column's values at a time
        missing |= np.asarray(pd.isna(c.get()), dtype=bool)
    if keep is not None:
        missing = missing & keep
    if d.missing == "error" and missing.any():
        row = int(np.argmax(missing))
        column = next(c.name for c in cols if pd.isna(c.get()[row]))
        count = int(missing.sum())
        raise _at(
            table,
            row,
            column,
            f"the value is missing ({count} row{'s have' if count != 1 else ' has'} missing values; "
            "data.missing: error); "
            "fill it in, or set data.missing: impute or drop",
        )
    dropped["missing"] = int(missing.sum())
    return ~missing if keep is None else keep & ~missing


class _Columns(Protocol):
    """The typed columns the duplicate check reads, one at a time (`_FrameColumns`, `_SpillColumns`)."""

    names: list[str]

    def hashes(self, name: str) -> np.ndarray: ...  # pd.util.hash_pandas_object of the column, index=False

    def take(self, rows: np.ndarray) -> pd.DataFrame: ...


def _hashes(out: _Columns) -> np.ndarray:
    return row_hashes((out.hashes(n) for n in out.names), len(out.names))


def _duplicates(
    table: Table, d: DataParams, out: _Columns, keep: np.ndarray | None, dropped: dict[str, int]
) -> np.ndarray | None:
    """data.duplicates drop/error: rows equal to an earlier row over the kept columns."""
    hashes = _hashes(out)
    dup = _duplicated(out, hashes)
    if keep is not None:
        dup = dup & keep  # identical rows share the other drop decisions, so the earlier one is kept too
    if d.duplicates == "error" and dup.any():
        row = int(np.argmax(dup))
        same = np.flatnonzero(hashes[:row] == hashes[row])
        earlier = next(int(j) for j in same if out.take(np.array([int(j), row])).duplicated().iloc[1])
        count = int(dup.sum())
        raise DataError(
            f"data.source: {table.where(row)}: the row duplicates {table.where(earlier)} "
            f"({count} duplicate row{'s' if count != 1 else ''}; data.duplicates: error); remove the duplicates, "
            "or set data.duplicates: keep or drop"
        )
    dropped["duplicates"] = int(dup.sum())
    return ~dup if keep is None else keep & ~dup


def _duplicated(out: _Columns, hashes: np.ndarray) -> np.ndarray:
    """DataFrame.duplicated(keep="first"), fast: one hash per row, then the exact check on rows whose hash repeats."""
    repeated = pd.Series(hashes).duplicated().to_numpy()
    dup = np.zeros(len(hashes), dtype=bool)
    if repeated.any():
        rows = np.flatnonzero(np.isin(hashes, hashes[repeated]))
        dup[rows] = out.take(rows).duplicated().to_numpy()
    return dup
