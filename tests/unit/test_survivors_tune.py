"""Sweep behaviour that mutation testing found unguarded (trainflow.tune): when `trainflow tune` starts local worker
processes (only while trials are left), the error that names the workers that stopped, the study's MLflow run made by
a worker that is first to open the study, the axis labels of the optimisation-history plot, and what a Ray trial
reports, how it ends its MLflow run and how it records that run.

The Ray trial (ray_backend.trial) runs in this process with a stand-in `ray` module (its trial id and the reports it
makes), so these tests need no Ray; the project is support/sweeps.py's iris project (its own MLflow store)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest
from optuna.trial import TrialState
from support import sweeps
from support.sweeps import CURRENT, ended, get_run, hand_made, mlflow_runs, stand_in_ray, sweep_params, trial_spec

import trainflow.stages.train
from trainflow import tracking, tune
from trainflow.core.paths import Paths
from trainflow.params import PipelineParams, load_params
from trainflow.tune import ray_backend, results, runs
from trainflow.tune import runs as tune_runs
from trainflow.tune import study as tune_study
from trainflow.tune.study import PARENT_RUN, open_study

prepared, project = sweeps.prepared, sweeps.project  # the iris project, split once per module


def ended_study(root: Path, budget: int) -> None:
    """The study of the project's params with every one of its `budget` trials complete."""
    p, paths = sweep_params(root), Paths(root)
    s = open_study(p, root, budget, *tune_study.hashes(p, paths), on_create=tune_runs.parent_run(p, root))
    for n in range(budget):
        s.study.tell(s.study.ask(), 0.5 - 0.1 * n)  # the WAITING slots, in order
    assert s.terminal() == budget


# --- tune.run: local worker processes --------------------------------------------------------------------------------


