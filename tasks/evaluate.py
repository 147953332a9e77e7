"""Prefect task for the evaluate stage."""

from __future__ import annotations

from typing import Any

from prefect import task

from tasks.stage import run


@task(name="evaluate")
def evaluate(root: str) -> dict[str, Any]:
    return run("evaluate", root)
