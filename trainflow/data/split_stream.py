"""The keyed split of a processed table bigger than memory: the same split of every row as `split.assign`, in memory
that does not grow with the table's columns and grows with its rows by a few bytes only.

`split.assign` sorts every row's key at once (about 60 bytes a row at its peak). Here the rows' keys are computed a
block of rows at a time and written, with each row's number and label code, into buckets on disk by the keys' top
bits. Bucket b holds exactly the keys of the b-th range of key values, so walking the buckets in order walks the units
(the distinct keys) in key order, a bucket at a time:

1. every bucket: its units, their strata and saved splits, added up per stratum — the sizes the quotas need;
2. the quotas, once, from those sums (`split.quotas`, the same function);
3. every bucket again: its new units take their stratum's open places with `split._fill`, which is told how many of
   the stratum's new rows came before in key order, so each unit lands exactly where the whole-table fill puts it.

Held for the whole table: the split of each row (1 byte) and its generation (4 bytes), each test row's number and key
(16 bytes a test row), and the saved assignment being kept (13 bytes a key); everything else is one bucket (about
BUCKET_ROWS rows) at a time. The assignment is written as it is made, a bucket at a time, in key order, with the saved
keys of the bucket's range that left the table (`split.with_gone`). A new lineage's id hashes the units' keys in key
order, which the first walk sees bucket by bucket, before the file is opened for its metadata.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from trainflow.core.errors import DataError
from trainflow.data import split as sp
from trainflow.data import stream
from trainflow.data.schema import ROW_KEY, Schema
from trainflow.params import SplitParams

BLOCK_ROWS = 1 << 18  # rows read at a time (a table without row keys hashes every column of them as text)
BUCKET_ROWS = 1 << 20  # about this many rows per bucket (its working memory: about 200 bytes a row)
RECORD = np.dtype([("key", "<u8"), ("row", "<i8"), ("code", "<i4")])


def assign(
    path: Path, schema: Schema, p: SplitParams, previous: sp.Assignment | None, dest: Path, work: Path
) -> sp.Result:
    """`split.assign` of the Parquet table at `path` for a keyed split (no split.time_column), reading it a block of
    rows at a time; the assignment is written to `dest` (as `Assignment.save` writes it) and the Result holds none.
    `work`: a folder for the buckets, removed by the caller."""
    columns = stream.ParquetColumns(path)
    sp._check_columns(columns, p)
    current = sp.settings(columns, schema, p)
    key_columns = current["columns"]
    if current["mode"] == "row" and key_columns != [ROW_KEY]:
        sp._row_columns(columns, schema)  # its clear error for a table without the schema's columns
    previous, last, notes = sp.usable(previous, current)
    stratify_by = current["stratify_by"]
    if stratify_by is not None and schema.target not in columns.columns:
        sp._strata(columns, schema, stratify_by, np.zeros(0, np.int64), 0)  # raises its error
    n = len(columns)

    labels, integral = _whole_column_facts(path, key_columns, stratify_by)
    width = len(labels) + 1 if labels is not None else 1  # strata: the classes and a missing label
    buckets = _bucket_count(n)
    work.mkdir(parents=True, exist_ok=True)
    files = [work / f"bucket-{b:05d}.bin" for b in range(buckets)]
    _write_buckets(path, key_columns, stratify_by, labels, integral, p.seed, files)

    # 1. per stratum: rows (by unit), and rows kept in each split
    sizes = np.zeros(width, dtype=np.int64)
    kept = np.zeros((width, 3), dtype=np.int64)
    top, units, new_units = -1, 0, 0
    named = previous.lineage if previous is not None and previous.lineage else None
    h = sp.lineage_hash(current) if named is None else None  # afresh (or saved before lineages): named by its keys
    for f in files:
        unit_keys, stratum, weight, fixed = _unit_counts(f, labels, previous)
        if h is not None:
            h.update(np.ascontiguousarray(unit_keys, dtype="<u8").data)
        sizes += np.bincount(stratum, weights=weight, minlength=width).astype(np.int64)
        held = fixed >= 0
        np.add.at(kept, (stratum[held], fixed[held]), weight[held])
        top = max(top, int(stratum.max()) if len(stratum) else -1)
        units += len(stratum)
        new_units += int((~held).sum())
    strata = top + 1  # as split.assign counts them: up to the largest stratum that has a unit
    sizes, kept = sizes[:strata], kept[:strata]
    quota, exact = sp.quotas(sizes, kept, sp.fraction_parts(p))
    places = quota - kept
    generation = last + 1 if new_units or previous is None else last
    lineage = sp.lineage_id(h, generation) if h is not None else named or ""

    # 3. the fill, a bucket at a time in key order
    split = np.empty(n, dtype=np.int8)
    since_row = np.empty(n, dtype=np.int32)
    test_rows: list[np.ndarray] = []
    test_keys: list[np.ndarray] = []
    table = np.zeros((len(labels), 3), dtype=np.int64) if labels is not None else None
    before = np.zeros(strata, dtype=np.float64)
    schema_out = pa.schema([("key", pa.uint64()), ("split", pa.int8()), ("since", pa.int32())])
    metadata = sp.metadata(current, generation, lineage)
    # Where each bucket's range of keys starts in the saved assignment: its keys that left the table are written
    # with the bucket.
    starts = np.arange(buckets, dtype=np.uint64) << _shift(buckets)
    bounds = [*np.searchsorted(previous.keys, starts).tolist(), None] if previous is not None else []
    kept_rows = 0
    with pq.ParquetWriter(dest, schema_out.with_metadata(metadata)) as writer:
        for i, f in enumerate(files):
            b = _Bucket(np.fromfile(f, dtype=RECORD), labels, previous)
            split_of_unit = sp._fill(b.fixed, b.stratum, b.weight, places, before)
            held = b.fixed >= 0
            kept_rows += int(b.weight[held].sum())
            saved = previous.generation_of(b.keys) if previous is not None else np.zeros(len(b.keys), np.int32)
            since = np.where(held, saved, generation).astype(np.int32)
            split_of_row = split_of_unit[b.unit_of_row]
            split[b.rows] = split_of_row
            since_row[b.rows] = since[b.unit_of_row]
            test = split_of_row == sp.TEST
            test_rows.append(b.rows[test])
            test_keys.append(b.keys[b.unit_of_row[test]])
            if table is not None and labels is not None:
                table += sp.class_table(b.codes, split_of_row, len(labels))
            lo, hi = (bounds[i], bounds[i + 1]) if previous is not None else (0, None)
            keys_out, split_out, since_out = sp.with_gone(b.keys, split_of_unit, since, previous, lo, hi)
            columns_out = [pa.array(keys_out, pa.uint64()), pa.array(split_out, pa.int8()), pa.array(since_out)]
            writer.write_table(pa.table(columns_out, schema=schema_out))
            f.unlink()
    if table is not None and labels is not None:
        notes += sp.small_class_notes(labels, table)
    for note in notes:
        print(note, file=sys.stderr)
    sp._check_not_empty(split, columns, p, schema)
    rows = np.concatenate(test_rows)
    keys = np.concatenate(test_keys)[np.argsort(rows, kind="stable")]  # in table order, as the test split reads
    return sp.Result(split, None, kept_rows, exact, notes, since_row, keys)


def _unit_counts(
    path: Path, labels: pd.Index | None, previous: sp.Assignment | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A bucket's units' keys (in key order), and their strata, rows and saved splits (-1: new), in no particular
    order: what the quotas need. Where no key repeats (every row its own unit: rows keyed by their values, without
    duplicates), the units are the rows, and only np.sort is needed to see that, a small part of what the units in
    key order (`_Bucket`) cost (benchmarks/out-of-core.md)."""
    records = np.fromfile(path, dtype=RECORD)
    keys, codes = records["key"], records["code"]
    order = np.argsort(keys) if previous is not None else None  # saved splits are looked up in key order
    ordered = keys[order] if order is not None else np.sort(keys)
    if len(ordered) > 1 and bool((ordered[1:] == ordered[:-1]).any()):
        b = _Bucket(records, labels, previous)
        return b.keys, b.stratum, b.weight, b.fixed
    stratum = np.zeros(len(codes), np.int64) if labels is None else np.where(codes < 0, len(labels), codes)
    fixed = np.full(len(codes), -1, dtype=np.int8)
    if previous is not None and order is not None:
        stratum, fixed = stratum[order], previous.lookup(ordered)
    return ordered, stratum.astype(np.int64), np.ones(len(codes), np.int64), fixed