def test_workers_are_started_only_while_trials_are_left_and_not_once_the_budget_has_ended(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With tune.workers 2, `trainflow tune` starts worker processes when fewer trials than the budget have ended;
    when exactly the budget has ended it starts none and ends the study."""
    started: list[int] = []

    def work_locally(s: Any, workers: int) -> list[str]:
        started.append(workers)
        return []

    monkeypatch.setattr(tune, "_work_locally", work_locally)
    ended_study(project, 2)
    paths = Paths(project)
    summary = tune.run(sweep_params(project), paths, workers=2)  # 2 of 2 ended
    assert started == []
    assert summary["states"] == {"complete": 2} and summary["best"]["trial"] == 1
    (parent,) = [r for r in mlflow_runs(project) if r.data.tags.get("trainflow.tune.role") == "study"]
    assert parent.info.status == "FINISHED"

    with pytest.raises(tune.TuneIncomplete, match=r"1 of 3 trials did not end"):
        tune.run(sweep_params(project), paths, trials=3, workers=2)  # 2 of 3 ended; the workers ran nothing
    assert started == [2]


def test_a_sweep_whose_workers_stopped_names_each_of_them_in_its_error(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both worker processes exit before ending a trial (one with an error, one killed): the error names them."""
    pids = iter([4100, 4101])

    class Worker:
        def __init__(self, argv: list[str], stdin: Any, env: dict[str, str]) -> None:
            self.stdin = io.BytesIO()
            self.pid = next(pids)
            self.returncode = 1 if env["TRAINFLOW_TUNE_WORKER"] == "0" else -9

        def poll(self) -> int:
            return self.returncode

    monkeypatch.setattr(tune, "subprocess", SimpleNamespace(Popen=Worker, PIPE=-1))
    left = (
        r"tune: 2 of 2 trials did not end \(worker\(s\) 0, 1 stopped; trials left by a stopped worker: none\)\. "
        r"Everything finished is kept"
    )
    with pytest.raises(tune.TuneIncomplete, match=left):
        tune.run(sweep_params(project), Paths(project), workers=2)


# --- tune.work: a worker that opens the study first ------------------------------------------------------------------


def test_a_worker_that_sets_the_study_up_makes_its_mlflow_run(project: Path) -> None:
    """A worker started on its own (the Prefect tune_worker deployment, a worker on another machine) that finds no
    study sets it up, and with it the study's MLflow run, which its trials' runs are children of."""
    p, paths = sweep_params(project), Paths(project)
    data, code = tune_study.hashes(p, paths)
    assert tune.work(p, project, 2, data, code, max_trials=0) == 0
    s = open_study(p, project, 2, data, code)
    (parent,) = mlflow_runs(project)
    assert s.study.user_attrs[PARENT_RUN] == parent.info.run_id
    assert parent.data.tags["trainflow.tune.role"] == "study" and parent.info.status == "RUNNING"


# --- results.py: the plots' axes -------------------------------------------------------------------------------------


def test_the_history_plot_puts_the_trial_on_x_and_the_metric_on_y(
    params_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib.pyplot as plt

    kept: list[Any] = []
    monkeypatch.setattr(results, "_figure", lambda: SimpleNamespace(subplots=plt.subplots, close=kept.append))
    p = load_params(params_file)
    results.write(hand_made(p, [ended("COMPLETE", v, 0.001 * (1 + v), [128]) for v in (0.9, 0.5, 0.7)]), tmp_path)
    history, importance = kept
    try:
        ax = history.axes[0]
        assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == (
            "trial",
            "val_loss",
            "Study trainflow: optimisation history",
        )
        assert importance.axes[0].get_xlabel() == "importance (fANOVA, sums to 1)"
    finally:
        for fig in kept:
            plt.close(fig)


# --- ray_backend.trial, with a stand-in for Ray ----------------------------------------------------------------------


def test_a_ray_trial_that_trains_to_its_end_reports_it_and_finishes_its_mlflow_run(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    history = [{"update": 7, "val_loss": 0.6}, {"update": 14, "val_loss": 0.5}, {"update": 21, "val_loss": 0.55}]

    def setup(params: PipelineParams, paths: Paths, device: Any, group: Any, checkpoints: Path, logger: Any) -> Any:
        def fit(train: Any, val: Any) -> Any:
            for point in history:
                logger.log({"val_loss": point["val_loss"]}, int(point["update"]))
            return SimpleNamespace(history=history, best_update=14, updates=21)

        trainer = SimpleNamespace(fit=fit, resumed_from=None)
        return SimpleNamespace(trainer=trainer, train=None, val=None, discard=lambda: None)

    monkeypatch.setattr(trainflow.stages.train, "setup", setup)
    reports = stand_in_ray(monkeypatch, "t1")
    ray_backend.trial(dict(CURRENT), {**trial_spec(project, sweep_params(project)), "parent": None})

    E = ray_backend.ENDED
    assert reports[-1] == {"val_loss": 0.5, "update": 21, E: 1, "resumed_from_update": -1}
    assert [r["update"] for r in reports[:-1]] == [7, 14, 21]  # each evaluation, for ASHA
    record = json.loads((project / "models/tune/trainflow/ray/t1/run.json").read_text())
    run = get_run(project, record["run_id"])
    assert run.info.status == "FINISHED" and run.data.metrics["best_val_loss"] == 0.5
    assert run.data.tags["trainflow.tune.state"] == "complete"


def test_a_ray_trial_whose_values_the_params_refuse_reports_its_end_as_a_failure(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """min_lr above lr: the trial fails before it trains. Its one report says it ended (ENDED 1, as every trial's
    last report does) and why it failed; read back as Ray returns it, the trial is a failed one."""
    refused = (
        "tune.space={train.lr: {type: categorical, choices: [0.0001]}, "
        "train.min_lr: {type: categorical, choices: [0.001]}}"
    )
    p = sweep_params(project, refused)
    reports = stand_in_ray(monkeypatch, "t1")
    ray_backend.trial({"train.lr": 0.0001, "train.min_lr": 0.001}, {**trial_spec(project, p), "parent": None})

    E, F = ray_backend.ENDED, ray_backend.FAILED
    (report,) = reports
    assert set(report) == {E, F} and report[E] == 1
    assert "train.min_lr (0.001) is above train.lr (0.0001)" in report[F] and "\n" not in report[F]
    assert mlflow_runs(project) == []  # it failed before its run was made

    result = SimpleNamespace(
        path="/ray/exp/trial_t1_1_x",
        config={"train.lr": 0.0001, "train.min_lr": 0.001},
        error=None,
        metrics={**report, "trial_id": "t1"},
        metrics_dataframe=pd.DataFrame(reports),
    )
    s, left = ray_backend._study(p, Paths(project), [result], "val_loss", True, 1)
    assert [(t.state, t.value) for t in s.study.trials] == [(TrialState.FAIL, None)] and left == 0
    assert s.study.trials[0].user_attrs["error"] == report[F]  # trials.csv's error column, as with Optuna


def test_a_ray_trial_whose_run_was_started_but_not_recorded_finds_it_and_records_its_id(project: Path) -> None:
    """The process was killed after it started the trial's run under the key run.json holds, before it wrote the
    run's id: the restored trial finds that run by its key, writes its id into run.json and carries it on."""
    p = sweep_params(project)
    record = project / "models/tune/trainflow/ray/t1/run.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"key": "k-1", "run_id": None}))
    started = tracking.TrainingRun(project, "trainflow", project / "unused.json")
    started.start({}, tags={runs.KEY_TAG: "k-1"})

    run = ray_backend._child_run(project, p, p, "t1", {"data_hash": "dh", "parent": None}, record)
    assert run.run_id == started.run_id
    assert json.loads(record.read_text()) == {"key": "k-1", "run_id": started.run_id}
    assert [r.info.run_id for r in mlflow_runs(project)] == [started.run_id]  # no second run
