"""Prefect task that pushes the pipeline's DVC outputs (data, checkpoints, model) to DVC's default remote.

It talks to the remote (a local directory, or S3/GCS/Azure), so a transient failure is retried with backoff. The
flow calls it only after every stage succeeded and was committed, so what is pushed is exactly what dvc.lock records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task

from tasks import dvc
from tasks.retry import OUTSIDE_WORLD


@task(name="push", **OUTSIDE_WORLD)
def push(root: str, remote: str) -> dict[str, Any]:
    return {"remote": remote, "files_pushed": dvc.push(Path(root), remote)}
