"""split: exact train/val/test fractions (stratified by class), stable under appended rows.

The split of every row key is saved beside the splits (data/splits/assignment.parquet; `persist: true` in dvc.yaml, so
DVC leaves it for the next run) and kept by the next split made with the same settings.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from trainflow.data.schema import Schema
from trainflow.data.split import ASSIGNMENT, TEST_ROWS, Assignment, split_frame
from trainflow.errors import UserError
from trainflow.io import atomic_dir, write_json
from trainflow.params import PipelineParams
from trainflow.paths import SPLITS, Paths


def run(params: PipelineParams, paths: Paths) -> dict[str, Any]:
    if not paths.table.is_file():
        raise UserError(f"split: {paths.table} is missing; run `trainflow stage ingest` first")
    schema = Schema.read(paths.schema)
    table = paths.read_table()
    previous = Assignment.load(paths.splits / ASSIGNMENT)
    parts, result = split_frame(table, schema, params.split, params.seed, previous)
    with atomic_dir(paths.splits) as tmp:
        for name in SPLITS:
            parts[name].to_parquet(tmp / paths.split_file(name).name, index=False)
        write_json(tmp / paths.split_schema.name, schema.to_json())
        if result.assignment is not None:
            result.assignment.save(tmp / ASSIGNMENT)
        if result.since is not None:  # per test row, the generation it arrived in: the gate's new-rows slice
            test_rows = result.since[result.split == SPLITS.index("test")]
            pd.DataFrame({"since": test_rows}).to_parquet(tmp / TEST_ROWS, index=False)
    out: dict[str, Any] = {name: len(parts[name]) for name in SPLITS}
    if result.assignment is not None:
        out["rows_kept_in_place"] = result.kept
    return out
