"""Prefect task for the train stage."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.client.schemas.objects import State
from prefect.states import Crashed

from tasks.stage import run
from trainflow.errors import Preempted

PREEMPTED_STATE = "Preempted"  # the name of the train task's (and the flow run's) state after a preemption


@task(name="train")
def train(root: str) -> dict[str, Any] | State:
    """Train the model. Not retried by Prefect: a failure here is rarely transient, and a blind retry would repeat
    minutes or hours of work. Rerunning the flow (or `trainflow run`) is the retry: with `train.resume: auto` it
    continues from the newest checkpoint in models/checkpoints when its params, code and data still match, so only the
    work since that checkpoint is redone. Preempted (a signal, train.max_time): a Crashed state named Preempted."""
    try:
        return run("train", root)
    except Preempted as exc:
        # Not a failure: the checkpoint is written and a rerun resumes. A state of its own, with no traceback, which
        # the flow passes on (a task that returns a state ends in it).
        return Crashed(name=PREEMPTED_STATE, message=str(exc))
