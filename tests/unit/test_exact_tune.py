"""Whole outputs of a sweep, pinned exactly (trainflow.tune): every report a Ray trial makes and the MLflow run it
leaves in each way it can end, how `ray_backend.run` sets Ray up (search, scheduler, resources, what each trial is
given), the lines `trainflow tune` prints and the summary it returns, trials.csv of a tiny study, the MLflow run of an
Optuna trial, and what the worker process prints.

Ray is a stand-in module (its trial id and the reports a trial makes) or, for `ray_backend.run`, Ray's own module
with its Tuner, search and scheduler replaced by recorders; training is the train stage's `setup` replaced by one that
logs a fixed history. Expected values are written out by hand from those histories; the project is
support/sweeps.py's iris project (its own MLflow store)."""

from __future__ import annotations

import functools
import io
import json
import math
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest
from support import sweeps
from support.sweeps import CURRENT, mlflow_runs, stand_in_ray, sweep_params, trial_spec

import trainflow.stages.train
from trainflow import tune
from trainflow.core.errors import DiskFullError, UserError
from trainflow.core.paths import Paths
from trainflow.engine import distributed
from trainflow.params import PipelineParams
from trainflow.tune import ray_backend, runs, worker
from trainflow.tune import runs as tune_runs
from trainflow.tune import study as tune_study
from trainflow.tune.study import PARENT_RUN, claim, open_study

prepared, project = sweeps.prepared, sweeps.project  # the iris project, split once per module

E, F = ray_backend.ENDED, ray_backend.FAILED


