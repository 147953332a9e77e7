"""ingest: read the raw source, validate it row by row, write one typed Parquet table and its schema."""

from __future__ import annotations

import hashlib
import shutil
import sys
from typing import Any

import pandas as pd

from trainflow.core.errors import ParamsError
from trainflow.core.io import atomic_dir, write_json
from trainflow.core.paths import Paths
from trainflow.data.schema import Schema, parquet_options
from trainflow.data.sources import RawTable, read_source
from trainflow.data.spill import arrow_memory
from trainflow.data.validate import infer_schema, schema_params
from trainflow.params import DataParams, source_outside
from trainflow.registry import changes


def previous_schema(paths: Paths, d: DataParams) -> Schema | None:
    """The schema of the last ingest (data/processed persists between runs), the baseline of the drift check: only
    when it was made under the same data params. A change the user made (another target, task, columns, source) is
    not drift: the schema is inferred afresh."""
    if not paths.schema.is_file():
        return None
    try:
        previous = Schema.read(paths.schema)
    except (TypeError, KeyError, ValueError):
        print(f"ingest: {paths.schema} was written by an older trainflow; no schema drift check", file=sys.stderr)
        return None
    changed = sorted(k for k, v in schema_params(d).items() if previous.data_params.get(k, v) != v)
    if not previous.data_params or changed:
        if changed:
            print(f"ingest: data params changed ({', '.join(f'data.{k}' for k in changed)}); the schema is inferred "
                  "afresh", file=sys.stderr)  # fmt: skip
        return None
    return previous


PARAMS = ("data",)  # dvc.yaml lists what the stage reads: tests/contracts/test_stage_params.py
READS_UNLISTED: dict[str, str] = {}

SPILL = ".spill"  # in the new data/processed while ingest writes it


def sources(table: RawTable) -> dict[str, Any]:
    """What ingest read, per file: rows and content hash (data/processed/sources.json; trainflow.registry.changes
    compares it with the champion's). A builtin set is one entry, hashed from its rows."""
    if not table.files:
        digest = hashlib.sha256(pd.util.hash_pandas_object(table.frame, index=False).to_numpy().tobytes())
        return {table.source: {"rows": len(table.frame), "sha256": digest.hexdigest()}}
    shown = [table.shown(i) for i in range(len(table.files))]
    return changes.data_files(
        shown, table.rows, table.files, group_by_folder=table.fmt == "images", known=table.digests
    )


def run(paths: Paths, *, data: DataParams, accept_schema: bool = False) -> dict[str, Any]:
    """Ingest data.source. `accept_schema`: take the data's schema as it is now, without the drift check against the
    previous ingest (`trainflow stage ingest --accept-schema`, when the source changed on purpose)."""
    d = data
    if outside := source_outside(d.source, paths.root):  # load_params refuses it; params built otherwise meet it here
        raise ParamsError(str(paths.params), [("data.source", outside)])
    previous = None if accept_schema else previous_schema(paths, d)
    with atomic_dir(paths.processed) as tmp, arrow_memory():
        # A source over data.memory_budget_mb is read into a spill in the new directory (removed before it is swapped
        # in; on an error, with it): the old processed data stays as it was until the new one is whole.
        spill = tmp / SPILL
        table = read_source(d, paths.root, spill=spill)
        for note in table.notes:
            print(f"ingest: {note}", file=sys.stderr)
        schema, frame = infer_schema(table, d, previous)
        if isinstance(frame, pd.DataFrame):
            frame.to_parquet(tmp / paths.table.name, index=False, **parquet_options(frame))
        else:
            frame.to_parquet(tmp / paths.table.name)
        shutil.rmtree(spill, ignore_errors=True)
        write_json(tmp / paths.schema.name, schema.to_json())
        write_json(tmp / changes.SOURCES, sources(table))
    print(f"ingest: task {schema.task}: {schema.task_reason}", file=sys.stderr)
    out: dict[str, Any] = {"rows": schema.n_rows, "features": len(schema.features), "task": schema.task}
    if schema.task == "classification":
        out["classes"] = len(schema.classes)
    if schema.text_column:
        out["text_column"] = schema.text_column
    return out | {f"dropped_{k}": v for k, v in schema.dropped.items()}
