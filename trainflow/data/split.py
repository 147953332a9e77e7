"""Train/val/test split of the processed table, stable under appended rows.

A row's split is decided by a seeded hash of the row itself (its `split.key` columns, or all of its columns), so
appending new rows to the data never moves an existing row to another split: what was test stays test, and a model
is never retrained on rows it was once evaluated on. Nothing about the assignment depends on the other rows, which
also means duplicate rows (or rows with equal keys) always share a split, and the split sizes match the fractions in
expectation rather than exactly.

Modes, in order of precedence:

- `split.time_column`: the oldest rows train, later ones validate, the newest test (by position in time order, so
  this mode is deliberately *not* stable under appends: new, newer rows push the boundaries forward).
- `split.group_by`: the hash of the group column alone decides, so every row of a group lands in the same split.
- otherwise the hash of `split.key` (null = the processed table's columns: features, text column, target).

With `split.stratify` on a classification task the hash is unchanged (it is uniform and independent of the class,
so each class is split in the given proportions in expectation); the split then checks that every class is
represented where it can be (every class in train; a class of 3 or more rows in val and in test too; a class of
one row cannot be stratified) and raises a DataError naming the class and how to fix it when one is not. These checks
look at all rows, so appending rows can make a table fail them (a class growing from 2 to 3 rows must then reach val
and test), but they never move a row.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
from pandas.util import hash_pandas_object

from trainflow.data.schema import Schema
from trainflow.errors import DataError
from trainflow.params import SplitParams

SPLITS = ("train", "val", "test")
TRAIN, VAL, TEST = 0, 1, 2
_FIX = "add rows of that class, merge rare classes into one, set split.stratify: false, or {fractions}"
_MAX_LISTED = 10


def hash_key(seed: int) -> str:
    """The 16-character key `hash_pandas_object` mixes into every row hash; a different seed gives other splits."""
    return hashlib.blake2b(f"trainflow.split:{seed}".encode(), digest_size=8).hexdigest()


def uniform(frame: pd.DataFrame, columns: list[str], seed: int) -> np.ndarray:
    """A number in [0, 1) per row: the seeded 64-bit hash of the row's `columns`, scaled down by 2**64.

    Only the top 53 bits are kept (all a float64 holds exactly), so a hash near 2**64 never rounds up to 1.0.
    """
    h = hash_pandas_object(frame[columns], index=False, hash_key=hash_key(seed)).to_numpy(dtype=np.uint64)
    return (h >> np.uint64(11)).astype(np.float64) * 2.0**-53


def assign(frame: pd.DataFrame, schema: Schema, p: SplitParams, seed: int) -> np.ndarray:
    """Split of every row: an int8 array, 0=train, 1=val, 2=test (indices into SPLITS).

    Hash modes (key, whole row, group_by): with u = the row's seeded hash / 2**64 in [0, 1), a row is test if
    u < test_fraction, val if u < test_fraction + val_fraction, else train. A row's split depends only on that row
    (the hashed columns and their dtypes), the seed and the fractions, so appending rows never moves an existing one,
    and duplicate rows share a split. Split sizes, and per-class proportions when stratified, match the fractions in
    expectation. time_column mode: rows sorted by time (stable sort; ties keep table order); the oldest
    1 - val - test fraction trains, the next val_fraction validates, the newest rows test.

    Raises DataError for an unknown column, missing timestamps, an empty split, or (stratified) a class too small to
    stratify or missing from a split.
    """
    _check_columns(frame, p)
    n = len(frame)
    stratified = p.stratify and schema.task == "classification" and p.time_column is None
    classes = _class_codes(frame, schema) if stratified else None
    if classes is not None:
        _check_class_sizes(classes[1], classes[2])

    if p.time_column is not None:
        split = _by_time(frame, p)
    else:
        if p.group_by is not None:
            columns = [p.group_by]
        elif p.key is not None:
            columns = list(p.key)
        else:
            columns = _row_columns(frame, schema)
        u = uniform(frame, columns, seed)
        split = np.full(n, TRAIN, dtype=np.int8)
        split[u < p.test_fraction + p.val_fraction] = VAL
        split[u < p.test_fraction] = TEST

    _check_not_empty(split, frame, p)
    if classes is not None:
        _check_classes_in_every_split(*classes, split)
    return split


def split_frame(frame: pd.DataFrame, schema: Schema, p: SplitParams, seed: int) -> dict[str, pd.DataFrame]:
    """The train/val/test subsets of `frame` by `assign`, each in table order with a fresh 0..n-1 index."""
    split = assign(frame, schema, p, seed)
    return {name: frame.iloc[np.flatnonzero(split == i)].reset_index(drop=True) for i, name in enumerate(SPLITS)}


def _available(frame: pd.DataFrame) -> str:
    return ", ".join(map(str, frame.columns))


def _check_columns(frame: pd.DataFrame, p: SplitParams) -> None:
    if p.key is not None and not p.key:
        raise DataError("split.key is an empty list: name the id column(s) to hash, or set it to null to hash rows")
    named = [("split.key", c) for c in p.key or []]
    named += [(f"split.{name}", c) for name, c in (("group_by", p.group_by), ("time_column", p.time_column)) if c]
    for param, column in named:
        if column not in frame.columns:
            raise DataError(
                f"{param}: column {column!r} is not in the processed table; available columns: {_available(frame)}"
            )


def _row_columns(frame: pd.DataFrame, schema: Schema) -> list[str]:
    """The processed table's columns, in schema order: features, the text column, the target."""
    columns = [*schema.features, *([schema.text_column] if schema.text_column else []), schema.target]
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise DataError(
            f"split: the schema's column(s) {', '.join(map(repr, missing))} are not in the processed table "
            f"(available: {_available(frame)}); run `trainflow stage ingest` again"
        )
    return columns


