"""Prefect task for the ingest stage. It reads the data source (a file share, later a bucket), so a transient failure
is retried with backoff; invalid data (a UserError) is not."""

from __future__ import annotations

from typing import Any

from prefect import task

from tasks.retry import OUTSIDE_WORLD
from tasks.stage import run


@task(name="ingest", **OUTSIDE_WORLD)
def ingest(root: str) -> dict[str, Any]:
    return run("ingest", root)
