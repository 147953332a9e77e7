"""A study's MLflow runs (the study's own run and one child run per trial), each made once even when the process that
starts it is killed before it can record the run's id.

MLflow chooses a run's id, so "start the run, then record its id" has a window in which the run exists and nothing
says so; a process killed there would leave a run RUNNING forever and its successor would start a second one. So a
key is recorded first (in the study, or the trial), the run is started with the key as a tag, and its id is recorded
last. A successor that finds a key and no id asks MLflow for the run with that key: only MLflow's answer "none" lets
it start a new run. Anything else (the server down, a refusal, the database locked) is not an answer: it is retried,
then raised as a ServiceError, never taken to mean that the run does not exist.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainflow.core.errors import ServiceError

if TYPE_CHECKING:
    from trainflow.params import PipelineParams

KEY_TAG = "trainflow.tune.run_key"  # MLflow tag: the key the run was started under
RETRY_DELAYS_S = (1.0, 3.0)  # between the attempts of a lookup (three in all)


def new_key() -> str:
    return uuid.uuid4().hex


def find(root: Path, experiment: str, key: str) -> str | None:
    """The id of the run started under `key` in `experiment`, or None when MLflow answers that there is none."""
    import requests
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST, ErrorCode
    from mlflow.tracking import MlflowClient

    from trainflow import tracking

    uri = tracking.configure(root)
    client = MlflowClient(uri)
    failure: Exception | None = None
    for delay in (*RETRY_DELAYS_S, None):
        try:
            found = client.get_experiment_by_name(experiment)  # None: MLflow says there is no such experiment
            if found is None:
                return None
            runs = client.search_runs([found.experiment_id], filter_string=f"tags.`{KEY_TAG}` = '{key}'")
            # Two runs under one key cannot be made (the key is recorded before its only start); the first is it.
            return min(runs, key=lambda r: r.info.start_time).info.run_id if runs else None
        except MlflowException as exc:
            if exc.error_code == ErrorCode.Name(RESOURCE_DOES_NOT_EXIST):  # the experiment went meanwhile
                return None
            failure = exc
        except (requests.exceptions.RequestException, OSError) as exc:
            failure = exc
        if delay is not None:
            time.sleep(delay)
    raise ServiceError(
        f"tune: MLflow at {uri} did not answer whether the run with {KEY_TAG}={key} exists ({type(failure).__name__}: "
        f"{failure}); without its answer a second run could be started beside it. Everything else is intact: rerun "
        "`trainflow tune` once MLflow answers."
    )


def start_parent(params: PipelineParams, root: Path, key: str) -> str | None:
    """Start the study's MLflow run (each trial's run is its child) under `key` (trainflow.tune.runs); its id, or None
    when MLflow did not answer."""
    from trainflow import tracking

    run = tracking.TrainingRun(root, params.tracking.experiment, root / "models" / "tune" / "parent_local.json")
    tags = {"trainflow.tune.study": params.tune.study, "trainflow.tune.role": "study", KEY_TAG: key}
    run.start({"tune": params.tune.model_dump(mode="json")}, tags=tags, run_name=f"tune-{params.tune.study}")
    return run.run_id


def parent_run(params: PipelineParams, root: Path) -> Any:
    """The study's MLflow run, made by the process that sets the study up, once: its key goes into the study before
    the run starts, so a process that finishes the set-up of one killed meanwhile finds the run instead of making a
    second."""

    def create(study: Any) -> None:
        from trainflow.core.io import failpoint
        from trainflow.tune.study import PARENT_KEY, PARENT_RUN

        if study.user_attrs.get(PARENT_RUN):
            return
        key = study.user_attrs.get(PARENT_KEY)
        run_id = find(root, params.tracking.experiment, key) if key else None
        if run_id is None:
            if key is None:
                key = new_key()
                study.set_user_attr(PARENT_KEY, key)
            run_id = start_parent(params, root, key)
            failpoint("tune-parent")  # the run is started, the study does not know its id yet
        if run_id:
            study.set_user_attr(PARENT_RUN, run_id)

    return create


def finish_parent(s: Any, top: dict[str, Any] | None) -> None:
    """The study ended: its best trial on the parent run, which is then FINISHED."""
    from trainflow import tracking
    from trainflow.tune.study import PARENT_RUN

    parent = s.study.user_attrs.get(PARENT_RUN)
    if not parent:
        return
    run = tracking.TrainingRun(s.root, s.params.tracking.experiment, s.root / "models" / "tune" / "parent_local.json")
    run.attach(parent)
    if top is not None:
        run.log_metrics({f"best_{s.metric}": float(top["value"])})
        run.set_tags(
            {"trainflow.tune.best_trial": str(top["trial"]), "trainflow.tune.best_params": json.dumps(top["params"])}
        )
    run.finish()
