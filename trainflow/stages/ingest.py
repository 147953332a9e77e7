"""ingest: read the raw source, check it against the params, write one typed Parquet table and its schema."""

from __future__ import annotations

from typing import Any

from trainflow.data.schema import infer_schema
from trainflow.data.sources import read_source
from trainflow.io import atomic_dir, write_json
from trainflow.params import PipelineParams
from trainflow.paths import Paths


def run(params: PipelineParams, paths: Paths) -> dict[str, Any]:
    d = params.data
    frame = read_source(d.source, paths.root)
    schema = infer_schema(frame, d.source, d.target, d.features, d.exclude)
    table = frame[[*schema.features, schema.target]]
    with atomic_dir(paths.processed) as tmp:
        table.to_parquet(tmp / paths.table.name, index=False)
        write_json(tmp / paths.schema.name, schema.to_json())
    return {"rows": schema.n_rows, "features": len(schema.features), "classes": len(schema.classes)}
