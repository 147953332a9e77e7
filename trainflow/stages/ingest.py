"""ingest: read the raw source, validate it row by row, write one typed Parquet table and its schema."""

from __future__ import annotations

import sys
from typing import Any

from trainflow.data.schema import Schema
from trainflow.data.sources import read_source
from trainflow.data.validate import infer_schema
from trainflow.io import atomic_dir, write_json
from trainflow.params import PipelineParams
from trainflow.paths import Paths


def previous_schema(paths: Paths, source: str) -> Schema | None:
    """The schema of the last ingest of the same source (data/processed persists between runs), for drift checks."""
    if not paths.schema.is_file():
        return None
    try:
        previous = Schema.read(paths.schema)
    except (TypeError, KeyError, ValueError):
        print(f"ingest: {paths.schema} was written by an older trainflow; no schema drift check", file=sys.stderr)
        return None
    if previous.source != source:
        print(f"ingest: data.source changed from {previous.source!r}; no schema drift check", file=sys.stderr)
        return None
    return previous


def run(params: PipelineParams, paths: Paths) -> dict[str, Any]:
    d = params.data
    table = read_source(d, paths.root)
    schema, frame = infer_schema(table, d, previous_schema(paths, d.source))
    with atomic_dir(paths.processed) as tmp:
        frame.to_parquet(tmp / paths.table.name, index=False)
        write_json(tmp / paths.schema.name, schema.to_json())
    out: dict[str, Any] = {"rows": schema.n_rows, "features": len(schema.features), "task": schema.task}
    if schema.task == "classification":
        out["classes"] = len(schema.classes)
    if schema.text_column:
        out["text_column"] = schema.text_column
    return out | {f"dropped_{k}": v for k, v in schema.dropped.items()}