class _Bucket:
    """One bucket's rows (table row numbers, label codes) and units (distinct keys, in key order), with each unit's
    rows, stratum and saved split (-1: new)."""

    def __init__(self, records: np.ndarray, labels: pd.Index | None, previous: sp.Assignment | None) -> None:
        self.rows, self.codes = records["row"], records["code"]
        self.keys, self.unit_of_row, self.weight = sp._units(records["key"])
        units = len(self.keys)
        if labels is None:
            self.stratum = np.zeros(units, dtype=np.int64)
        else:
            self.stratum = sp.unit_strata(self.codes, len(labels), self.unit_of_row, units)
        self.fixed = previous.lookup(self.keys) if previous is not None else np.full(units, -1, dtype=np.int8)


def _whole_column_facts(
    path: Path, key_columns: list[str], stratify_by: str | None
) -> tuple[pd.Index | None, dict[str, bool]]:
    """What a block of rows cannot tell alone: the class labels in order (as `pd.factorize(sort=True)` numbers them
    over the whole column), and for each float key column whether all its values are whole numbers."""
    hashed_as_text = key_columns != [ROW_KEY]
    floats = [c for c in key_columns if hashed_as_text]
    wanted = list(dict.fromkeys([*floats, *([stratify_by] if stratify_by else [])]))
    integral: dict[str, bool] = {}
    uniques: list[Any] = []
    if not wanted:
        return None, integral
    for frame in stream.blocks(path, BLOCK_ROWS, wanted):
        for c in floats:
            whole = sp.whole_numbers(frame[c])
            if whole is not None:
                integral[c] = integral.get(c, True) and whole
        if stratify_by:
            uniques.append(frame[stratify_by].drop_duplicates())  # keeps the column's dtype
    labels = None
    if stratify_by:
        _, found = pd.factorize(pd.concat(uniques, ignore_index=True), sort=True)
        labels = pd.Index(found)
    return labels, integral


