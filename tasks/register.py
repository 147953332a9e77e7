"""Prefect task for the register stage. It talks to the MLflow tracking server and registry, so a transient failure
is retried with backoff; a params problem (a UserError, e.g. a gate metric the task does not measure) is not."""

from __future__ import annotations

from typing import Any

from prefect import task

from tasks.retry import OUTSIDE_WORLD
from tasks.stage import run


@task(name="register", **OUTSIDE_WORLD)
def register(root: str) -> dict[str, Any]:
    return run("register", root)
