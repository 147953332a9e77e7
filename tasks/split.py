"""Prefect task for the split stage."""

from __future__ import annotations

from typing import Any

from prefect import task

from tasks.stage import run


@task(name="split")
def split(root: str) -> dict[str, Any]:
    return run("split", root)