def _shift(buckets: int) -> np.uint64:
    """The shift that leaves a key's bucket: its top log2(buckets) bits (64 with one bucket: numpy shifts it to 0)."""
    return np.uint64(64 - (buckets.bit_length() - 1))


def _bucket_count(rows: int) -> int:
    """A power of two, so that a bucket is the keys with the same top bits: about BUCKET_ROWS rows each."""
    count = 1
    while count * BUCKET_ROWS < rows:
        count *= 2
    return count


def _write_buckets(
    path: Path, key_columns: list[str], stratify_by: str | None, labels: pd.Index | None, integral: dict[str, bool],
    seed: int, files: list[Path],
) -> None:  # fmt: skip
    shift = _shift(len(files))
    wanted = list(dict.fromkeys([*key_columns, *([stratify_by] if stratify_by else [])]))
    handles = [f.open("wb") for f in files]
    try:
        first = 0
        for frame in stream.blocks(path, BLOCK_ROWS, wanted):
            keys = sp.row_keys(frame, key_columns, seed, integral)
            codes = labels.get_indexer(frame[stratify_by]) if labels is not None and stratify_by else 0
            bucket = (keys >> shift).astype(np.uint16 if len(files) <= 1 << 16 else np.int64)
            order = np.argsort(bucket, kind="stable")  # table order within a bucket (16 bits: a radix sort)
            records = np.empty(len(frame), dtype=RECORD)  # by bucket: each bucket's records one slice
            records["key"], records["row"] = keys[order], first + order
            records["code"] = codes[order] if isinstance(codes, np.ndarray) else codes
            first += len(frame)
            bounds = np.searchsorted(bucket[order], np.arange(len(files) + 1))
            for b, handle in enumerate(handles):
                if bounds[b] < bounds[b + 1]:
                    records[bounds[b] : bounds[b + 1]].tofile(handle)
    finally:
        for handle in handles:
            handle.close()


# --- a time split (split.time_column), from the time column read a block at a time ----------------------------------

SIGN = np.uint64(1 << 63)
DIGIT_BITS = 16