def _class_codes(frame: pd.DataFrame, schema: Schema) -> tuple[np.ndarray, pd.Index, np.ndarray]:
    """Per row the index of its class label (-1 = missing label), the labels, and the rows of each class."""
    if schema.target not in frame.columns:
        raise DataError(
            f"split: the target column {schema.target!r} is not in the processed table (available: "
            f"{_available(frame)}); run `trainflow stage ingest` again"
        )
    codes, labels = pd.factorize(frame[schema.target])
    return codes, pd.Index(labels), np.bincount(codes[codes >= 0], minlength=len(labels))


def _listed(problems: list[str]) -> str:
    more = len(problems) - _MAX_LISTED
    return "; ".join(problems[:_MAX_LISTED]) + (f"; and {more} more" if more > 0 else "")


def _check_class_sizes(labels: pd.Index, counts: np.ndarray) -> None:
    small = [f"class {label!r} has {int(n)} row" for label, n in zip(labels, counts) if n < 2]
    if small:
        raise DataError(
            f"split: {_listed(small)}: too small to stratify (a class needs 2 rows, one in train and one held "
            f"out). Fix: {_FIX.format(fractions='drop the class from the data')}."
        )


def _by_time(frame: pd.DataFrame, p: SplitParams) -> np.ndarray:
    assert p.time_column is not None
    times = frame[p.time_column]
    n_missing = int(times.isna().sum())
    if n_missing:
        raise DataError(
            f"split.time_column: {n_missing} of {len(frame)} rows have no timestamp in column {p.time_column!r}; "
            "fill or drop them (data.missing: drop) or split without split.time_column"
        )
    n = len(frame)
    n_test = round(n * p.test_fraction)
    n_val = round(n * p.val_fraction)
    by_position = np.full(n, TRAIN, dtype=np.int8)
    by_position[n - n_test - n_val : n - n_test] = VAL
    by_position[n - n_test :] = TEST
    order = times.reset_index(drop=True).sort_values(kind="stable").index.to_numpy()
    split = np.empty(n, dtype=np.int8)
    split[order] = by_position
    return split


def _check_not_empty(split: np.ndarray, frame: pd.DataFrame, p: SplitParams) -> None:
    sizes = np.bincount(split, minlength=len(SPLITS))
    fractions = {"train": 1 - p.val_fraction - p.test_fraction, "val": p.val_fraction, "test": p.test_fraction}
    for i, name in enumerate(SPLITS):
        if sizes[i]:
            continue
        more = "add rows"
        rows = f"{len(frame)} rows"
        if p.group_by is not None and p.time_column is None:
            rows += f" in {frame[p.group_by].nunique(dropna=False)} groups of split.group_by {p.group_by!r}"
            more = "add groups"
        fix = "lower split.val_fraction / split.test_fraction" if name == "train" else f"raise split.{name}_fraction"
        raise DataError(
            f"split: the {name} split is empty ({rows}, {name} fraction {fractions[name]:g}); {more} or {fix}"
        )


def _check_classes_in_every_split(codes: np.ndarray, labels: pd.Index, counts: np.ndarray, split: np.ndarray) -> None:
    k = len(SPLITS)
    known = codes >= 0
    table = np.bincount(codes[known] * k + split[known], minlength=len(labels) * k).reshape(len(labels), k)
    problems: list[str] = []
    no_train = False
    held_out: set[str] = set()
    for label, n, row in zip(labels, counts, table):
        absent = [name for i, name in enumerate(SPLITS) if row[i] == 0 and (i == TRAIN or n >= k)]
        if absent:
            problems.append(f"class {label!r} ({int(n)} rows) has no row in {' or '.join(absent)}")
            no_train |= "train" in absent
            held_out.update(name for name in absent if name != "train")
    if problems:
        fixes = ["lower split.val_fraction / split.test_fraction"] if no_train else []
        if held_out:
            fixes.append("raise " + " / ".join(f"split.{name}_fraction" for name in SPLITS if name in held_out))
        fix = _FIX.format(fractions=" or ".join(fixes))
        raise DataError(f"split: stratified by class, but {_listed(problems)}. Fix: {fix}.")
