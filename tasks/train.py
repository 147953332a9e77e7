"""Prefect task for the train stage."""

from __future__ import annotations

from typing import Any

from prefect import task

from tasks.stage import run


@task(name="train")
def train(root: str) -> dict[str, Any]:
    """Train the model. Not retried by Prefect: a failure here is rarely transient, and a blind retry would repeat
    minutes or hours of work. Rerunning the flow (or `trainflow run`) is the retry: with `train.resume: auto` it
    continues from the newest checkpoint in models/checkpoints when its params, code and data still match, so only the
    work since that checkpoint is redone."""
    return run("train", root)