def assign_by_time(path: Path, p: SplitParams) -> sp.Result:
    """`split.assign` of the Parquet table at `path` for a time split, never holding the time column: the split of a
    row is a function of its time alone (the boundaries sit between runs of equal times), so the two boundaries'
    times are found by a radix selection over the column, a digit of the times' sort keys per pass, and each row
    compared with them. Held: the split (1 byte a row) and one block. A time column that is neither numbers nor
    timestamps is sorted whole, as in memory."""
    columns = stream.ParquetColumns(path)
    sp._check_columns(columns, p)
    assert p.time_column is not None
    name = p.time_column
    kind = columns.file.schema_arrow.field(name).type
    n = len(columns)
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_timestamp(kind)):
        whole = sp._by_time(columns, p)  # type: ignore[arg-type]
        sp._check_not_empty(whole, columns, p)  # type: ignore[arg-type]
        return sp.Result(whole, None)
    missing = sum(int(frame[name].isna().sum()) for frame in stream.blocks(path, BLOCK_ROWS, [name]))
    if missing:
        raise DataError(
            f"split.time_column: {missing} of {n} rows have no timestamp in column {name!r}; "
            "fill or drop them (data.missing: drop) or split without split.time_column"
        )
    test_cut = n - round(n * p.test_fraction)
    val_cut = n - round(n * p.test_fraction) - round(n * p.val_fraction)
    test_start = _time_boundary(path, name, n, test_cut)
    val_start = min(_time_boundary(path, name, n, val_cut), test_start)
    split = np.empty(n, dtype=np.int8)
    lo = 0
    firsts = [_key_at(path, name, s) if s < n else None for s in (val_start, test_start)]
    for frame in stream.blocks(path, BLOCK_ROWS, [name]):
        keys = _sort_keys(frame[name])
        part = np.full(len(keys), sp.TRAIN, dtype=np.int8)
        if firsts[0] is not None:
            part[keys >= firsts[0]] = sp.VAL
        if firsts[1] is not None:
            part[keys >= firsts[1]] = sp.TEST
        split[lo : lo + len(keys)] = part
        lo += len(keys)
    sp._check_not_empty(split, columns, p)
    return sp.Result(split, None)


def _sort_keys(s: pd.Series) -> np.ndarray:
    """uint64 keys in the order of the values (sort_values' order): integers and timestamps offset by 2^63, floats
    by their bits (negative ones flipped); -0.0 and 0.0 equal, as they compare."""
    tz = isinstance(s.dtype, pd.DatetimeTZDtype)
    values = s.to_numpy(dtype=f"datetime64[{s.dt.unit}]") if tz else s.to_numpy()  # tz: the instants, in UTC
    if values.dtype.kind == "M":
        return values.view(np.int64).view(np.uint64) ^ SIGN
    if values.dtype.kind in "iu":
        return values.astype(np.int64).view(np.uint64) ^ SIGN if values.dtype.kind == "i" else values.astype(np.uint64)
    bits = (values.astype(np.float64) + 0.0).view(np.uint64)  # + 0.0: -0.0 becomes 0.0
    return np.where(bits & SIGN, ~bits, bits | SIGN)


def _key_at(path: Path, name: str, position: int) -> np.uint64:
    """The sort key of the value at `position` of the sorted column (0-based): a radix selection, DIGIT_BITS per pass
    over the column."""
    prefix, mask, rank = np.uint64(0), np.uint64(0), position
    digits = 1 << DIGIT_BITS
    for shift in range(64 - DIGIT_BITS, -1, -DIGIT_BITS):
        counts = np.zeros(digits, dtype=np.int64)
        for frame in stream.blocks(path, BLOCK_ROWS, [name]):
            keys = _sort_keys(frame[name])
            keys = keys[(keys & mask) == prefix]
            counts += np.bincount((keys >> np.uint64(shift)).astype(np.int64) & (digits - 1), minlength=digits)
        below = np.cumsum(counts)
        digit = int(np.searchsorted(below, rank, side="right"))
        rank -= int(below[digit - 1]) if digit else 0
        prefix |= np.uint64(digit) << np.uint64(shift)
        mask |= np.uint64(digits - 1) << np.uint64(shift)
    return prefix


def _time_boundary(path: Path, name: str, n: int, cut: int) -> int:
    """split._boundary over the sorted column: `cut` moved out of a run of equal times to the run's nearer end."""
    if cut <= 0 or cut >= n:
        return cut
    value = _key_at(path, name, cut)
    start = end = 0
    for frame in stream.blocks(path, BLOCK_ROWS, [name]):
        keys = _sort_keys(frame[name])
        start += int(np.count_nonzero(keys < value))
        end += int(np.count_nonzero(keys <= value))
    return start if cut - start <= end - cut else end
