"""Prefect task for the ingest stage."""

from __future__ import annotations

from typing import Any

from prefect import task

from tasks.stage import run


@task(name="ingest")
def ingest(root: str) -> dict[str, Any]:
    return run("ingest", root)
