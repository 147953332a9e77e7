"""split: exact train/val/test fractions (stratified by class), stable under appended rows.

The split of every row key is saved beside the splits (data/splits/assignment.parquet; `persist: true` in dvc.yaml, so
DVC leaves it for the next run) and kept by the next split made with the same settings (split.*: the top-level seed
trains, and is not among them). Each test row's key is saved too (test_rows.parquet): the champion gate looks the
test rows up in the champion's own assignment when it was another.

A processed table bigger than data.memory_budget_mb is split without reading it whole: the row keys are computed a
block of rows at a time into buckets on disk and assigned a bucket at a time (`split_stream`: the same split of every
row). Memory: a few bytes a row (its split and generation) and the saved assignment being kept, not the table. A time
split (split.time_column) finds its two boundary times by a radix selection over the time column, read a block at a
time, and gives each row its split by its time (`split_stream.assign_by_time`).

Written: a split held in memory as a file of its own, data/splits/<name>.parquet. A streamed split is not copied: the
processed table is linked in as data/splits/table.parquet (a second name for the same file, so data/splits still holds
everything the later stages read) and data/splits/rows.npy gives each of its rows its split (a byte a row). The later
stages read either through `stream.Split`: the same rows, columns and dtypes. Copying the three parts would rewrite
the whole table, about as much work as the rest of the split (benchmarks/history/2026-11-27-out-of-core-b58515e.md).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from trainflow.core.errors import UserError
from trainflow.core.io import atomic_dir, write_json
from trainflow.core.paths import SPLITS, Paths
from trainflow.data import split_stream, stream
from trainflow.data.schema import Schema, parquet_options
from trainflow.data.split import ASSIGNMENT, TEST_ROWS, Assignment, split_frame
from trainflow.params import DataParams, SplitParams

PARAMS = ("split", "data.memory_budget_mb")  # dvc.yaml lists what the stage reads: tests/contracts/test_stage_params.py
READS_UNLISTED: dict[str, str] = {}


def _link(source: Path, dest: Path) -> None:
    """`dest` as a second name of `source` (no copy); copied where the file system cannot link. Ingest replaces its
    folder whole (atomic_dir), never writes into the file, so the splits keep the table they were made from."""
    try:
        os.link(source, dest)
    except OSError:
        shutil.copyfile(source, dest)


def run(paths: Paths, *, split: SplitParams, data: DataParams) -> dict[str, Any]:
    if not paths.table.is_file():
        raise UserError(f"split: {paths.table} is missing; run `trainflow stage ingest` first")
    schema = Schema.read(paths.schema)
    choice = stream.choose([paths.table], data)  # text too: rows are only selected, never typed
    print(f"split: {choice.why}", file=sys.stderr)
    previous = Assignment.load(paths.splits / ASSIGNMENT)
    with atomic_dir(paths.splits) as tmp:
        if choice.streamed:
            if split.time_column is None:  # keys a block of rows at a time, into buckets by key
                work = tmp / ".buckets"
                result = split_stream.assign(paths.table, schema, split, previous, tmp / ASSIGNMENT, work)
                shutil.rmtree(work)
            else:  # a time split: each row by its time, against two times selected from the column
                result = split_stream.assign_by_time(paths.table, split)
            _link(paths.table, tmp / stream.LINKED)  # the rows stay where ingest wrote them: a byte a row says where
            np.save(tmp / stream.ROWS, result.split.astype(np.int8, copy=False))
            sizes = [int(c) for c in np.bincount(result.split, minlength=len(SPLITS))]
        else:
            parts, result = split_frame(paths.read_table(), schema, split, previous)
            for name in SPLITS:
                dest = tmp / paths.split_file(name).name
                parts[name].to_parquet(dest, index=False, **parquet_options(parts[name]))
            sizes = [len(parts[name]) for name in SPLITS]
        write_json(tmp / paths.split_schema.name, schema.to_json())
        if result.assignment is not None:
            result.assignment.save(tmp / ASSIGNMENT)
        if result.since is not None and result.test_keys is not None:
            # per test row, its key and the generation it arrived in: which rows the champion's split held (the gate)
            since = result.since[result.split == SPLITS.index("test")]
            rows = pd.DataFrame({"since": since, "key": pd.Series(result.test_keys, dtype="uint64")})
            rows.to_parquet(tmp / TEST_ROWS, index=False)
    out: dict[str, Any] = dict(zip(SPLITS, sizes, strict=True))
    if split.time_column is None:
        out["rows_kept_in_place"] = result.kept
    return out
