"""A sweep's MLflow runs (trainflow.tune.runs): a run found by its key, where only MLflow's "no" means absent, and the
study's own run, made once and ended with the best trial. The sweep code is called in this process, so that mutation
testing sees which function each test reached (tests/stages/test_tune*.py run `trainflow tune` in subprocesses)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
from support import sweeps
from support.sweeps import ended, get_run, mlflow_runs, sweep_params

from trainflow.core.errors import ServiceError
from trainflow.tune import results, runs
from trainflow.tune import runs as tune_runs
from trainflow.tune.study import PARENT_KEY, PARENT_RUN, Study

optuna.logging.set_verbosity(optuna.logging.WARNING)


# --- the project: iris split in this process, an MLflow database whose tables exist --------------------------------
prepared, project = sweeps.prepared, sweeps.project  # the fixtures, in tests/support/sweeps.py


def test_a_run_is_found_by_its_key_and_only_mlflows_no_means_absent(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST, TEMPORARILY_UNAVAILABLE
    from mlflow.tracking import MlflowClient

    key = runs.new_key()
    assert len(key) == 32 and int(key, 16) >= 0 and runs.new_key() != key
    assert runs.find(project, "trainflow", key) is None  # no such experiment
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    experiment = client.create_experiment("trainflow")
    later = client.create_run(experiment, start_time=2000, tags={runs.KEY_TAG: key}).info.run_id
    first = client.create_run(experiment, start_time=1000, tags={runs.KEY_TAG: key}).info.run_id
    assert later != first
    assert runs.find(project, "trainflow", key) == first  # the earliest started under it
    assert runs.find(project, "trainflow", "other") is None

    slept: list[float] = []
    monkeypatch.setattr(runs.time, "sleep", slept.append)
    search = MlflowClient.search_runs

    def failing(errors: list[BaseException]) -> Callable[..., Any]:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            if errors:
                raise errors.pop(0)
            return search(self, *args, **kwargs)

        return call

    import requests

    locked = MlflowException("database is locked", error_code=TEMPORARILY_UNAVAILABLE)
    monkeypatch.setattr(MlflowClient, "search_runs", failing([locked, requests.exceptions.ConnectionError("down")]))
    assert runs.find(project, "trainflow", key) == first  # the third attempt answered
    assert slept == [1.0, 3.0]
    slept.clear()
    monkeypatch.setattr(MlflowClient, "search_runs", failing([locked, OSError("x"), locked]))
    unanswered = rf"did not answer whether the run with trainflow.tune.run_key={key} exists \(MlflowException"
    with pytest.raises(ServiceError, match=unanswered):
        runs.find(project, "trainflow", key)
    assert slept == [1.0, 3.0]  # three attempts, then raised: never taken for "absent"
    gone = MlflowException("no such experiment", error_code=RESOURCE_DOES_NOT_EXIST)
    monkeypatch.setattr(MlflowClient, "search_runs", failing([gone]))
    assert runs.find(project, "trainflow", key) is None  # "not found" is MLflow's answer


def test_the_studys_mlflow_run_is_made_once_and_ends_with_the_best_trial(project: Path) -> None:
    p = sweep_params(project)
    create = tune_runs.parent_run(p, project)
    s = optuna.create_study()
    create(s)
    key, run_id = s.user_attrs[PARENT_KEY], s.user_attrs[PARENT_RUN]
    run = get_run(project, run_id)
    assert run.info.run_name == "tune-trainflow" and run.info.status == "RUNNING"
    assert run.data.tags[runs.KEY_TAG] == key and run.data.tags["trainflow.tune.role"] == "study"
    assert (run.data.params["tune.study"], run.data.params["tune.trials"]) == ("trainflow", "2")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(runs, "find", None)  # with the run's id recorded, MLflow is not even asked
        create(s)  # the set-up finished again (its process was killed after this step): nothing new
    lost = optuna.create_study()
    lost.set_user_attr(PARENT_KEY, key)  # killed after starting the run, before recording its id
    create(lost)
    assert lost.user_attrs[PARENT_RUN] == run_id
    assert [r.info.run_id for r in mlflow_runs(project)] == [run_id]

    s.add_trial(ended("COMPLETE", 0.25, 0.003, [128]))
    wrapped = Study(s, p, project, 1, "val_loss", True)
    tune_runs.finish_parent(wrapped, results.best(wrapped))
    run = get_run(project, run_id)
    assert run.info.status == "FINISHED" and run.data.metrics["best_val_loss"] == 0.25
    assert run.data.tags["trainflow.tune.best_trial"] == "0"
    assert json.loads(run.data.tags["trainflow.tune.best_params"]) == {"train.lr": 0.003, "model.hidden_sizes": [128]}
    tune_runs.finish_parent(
        Study(optuna.create_study(), p, project, 1, "val_loss", True), None
    )  # no run: nothing to end