def own_tags(run: Any) -> dict[str, str]:
    """A run's tags less those MLflow adds itself (mlflow.runName, ...), but with its parent."""
    return {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.") or k == "mlflow.parentRunId"}


def training(
    monkeypatch: pytest.MonkeyPatch,
    history: list[dict[str, float]],
    best: int,
    resumed_from: int | None = None,
    fails: BaseException | None = None,
    extra: list[tuple[dict[str, float], int]] = (),  # type: ignore[assignment]
) -> list[dict[str, Any]]:
    """The train stage's `setup` replaced: its trainer logs `extra` then `history` through the trial's logger and ends
    at `best` (or raises `fails` after logging). Returns what each call was given."""
    given: list[dict[str, Any]] = []

    def setup(params: PipelineParams, paths: Paths, device: Any, group: Any, checkpoints: Path, logger: Any) -> Any:
        call: dict[str, Any] = {"params": params, "root": paths.root, "checkpoints": checkpoints, "discarded": False,
                                "device": device, "group": group}  # fmt: skip
        given.append(call)

        def fit(train: Any, val: Any) -> Any:
            call["data"] = (train, val)
            for metrics, step in extra:
                logger.log(metrics, step)
            for point in history:
                logger.log({k: v for k, v in point.items() if k != "update"}, int(point["update"]))
            if fails is not None:
                raise fails
            return SimpleNamespace(history=history, best_update=best, updates=int(history[-1]["update"]))

        def discard() -> None:
            call["discarded"] = True

        trainer = SimpleNamespace(fit=fit, resumed_from=resumed_from)
        return SimpleNamespace(trainer=trainer, train="train-set", val="val-set", discard=discard)

    monkeypatch.setattr(trainflow.stages.train, "setup", setup)
    return given


HISTORY = [{"update": 7, "val_loss": 0.6}, {"update": 14, "val_loss": 0.5}, {"update": 21, "val_loss": 0.55}]


def ray_trial(project: Path, monkeypatch: pytest.MonkeyPatch, parent: str | None = "p-1") -> list[dict[str, Any]]:
    reports = stand_in_ray(monkeypatch, "t1")
    ray_backend.trial(dict(CURRENT), {**trial_spec(project, sweep_params(project)), "parent": parent})
    return reports


def the_run(project: Path) -> Any:
    (run,) = mlflow_runs(project)
    return run


# --- ray_backend.trial: every report, and the run it leaves ----------------------------------------------------------


def test_a_ray_trial_reports_each_finite_evaluation_then_its_end_and_leaves_a_finished_child_run(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Points without the metric, or with a non-finite one, go to MLflow only; each evaluation goes to Ray with its
    update; the last report is the value at the best update (14), the last update (21) and that it ended."""
    extra = [({"train_loss": 1.25}, 3), ({"val_loss": math.nan}, 4)]
    given = training(monkeypatch, HISTORY, 14, extra=extra)
    reports = ray_trial(project, monkeypatch)
    assert reports == [
        {"val_loss": 0.6, "update": 7},
        {"val_loss": 0.5, "update": 14},
        {"val_loss": 0.55, "update": 21},
        {"val_loss": 0.5, "update": 21, E: 1, "resumed_from_update": -1},
    ]
    trial_dir = project / "models/tune/trainflow/ray/t1"
    ((call),) = given
    assert (call["root"], call["checkpoints"], call["discarded"]) == (project, trial_dir / "checkpoints", True)
    assert call["data"] == ("train-set", "val-set") and str(call["device"]) == "cpu"  # train.device auto, no GPU
    assert isinstance(call["group"], distributed.Group) and call["group"].world_size == 1
    assert call["params"].train.progress is False and call["params"].model.hidden_sizes == [256, 128]

    run = the_run(project)
    key = run.data.tags[runs.KEY_TAG]
    assert json.loads((trial_dir / "run.json").read_text()) == {"key": key, "run_id": run.info.run_id}
    assert (run.info.run_name, run.info.status) == ("trainflow-t1", "FINISHED")
    assert own_tags(run) == {
        "trainflow.tune.study": "trainflow",
        "trainflow.tune.trial": "t1",
        "trainflow.tune.backend": "ray",
        "trainflow.data_sha256": "dh",
        "git_commit": "c0ffee",
        "git_dirty": "false",
        runs.KEY_TAG: key,
        "mlflow.parentRunId": "p-1",
        "trainflow.tune.state": "complete",
    }
    assert run.data.metrics["best_val_loss"] == 0.5 and run.data.metrics["train_loss"] == 1.25
    assert (run.data.params["train.lr"], run.data.params["model.hidden_sizes"]) == ("0.002", "[256, 128]")
    assert run.data.params["train.progress"] == "False"


def test_a_resumed_ray_trial_says_from_which_update_and_one_without_a_parent_has_no_parent_tag(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    training(monkeypatch, HISTORY[:2], 7, resumed_from=7)
    reports = ray_trial(project, monkeypatch, parent=None)
    assert reports[-1] == {"val_loss": 0.6, "update": 14, E: 1, "resumed_from_update": 7}
    assert "mlflow.parentRunId" not in the_run(project).data.tags


def test_a_ray_trial_without_a_finite_value_at_its_best_update_ends_failed(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    training(monkeypatch, HISTORY, 99)  # no record at update 99
    reports = ray_trial(project, monkeypatch)
    assert len(reports) == 4 and reports[:3] == [
        {"val_loss": v, "update": u} for u, v in ((7, 0.6), (14, 0.5), (21, 0.55))
    ]
    last = reports[-1]
    assert set(last) == {"val_loss", "update", E, "resumed_from_update"} and math.isnan(last["val_loss"])
    assert (last["update"], last[E], last["resumed_from_update"]) == (21, 1, -1)
    run = the_run(project)
    assert run.info.status == "FAILED" and run.data.tags["trainflow.tune.state"] == "failed"
    assert "best_val_loss" not in run.data.metrics and "trainflow.tune.error" not in run.data.tags


def test_a_ray_trial_whose_training_refuses_its_values_reports_why_on_one_line_and_fails_its_run(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The message on one line in the report; the run's error tag is its first 5000 characters (MLflow's limit)."""
    why = "train.batch_size: auto found no batch\n   that fits " + "x" * 6000
    given = training(monkeypatch, HISTORY[:1], 7, fails=UserError(why))
    reports = ray_trial(project, monkeypatch)
    flat = "train.batch_size: auto found no batch that fits " + "x" * 6000
    assert reports == [{"val_loss": 0.6, "update": 7}, {E: 1, F: flat}]
    assert given[0]["discarded"] is True
    run = the_run(project)
    assert run.info.status == "FAILED"
    assert run.data.tags["trainflow.tune.state"] == "failed"
    assert run.data.tags["trainflow.tune.error"] == flat[:5000]
    assert "best_val_loss" not in run.data.metrics


@pytest.mark.parametrize("stop", [DiskFullError("models/tune: no space left"), KeyboardInterrupt()])
def test_a_ray_trial_stopped_by_a_full_disk_or_an_interrupt_raises_and_fails_its_run_untagged(
    project: Path, monkeypatch: pytest.MonkeyPatch, stop: BaseException
) -> None:
    """Not the values' fault: Ray sees the error (a rerun resumes the trial); no end is reported."""
    training(monkeypatch, HISTORY[:1], 7, fails=stop)
    with pytest.raises(type(stop)):
        ray_trial(project, monkeypatch)
    run = the_run(project)
    assert run.info.status == "FAILED"
    assert "trainflow.tune.state" not in run.data.tags and "trainflow.tune.error" not in run.data.tags


def test_a_ray_trial_whose_values_the_params_refuse_reports_exactly_which(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused = (
        "tune.space={train.lr: {type: categorical, choices: [0.0001]}, "
        "train.min_lr: {type: categorical, choices: [0.001]}}"
    )
    p = sweep_params(project, refused)
    reports = stand_in_ray(monkeypatch, "t9")
    ray_backend.trial({"train.lr": 0.0001, "train.min_lr": 0.001}, {**trial_spec(project, p), "parent": None})
    with pytest.raises(UserError) as err:
        from trainflow.params import with_values

        with_values(p, {"train.lr": 0.0001, "train.min_lr": 0.001}, "x")
    problems = "; ".join(f"{path}: {problem}" for path, problem in err.value.problems)  # type: ignore[attr-defined]
    assert reports == [{E: 1, F: problems}]
    assert not (project / "models/tune/trainflow/ray/t9").exists()


# --- ray_backend.run: how Ray is set up ------------------------------------------------------------------------------


RAY_ENV = {
    "TRAINFLOW_FLAG": "1",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "4",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}


class Recorder:
    """Stands for a Ray class: keeps what it was made with."""

    made: list[dict[str, Any]]

    def __init__(self, **kwargs: Any) -> None:
        type(self).made.append(kwargs)
        self.kwargs = kwargs


def rigged_ray(monkeypatch: pytest.MonkeyPatch, restorable: bool = False, initialized: bool = False) -> dict[str, Any]:
    """Ray's module with its Tuner, search, scheduler, resources and init replaced by recorders; fit() returns no
    results. Returns what was recorded."""
    ray = pytest.importorskip("ray", reason="tune.backend ray is an optional extra: pip install -e '.[ray]'")
    from ray import tune as ray_tune
    from ray.tune import schedulers
    from ray.tune.search import optuna as ray_optuna

    seen: dict[str, Any] = {"init": [], "restore": [], "tuner": []}

    class Search(Recorder):
        made = []

    class Asha(Recorder):
        made = []

    class Tuner:
        def __init__(self, trainable: Any, tune_config: Any, run_config: Any) -> None:
            seen["tuner"].append({"trainable": trainable, "tune_config": tune_config, "run_config": run_config})

        @staticmethod
        def can_restore(path: str) -> bool:
            seen["can_restore"] = path
            return restorable

        @staticmethod
        def restore(path: str, **kwargs: Any) -> Any:
            seen["restore"].append((path, kwargs))
            return Tuner(kwargs["trainable"], None, None)

        def fit(self) -> list[Any]:
            return []

    def with_parameters(trainable: Any, **kw: Any) -> Any:
        seen["with_parameters"] = (trainable, kw)
        return "with-parameters"

    def with_resources(trainable: Any, resources: Any) -> Any:
        seen["with_resources"] = (trainable, resources)
        return "trainable"

    def sampler(t: Any, seed: int) -> str:
        seen["sampler"] = (t.sampler, seed)
        return "the-sampler"

    monkeypatch.setattr(ray, "is_initialized", lambda: initialized)
    monkeypatch.setattr(ray, "init", lambda **kw: seen["init"].append(kw))
    monkeypatch.setattr(ray_tune, "with_parameters", with_parameters)
    monkeypatch.setattr(ray_tune, "with_resources", with_resources)
    monkeypatch.setattr(ray_tune, "Tuner", Tuner)
    monkeypatch.setattr(ray_optuna, "OptunaSearch", Search)
    monkeypatch.setattr(schedulers, "ASHAScheduler", Asha)
    monkeypatch.setattr(ray_backend, "_sampler", sampler)

    def parent(params: PipelineParams, paths: Paths, experiment: Path) -> str:
        seen["parent"] = experiment
        return "p-1"

    monkeypatch.setattr(ray_backend, "_parent", parent)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    for key in [k for k in os.environ if k.startswith(("MLFLOW_", "TRAINFLOW_", "RAY_ADDRESS"))]:
        monkeypatch.delenv(key)
    for key, value in RAY_ENV.items():  # all of MLflow's settings: tracking.configure adds none
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("OTHER_SETTING", "3")  # not passed on
    seen["search"], seen["asha"] = Search.made, Asha.made
    return seen


def test_a_ray_sweep_starts_ray_with_its_cores_searches_from_the_current_params_and_stops_trials_with_asha(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainflow.engine.fingerprint import data_hash

    seen = rigged_ray(monkeypatch)
    p, paths = sweep_params(project, "tune.backend=ray", "tune.seed=5"), Paths(project)
    s, left = ray_backend.run(p, paths, 4, 3)
    uri = f"sqlite:///{project.resolve() / 'mlflow.db'}"  # none set: the project's own store

    experiment = project / "models/tune/ray/trainflow"
    assert seen["parent"] == experiment and seen["can_restore"] == str(experiment)
    assert seen["init"] == [
        {
            "address": None,
            "num_cpus": 8,
            "include_dashboard": False,
            "configure_logging": False,
            "log_to_driver": False,
            "runtime_env": {"env_vars": {**RAY_ENV, "MLFLOW_TRACKING_URI": uri}},
        }
    ]
    trainable, spec = seen["with_parameters"]
    assert trainable is ray_backend.trial
    assert spec == {
        "spec": {
            "root": str(project),
            "params": p.model_dump(mode="json"),
            "metric": "val_loss",
            "data_hash": data_hash(paths),
            "parent": "p-1",
        }
    }
    assert seen["with_resources"] == ("with-parameters", {"cpu": 2})  # 8 cores, 3 trials at a time
    assert seen["sampler"] == ("tpe", 5)
    ((search),) = seen["search"]
    space = search.pop("space")
    assert isinstance(space, functools.partial) and space.func is ray_backend._define
    assert space.keywords == {"dims": p.tune.space}
    assert search == {"metric": "val_loss", "mode": "min", "sampler": "the-sampler", "points_to_evaluate": [CURRENT]}
    assert seen["asha"] == [
        {
            "time_attr": "training_iteration",
            "metric": "val_loss",
            "mode": "min",
            "grace_period": 1,
            "reduction_factor": 2,
            "max_t": 10**6,
        }
    ]
    ((tuner),) = seen["tuner"]
    assert tuner["trainable"] == "trainable"
    config, run_config = tuner["tune_config"], tuner["run_config"]
    assert (config.num_samples, config.max_concurrent_trials) == (4, 3)
    assert isinstance(config.search_alg, Recorder) and isinstance(config.scheduler, Recorder)
    assert (run_config.name, run_config.storage_path, run_config.verbose) == (
        "trainflow",
        str(project / "models/tune/ray"),
        0,
    )
    assert capsys.readouterr().err == (
        "[trainflow] tune: study 'trainflow' (ray): 4 trials, 3 at a time; optimising val_loss (minimize), ASHA on\n"
    )
    assert left == 4 and s.study.user_attrs == {PARENT_RUN: "p-1"}
    assert (s.name, s.budget, s.metric, s.minimize, s.root) == ("trainflow", 4, "val_loss", True, project)


def test_a_ray_sweep_without_a_pruner_or_off_the_current_params_and_on_a_cluster(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """tune.pruner none: no scheduler; maximised metric: mode max; the current params outside the space: no first
    point; RAY_ADDRESS set: Ray connects there and counts the cluster's cores itself."""
    seen = rigged_ray(monkeypatch)
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    p = sweep_params(
        project,
        "tune.pruner=none",
        "tune.metric=val_accuracy",
        "tune.sampler=random",
        "tune.space={train.lr: {type: float, low: 0.01, high: 0.1}}",
    )
    ray_backend.run(p, Paths(project), 2, 16)
    ((init),) = seen["init"]
    assert (init["address"], init["num_cpus"]) == ("ray://head:10001", None)
    assert seen["with_resources"][1] == {"cpu": 1}  # 8 cores, 16 at a time: at least one each
    assert seen["sampler"] == ("random", p.seed)
    ((search),) = seen["search"]
    assert (search["mode"], search["metric"], search["points_to_evaluate"]) == ("max", "val_accuracy", None)
    assert seen["tuner"][0]["tune_config"].scheduler is None
    assert capsys.readouterr().err == (
        "[trainflow] tune: study 'trainflow' (ray): 2 trials, 16 at a time; optimising val_accuracy (maximize), "
        "ASHA off\n"
    )


def test_a_grid_ray_sweep_has_no_first_point_and_a_running_ray_is_not_started_again(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = rigged_ray(monkeypatch, initialized=True)
    p = sweep_params(
        project, "tune.sampler=grid", "tune.space={model.dropout: {type: float, low: 0.0, high: 0.2, step: 0.1}}"
    )
    ray_backend.run(p, Paths(project), 2, 1)
    assert seen["init"] == [] and seen["search"][0]["points_to_evaluate"] is None
    assert seen["with_resources"][1] == {"cpu": 8}


def test_a_ray_sweep_with_a_saved_experiment_restores_it_resuming_unfinished_and_errored_trials(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = rigged_ray(monkeypatch, restorable=True)
    ray_backend.run(sweep_params(project, "tune.backend=ray"), Paths(project), 2, 1)
    experiment = str(project / "models/tune/ray/trainflow")
    assert seen["restore"] == [
        (experiment, {"trainable": "trainable", "resume_unfinished": True, "resume_errored": True})
    ]
    assert seen["search"] == [] and seen["asha"] == []
    assert capsys.readouterr().err == (
        f"[trainflow] tune: study 'trainflow' (ray): restoring {experiment}; unfinished trials resume from their "
        "checkpoints\n"
    )


# --- tune.run (Optuna): the lines it prints, its summary, trials.csv, the runs it leaves ----------------------------

ONE_LR = "tune.space={train.lr: {type: categorical, choices: [0.002]}}"  # every trial: lr 0.002 (params.yaml's)


def scripted_training(
    monkeypatch: pytest.MonkeyPatch, histories: list[list[dict[str, float]]], best: list[int]
) -> None:
    """Trial n's trainer logs histories[n] and ends at best[n] (in the order the trials are run)."""
    calls = iter(range(len(histories)))

    def setup(params: PipelineParams, paths: Paths, device: Any, group: Any, checkpoints: Path, logger: Any) -> Any:
        n = next(calls)

        def fit(train: Any, val: Any) -> Any:
            for point in histories[n]:
                logger.log({"val_loss": point["val_loss"]}, int(point["update"]))
            return SimpleNamespace(history=histories[n], best_update=best[n])

        trainer = SimpleNamespace(fit=fit, resumed_from=None)
        return SimpleNamespace(trainer=trainer, train=None, val=None, discard=lambda: None)

    monkeypatch.setattr(trainflow.stages.train, "setup", setup)


def said(err: str) -> list[str]:
    """The tune's own lines of stderr."""
    return [line for line in err.splitlines() if line.startswith("[trainflow] tune: ")]


def test_a_two_trial_sweep_prints_each_step_and_returns_its_whole_summary_and_trials_csv(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainflow.engine.fingerprint import data_hash

    scripted_training(
        monkeypatch,
        [[{"update": 7, "val_loss": 0.5}], [{"update": 7, "val_loss": 0.45}, {"update": 14, "val_loss": 0.4}]],
        [7, 14],
    )
    paths, p = Paths(project), sweep_params(project, ONE_LR, "tune.pruner=none")
    capsys.readouterr()
    summary = tune.run(p, paths, apply=True)

    applied = ["train.lr=0.002", 'register.tags.tune_study="trainflow"', "register.tags.tune_trial='1'"]
    assert said(capsys.readouterr().err) == [
        "[trainflow] tune: study 'trainflow': 0/2 trials ended; 1 worker(s); optimising val_loss (minimize); "
        "storage models/tune/journal.log",
        "[trainflow] tune: trial 0 complete: val_loss 0.5 (lr=0.002)",
        "[trainflow] tune: trial 1 complete: val_loss 0.4 (lr=0.002)",
        f"[trainflow] tune: applied trial 1 to {paths.params}: {', '.join(applied)}",
    ]
    best = {
        "study": "trainflow",
        "trial": 1,
        "metric": "val_loss",
        "direction": "minimize",
        "value": 0.4,
        "params": {"train.lr": 0.002},
    }
    assert summary == {
        "study": "trainflow",
        "trials": 2,
        "states": {"complete": 2},
        "best": best,
        "results": "reports/tune/ (trials.csv, best_params.yaml, optimization_history.png, param_importances.png)",
        "applied": applied,
    }

    all_runs = mlflow_runs(project)
    (parent,) = [r for r in all_runs if r.data.tags.get("trainflow.tune.role") == "study"]
    children = sorted((r for r in all_runs if r is not parent), key=lambda r: r.data.tags["trainflow.tune.trial"])
    got = pd.read_csv(paths.reports / "tune/trials.csv")
    assert (got["seconds"] >= 0).all()
    want = pd.DataFrame(
        {
            "trial": [0, 1],
            "state": ["complete", "complete"],
            "val_loss": [0.5, 0.4],
            "last_update": [7, 14],
            "train.lr": [0.002, 0.002],
            "resumed_from_update": [math.nan, math.nan],
            "seconds": got["seconds"],
            "mlflow_run_id": [r.info.run_id for r in children],
            "error": [math.nan, math.nan],
        }
    )
    pd.testing.assert_frame_equal(got, want, check_dtype=False)

    assert (parent.info.run_name, parent.info.status) == ("tune-trainflow", "FINISHED")
    assert own_tags(parent) == {
        "trainflow.tune.study": "trainflow",
        "trainflow.tune.role": "study",
        runs.KEY_TAG: parent.data.tags[runs.KEY_TAG],
        "trainflow.tune.best_trial": "1",
        "trainflow.tune.best_params": '{"train.lr": 0.002}',
    }
    assert parent.data.metrics == {"best_val_loss": 0.4}
    assert (parent.data.params["tune.study"], parent.data.params["tune.pruner"]) == ("trainflow", "none")
    for n, (child, value) in enumerate(zip(children, (0.5, 0.4))):
        assert (child.info.run_name, child.info.status) == (f"trainflow-trial-{n}", "FINISHED")
        assert own_tags(child) == {
            "trainflow.tune.study": "trainflow",
            "trainflow.tune.trial": str(n),
            "trainflow.data_sha256": data_hash(paths),
            "git_commit": "c0ffee",
            "git_dirty": "false",
            runs.KEY_TAG: child.data.tags[runs.KEY_TAG],
            "mlflow.parentRunId": parent.info.run_id,
            "trainflow.tune.state": "complete",
        }
        assert child.data.metrics == {"val_loss": value, "best_val_loss": value}
        assert child.data.params["train.lr"] == "0.002"
    s = open_study(p, project, 2, *tune_study.hashes(p, paths))
    assert [(t.user_attrs["mlflow_run_id"], t.user_attrs["mlflow_run_key"]) for t in s.trials()] == [
        (r.info.run_id, r.data.tags[runs.KEY_TAG]) for r in children
    ]


def test_a_trial_whose_values_the_params_refuse_fails_saying_why_in_its_line_its_run_and_trials_csv(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    refused = (
        "tune.space={train.lr: {type: categorical, choices: [0.0001]}, "
        "train.min_lr: {type: categorical, choices: [0.001]}}"
    )
    paths, p = Paths(project), sweep_params(project, refused, "tune.pruner=none")
    with pytest.raises(UserError) as err:
        from trainflow.params import with_values

        with_values(p, {"train.lr": 0.0001, "train.min_lr": 0.001}, "x")
    why = "; ".join(f"{path}: {problem}" for path, problem in err.value.problems)  # type: ignore[attr-defined]
    capsys.readouterr()
    summary = tune.run(p, paths, trials=1)
    assert said(capsys.readouterr().err) == [
        "[trainflow] tune: study 'trainflow': 0/1 trials ended; 1 worker(s); optimising val_loss (minimize); "
        "storage models/tune/journal.log",
        f"[trainflow] tune: trial 0 failed: {why} (lr=0.0001, min_lr=0.001)",
    ]
    assert summary["states"] == {"failed": 1} and summary["best"] is None and "applied" not in summary
    got = pd.read_csv(paths.reports / "tune/trials.csv")
    assert got.loc[0, ["state", "error", "train.lr", "train.min_lr"]].tolist() == ["failed", why, 0.0001, 0.001]
    (child,) = [r for r in mlflow_runs(project) if "mlflow.parentRunId" in r.data.tags]
    assert child.info.status == "FAILED" and child.data.metrics == {}
    assert (child.data.tags["trainflow.tune.state"], child.data.tags["trainflow.tune.error"]) == ("failed", why)
    assert (child.data.params["train.lr"], child.data.params["train.min_lr"]) == ("0.0001", "0.001")  # as tried


def test_a_sweep_whose_worker_ran_nothing_says_exactly_what_is_left_and_how_to_resume(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tune, "work", lambda *args: 0)
    with pytest.raises(tune.TuneIncomplete) as err:
        tune.run(sweep_params(project), Paths(project), trials=3)
    assert str(err.value) == (
        "tune: 3 of 3 trials did not end (trials left by a stopped worker: none). Everything finished is kept; rerun "
        "`trainflow tune` to resume them from their checkpoints."
    )


def test_a_sweep_whose_last_trial_runs_elsewhere_says_so_and_leaves_the_studys_run_open(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    p, paths = sweep_params(project, "tune.storage=models/tune/other.log"), Paths(project)
    elsewhere = open_study(p, project, 1, *tune_study.hashes(p, paths), on_create=tune_runs.parent_run(p, project))
    held = claim(elsewhere)
    assert held is not None
    capsys.readouterr()
    summary = tune.run(p, paths, trials=1)
    held.release()
    assert said(capsys.readouterr().err) == [
        "[trainflow] tune: study 'trainflow': 0/1 trials ended; 1 worker(s); optimising val_loss (minimize); "
        "storage models/tune/other.log",
        "[trainflow] tune: 1 trial(s) are still running in another worker; reports/tune/ holds them once they end",
    ]
    assert summary == {
        "study": "trainflow",
        "trials": 1,
        "states": {"running": 1},
        "best": None,
        "results": "reports/tune/ (trials.csv, best_params.yaml, optimization_history.png, param_importances.png)",
        "running_elsewhere": 1,
    }
    (parent,) = mlflow_runs(project)
    assert parent.info.status == "RUNNING"


def test_local_workers_show_ended_trials_as_they_end_and_each_stopped_one_with_how_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three workers: one runs for a second and exits cleanly, one exits 2, one is killed (SIGKILL)."""
    codes = {"0": [None, 0], "1": [2], "2": [-9]}
    slept: list[float] = []

    class Worker:
        def __init__(self, argv: list[str], stdin: Any, env: dict[str, str]) -> None:
            self.stdin = io.BytesIO()
            self.pid = 500 + int(env["TRAINFLOW_TUNE_WORKER"])
            self.codes = list(codes[env["TRAINFLOW_TUNE_WORKER"]])
            self.returncode: int | None = None

        def poll(self) -> int | None:
            self.returncode = self.codes.pop(0) if len(self.codes) > 1 else self.codes[0]
            return self.returncode

    ended = iter([1, 3, 4])  # at the start, after the second, at the end
    study = SimpleNamespace(
        budget=4, root=tmp_path, params=SimpleNamespace(model_dump=lambda mode: {}), terminal=lambda: next(ended)
    )
    monkeypatch.setattr(tune, "subprocess", SimpleNamespace(Popen=Worker, PIPE=-1))
    monkeypatch.setattr(tune, "time", SimpleNamespace(sleep=slept.append))
    capsys.readouterr()
    assert tune._work_locally(study, 3) == ["1", "2"]
    lines = capsys.readouterr().err.splitlines()
    assert slept == [1.0]
    assert [line.split(", ")[0] for line in lines[:2]] == ["tune: 3/4 trial (75%)", "tune: 4/4 trial (100%)"]
    assert lines[2:] == [
        "[trainflow] tune: worker 1 (pid 501) stopped: exit code 2",
        "[trainflow] tune: worker 2 (pid 502) stopped: killed by signal 9",
    ]


# --- worker.py: what the process prints ------------------------------------------------------------------------------


def test_the_worker_prints_how_many_trials_it_ran_or_the_error_alone(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainflow.core.errors import ServiceError

    p = sweep_params(project)
    results = iter([2, ServiceError("MLflow did not answer"), UserError("tune: study 'x' was begun elsewhere")])

    def work(*args: Any) -> int:
        out = next(results)
        if isinstance(out, Exception):
            raise out
        return out

    monkeypatch.setattr(tune, "work", work)
    codes = []
    outputs = []
    for _ in range(3):
        monkeypatch.setattr(
            sys,
            "stdin",
            io.StringIO(json.dumps({"root": str(project), "params": p.model_dump(mode="json"), "budget": 2})),
        )
        codes.append(worker.main())
        captured = capsys.readouterr()
        outputs.append((captured.out, captured.err))
    assert codes == [0, ServiceError("x").exit_code, UserError("x").exit_code] and codes[1] != codes[2]
    assert outputs == [
        ('{"trials_run": 2}\n', ""),
        ("", "error: MLflow did not answer\n"),
        ("", "error: tune: study 'x' was begun elsewhere\n"),
    ]


# --- results.py: the files of reports/tune/, as text and as drawn ---------------------------------------------------


def kept_figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The figures results.write draws, kept open (closed by the caller) instead of closed once saved."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from trainflow.tune import results

    kept: list[Any] = []
    monkeypatch.setattr(results, "_figure", lambda: SimpleNamespace(subplots=plt.subplots, close=kept.append))
    return kept


def tiny_study(params_file: Path, minimize: bool = True) -> Any:
    """Trials 0-4 of the default space: complete 0.5, pruned 0.8, complete 0.3 (resumed at update 7), running,
    failed."""
    from datetime import datetime, timedelta

    from optuna.trial import TrialState, create_trial
    from support.sweeps import ended, hand_made

    from trainflow.params import load_params

    start = datetime(2026, 1, 1, 12, 0, 0)
    rows = [
        ended("COMPLETE", 0.5, 0.001, [128], intermediate_values={7: 0.6, 14: 0.5}, user_attrs={"mlflow_run_id": "r0"}),
        ended("PRUNED", 0.8, 0.004, [256, 128], intermediate_values={7: 0.8}),
        ended("COMPLETE", 0.3, 0.002, [512, 256], intermediate_values={7: 0.4, 21: 0.3},
              user_attrs={"resumed_from_update": 7}),
        create_trial(state=TrialState.RUNNING, params={}, distributions={}),
        ended("FAIL", None, 0.0002, [128], user_attrs={"error": "model: no numbered layers"}),
    ]  # fmt: skip
    for n, t in enumerate(rows):
        if t.state != TrialState.RUNNING:
            t.datetime_start, t.datetime_complete = start, start + timedelta(seconds=2 * n + 1)
    return hand_made(load_params(params_file), rows, minimize=minimize)


def test_trials_csv_and_the_history_are_written_as_this_exact_text(
    params_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Updates as whole numbers, lists as JSON text, a running trial with its state, blanks where nothing is known."""
    from trainflow.tune import results

    kept = kept_figures(monkeypatch)
    try:
        top = results.write(tiny_study(params_file), tmp_path)
    finally:
        import matplotlib.pyplot as plt

        for fig in kept:
            plt.close(fig)
    assert (tmp_path / "trials.csv").read_text() == (
        "trial,state,val_loss,last_update,train.lr,model.hidden_sizes,resumed_from_update,seconds,mlflow_run_id,error\n"
        "0,complete,0.5,14,0.001,[128],,1.0,r0,\n"
        '1,pruned,0.8,7,0.004,"[256, 128]",,3.0,,\n'
        '2,complete,0.3,21,0.002,"[512, 256]",7,5.0,,\n'
        "3,running,,,,,,,,\n"
        "4,failed,,,0.0002,[128],,9.0,,model: no numbered layers\n"
    )
    assert (tmp_path / "history.csv").read_text() == (
        "trial,state,value,best\n0,complete,0.5,0.5\n1,pruned,0.8,\n2,complete,0.3,0.3\n"
    )
    assert (tmp_path / "best_params.yaml").read_text() == (
        "study: trainflow\ntrial: 2\nmetric: val_loss\ndirection: minimize\nvalue: 0.3\n"
        "params:\n  train.lr: 0.002\n  model.hidden_sizes:\n  - 512\n  - 256\n"
    )
    assert top is not None and top["params"] == {"train.lr": 0.002, "model.hidden_sizes": [512, 256]}


def test_the_history_plot_draws_complete_and_pruned_trials_apart_and_the_best_so_far_as_a_step(
    params_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgba
    from PIL import Image

    from trainflow.tune import results

    kept = kept_figures(monkeypatch)
    results.write(tiny_study(params_file, minimize=False), tmp_path)
    history, importance = kept
    try:
        ax = history.axes[0]
        complete, pruned = ax.collections
        assert complete.get_offsets().tolist() == [[0, 0.5], [2, 0.3]]
        assert pruned.get_offsets().tolist() == [[1, 0.8]]
        assert [tuple(c.get_facecolor()[0]) for c in (complete, pruned)] == [to_rgba("tab:blue"), to_rgba("tab:gray")]
        assert (complete.get_zorder(), pruned.get_zorder()) == (2, 2)
        (step,) = ax.lines
        assert list(step.get_xdata()) == [0, 1, 2]
        assert [v if v == v else None for v in step.get_ydata()] == [0.5, None, 0.5]  # maximised: 0.3 is not better
        assert (step.get_drawstyle(), to_rgba(step.get_color())) == ("steps-post", to_rgba("tab:red"))
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["complete (2)", "pruned (1)", "best so far"]
        assert tuple(history.get_size_inches()) == (7, 4)

        bars = importance.axes[0]
        assert bars.get_title() == "Parameter importances"
        assert tuple(importance.get_size_inches()) == (7, 2.2)  # lr and hidden_sizes varied: a row each
        assert len(bars.patches) == 2
    finally:
        for fig in kept:
            plt.close(fig)
    for name, size in (("optimization_history.png", (700, 400)), ("param_importances.png", (700, 220))):
        with Image.open(tmp_path / name) as png:
            assert png.size == size and "Software" not in png.info  # 100 dpi, no matplotlib version stamp


def test_the_importance_plot_has_a_bar_per_param_largest_on_top(
    params_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgba
    from PIL import Image

    from trainflow.tune import results

    kept = kept_figures(monkeypatch)
    importance = pd.DataFrame({"param": ["train.lr", "model.dropout"], "importance": [0.75, 0.25]})
    results._importance_png(importance, tmp_path / "imp.png")
    (fig,) = kept
    try:
        ax = fig.axes[0]
        assert [p.get_width() for p in ax.patches] == [0.25, 0.75]  # barh draws bottom-up: the largest on top
        assert [t.get_text() for t in ax.get_yticklabels()] == ["model.dropout", "train.lr"]
        assert {to_rgba(p.get_facecolor()) for p in ax.patches} == {to_rgba("tab:blue")}
        assert (ax.get_xlabel(), ax.get_title()) == ("importance (fANOVA, sums to 1)", "Parameter importances")
        assert tuple(fig.get_size_inches()) == (7, 2.2)
    finally:
        plt.close(fig)
    with Image.open(tmp_path / "imp.png") as png:
        assert png.size == (700, 220) and "Software" not in png.info
    results._importance_png(pd.DataFrame(columns=["param", "importance"]), tmp_path / "none.png")
    with Image.open(tmp_path / "none.png") as png:
        assert png.size == (700, 170)  # no importances: one row's room
    for fig in kept[1:]:
        plt.close(fig)


# --- ray_backend._study: Ray's results as the trials of trials.csv -------------------------------------------------


def test_ray_results_become_trials_with_exactly_these_values_attrs_and_times(
    params_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from optuna.trial import TrialState

    from trainflow.params import load_params

    marked: list[str] = []
    monkeypatch.setattr(ray_backend, "_mark_pruned", marked.append)
    for trial_id, record in (("a", {"key": "k", "run_id": "run-a"}), ("c", {"key": "k3", "run_id": "run-c"})):
        path = tmp_path / "models/tune/trainflow/ray" / trial_id / "run.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(record))

    def result(n: int, metrics: dict[str, Any], reports: list[dict[str, Any]] | None = None, error: Any = None) -> Any:
        config = {"train.lr": 0.001 * n, "model.dropout": 0.1, "model.hidden_sizes": "[128]", "train.epochs": 3}
        history = None if reports is None else pd.DataFrame(reports)
        return SimpleNamespace(path=f"/ray/exp/trial_x_{n}_y", metrics=metrics, metrics_dataframe=history,
                               error=error, config=config)  # fmt: skip

    grid = [
        result(3, {"trial_id": "c", "val_loss": 0.9, "update": 7}, [{"update": 7, "val_loss": 0.9}]),  # ASHA
        result(1, {"trial_id": "a", "val_loss": 0.4, E: 1, "resumed_from_update": 7, "time_total_s": 30.0},
               [{"update": 7, "val_loss": 0.5}, {"update": 14, "val_loss": 0.4},
                {"update": 14, "val_loss": 0.4, E: 1}]),
        result(2, {"trial_id": "b", E: 1, F: "train.x: refused", "val_loss": 0.2}),
        result(4, {"trial_id": "d", E: 1, "val_loss": math.inf}),
        result(5, {"trial_id": "e", "val_loss": 0.3}, error=RuntimeError("died")),
    ]  # fmt: skip
    s, left = ray_backend._study(load_params(params_file), Paths(tmp_path), grid, "val_loss", False, 7)
    got = [
        (t.number, t.state, t.value, t.params, t.intermediate_values, t.user_attrs)
        for t in s.study.get_trials(deepcopy=False)
    ]
    space = {"train.lr": 0.001, "model.dropout": 0.1, "model.hidden_sizes": "[128]"}
    assert got == [
        (0, TrialState.COMPLETE, 0.4, space, {7: 0.5, 14: 0.4},
         {"ray_trial_id": "a", "mlflow_run_id": "run-a", "resumed_from_update": 7}),
        (1, TrialState.FAIL, None, {**space, "train.lr": 0.002}, {},
         {"ray_trial_id": "b", "error": "train.x: refused"}),
        (2, TrialState.PRUNED, None, {**space, "train.lr": 0.003}, {7: 0.9},
         {"ray_trial_id": "c", "mlflow_run_id": "run-c"}),
        (3, TrialState.FAIL, None, {**space, "train.lr": 0.004}, {},
         {"ray_trial_id": "d", "error": "no finite val_loss"}),  # as trial.run says it (it said nothing)
        (4, TrialState.RUNNING, None, {**space, "train.lr": 0.005}, {}, {"ray_trial_id": "e"}),
    ]  # fmt: skip
    assert left == 1 + 2  # the one whose process died, and two of the budget Ray never made
    assert marked == ["run-c"]  # the one ASHA stopped
    trials = s.study.get_trials(deepcopy=False)
    assert (trials[0].datetime_complete - trials[0].datetime_start).total_seconds() == 30.0
    assert trials[1].datetime_start == trials[1].datetime_complete  # Ray measured no time
    assert s.study.direction.name == "MAXIMIZE" and (s.budget, s.metric, s.minimize) == (7, "val_loss", False)


# --- study.py: the messages of a study that cannot be opened ---------------------------------------------------------


def test_a_study_that_cannot_be_opened_says_exactly_why_and_what_to_do(params_file: Path, tmp_path: Path) -> None:
    import optuna
    from filelock import FileLock

    from trainflow.core.errors import ParamsError
    from trainflow.params import load_params
    from trainflow.tune import study as study_

    p = load_params(params_file)
    open_study(p, tmp_path, 2, "d", "c")
    with pytest.raises(UserError) as err:
        open_study(load_params(params_file, ["train.epochs=9"]), tmp_path, 2, "d2", "c2")
    assert str(err.value) == (
        "tune: study 'trainflow' was started with other params (besides tune.trials, workers and storage) and data "
        "(data/splits) and training code; its trials would not be comparable. Put them back as they were, or start a "
        "new study: -S tune.study=trainflow-2"
    )

    begun = optuna.create_study(study_name="elsewhere", storage=study_.storage(None, tmp_path))
    begun.set_user_attr(study_.CREATOR, "gpu-box-7:4242:1700000000.00")
    with pytest.raises(UserError) as err:
        open_study(load_params(params_file, ["tune.study=elsewhere"]), tmp_path, 2, "d", "c", wait_s=0.0)
    assert str(err.value) == (
        "tune: study 'elsewhere' was begun on gpu-box-7 (gpu-box-7:4242:1700000000.00) and is still not set up after "
        "0 s; that process is slow or dead. Rerun `trainflow tune` on gpu-box-7 to finish setting it up, or start a "
        "new study with -S tune.study=<new name>"
    )

    directory = tmp_path / "models/tune/held"
    directory.mkdir(parents=True)
    (directory / study_.SETTING_UP).write_text('{"process": "box:77:1.0"}')
    lock = FileLock(directory / "setup.lock")
    lock.acquire()
    try:
        with pytest.raises(UserError) as err:
            open_study(load_params(params_file, ["tune.study=held"]), tmp_path, 2, "d", "c", wait_s=0.0)
    finally:
        lock.release()
    assert str(err.value) == (
        "tune: study 'held': a process of this machine has been setting it up for too long "
        f'({{"process": "box:77:1.0"}}), holding {directory / "setup.lock"}; wait for it, or stop it and rerun'
    )

    grid = ["tune.sampler=grid", "tune.space={model.dropout: {type: float, low: 0.0, high: 0.2, step: 0.1}}"]
    with pytest.raises(ParamsError) as err:
        open_study(load_params(params_file, grid), tmp_path, 4, "d", "c")
    assert err.value.problems == [("tune.trials", "4 trials exceed the grid's 3 points; set at most 3")]
