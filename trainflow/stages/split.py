"""split: seeded train/val/test split of the processed table, stable under appended rows."""

from __future__ import annotations

from typing import Any

import pandas as pd

from trainflow.data.schema import Schema
from trainflow.data.split import SPLITS, split_frame
from trainflow.errors import UserError
from trainflow.io import atomic_dir, write_json
from trainflow.params import PipelineParams
from trainflow.paths import Paths


def run(params: PipelineParams, paths: Paths) -> dict[str, Any]:
    if not paths.table.is_file():
        raise UserError(f"split: {paths.table} is missing; run `trainflow stage ingest` first")
    schema = Schema.read(paths.schema)
    table = pd.read_parquet(paths.table)
    parts = split_frame(table, schema, params.split, params.seed)
    with atomic_dir(paths.splits) as tmp:
        for name in SPLITS:
            parts[name].to_parquet(tmp / paths.split_file(name).name, index=False)
        write_json(tmp / paths.split_schema.name, schema.to_json())
    return {name: len(parts[name]) for name in SPLITS}
