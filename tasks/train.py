"""Prefect task for the train stage."""

from __future__ import annotations

from typing import Any

from prefect import task

from tasks.stage import run


@task(name="train")
def train(root: str) -> dict[str, Any]:
    return run("train", root)
