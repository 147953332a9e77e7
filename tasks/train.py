"""Prefect task for the train stage."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from prefect import task
from prefect.client.schemas.objects import State
from prefect.states import Crashed

from flows import interrupts
from tasks.stage import run
from trainflow.core.errors import PREEMPTED, Preempted
from trainflow.core.paths import Paths
from trainflow.engine.preempt import watching
from trainflow.params import load_params

PREEMPTED_STATE = "Preempted"  # the name of the train task's (and the flow run's) state after a preemption


@task(name="train")
def train(root: str) -> dict[str, Any] | State:
    """Train the model. Not retried by Prefect: a failure here is rarely transient, and a blind retry would repeat
    minutes or hours of work. Rerunning the flow (or `trainflow run`) is the retry: with `train.resume: auto` it
    continues from the newest checkpoint in models/checkpoints when its params, code and data still match, so only the
    work since that checkpoint is redone. Preempted (a signal, train.max_time): a Crashed state named Preempted.

    The stage's preemption Watch is entered here, so that a signal it noted and finished the stage anyway (after the
    last update: the export is done instead) is seen once it returns: `trainflow run` then stops after recording it
    (flows/interrupts.py), rather than going on to evaluate and register after a Ctrl-C."""
    signals = load_params(Paths(Path(root)).params).train.preempt_signals
    with watching(signals, finished=functools.partial(interrupts.stop_after_stage, stage="train")):
        try:
            return run("train", root)
        except Preempted as exc:
            # Not a failure: the checkpoint is written and a rerun resumes. A state of its own, with no traceback,
            # which the flow passes on (a task that returns a state ends in it).
            interrupts.stopping(PREEMPTED, "train's checkpoint")
            return Crashed(name=PREEMPTED_STATE, message=str(exc))
