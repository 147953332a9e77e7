"""Prefect task for the register stage."""

from __future__ import annotations

from typing import Any

from prefect import task

from tasks.stage import run


@task(name="register")
def register(root: str) -> dict[str, Any]:
    return run("register", root)
