"""One Optuna trial (trainflow.tune.trial): its value at the best update, the one line of why it failed, its values
overlaid on the params, the reporter that talks to the pruner, and how a trial trains, ends (complete, failed, pruned,
interrupted) and makes its MLflow run once. Training is the train stage's `setup` replaced by one that logs a fixed
history. The sweep code is called in this process, so that mutation testing sees which function each test reached
(tests/stages/test_tune*.py run `trainflow tune` in subprocesses)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState
from support import sweeps
from support.sweeps import fake_training, get_run, mlflow_runs, sweep_params

import trainflow.stages.train
from trainflow import tracking
from trainflow.core.errors import DiskFullError, ParamsError, UserError
from trainflow.params import load_params
from trainflow.tune import runs
from trainflow.tune import runs as tune_runs
from trainflow.tune import trial as trial_
from trainflow.tune.study import PARENT_RUN, Study, claim, open_study, stale

optuna.logging.set_verbosity(optuna.logging.WARNING)


# --- the project: iris split in this process, an MLflow database whose tables exist --------------------------------
prepared, project = sweeps.prepared, sweeps.project  # the fixtures, in tests/support/sweeps.py


def test_the_value_of_a_trial_is_its_metric_at_the_best_update() -> None:
    history = [{"update": 7, "val_loss": 0.6}, {"update": 14.0, "val_loss": 0.4}, {"update": 21, "train_loss": 0.3}]
    assert trial_.value_at_best(history, 14, "val_loss") == 0.4
    assert trial_.value_at_best(history, 7, "val_loss") == 0.6
    assert math.isnan(trial_.value_at_best(history, 21, "val_loss"))  # that update has no val_loss
    assert math.isnan(trial_.value_at_best(history, 28, "val_loss"))
    assert math.isnan(trial_.value_at_best([], -1, "val_loss"))


def test_why_a_trial_failed_is_one_line_naming_every_field() -> None:
    err = ParamsError("tune.space (trial 3)", [("train.lr", "too high"), ("model.dropout", "above 1")])
    assert trial_.one_line(err) == "train.lr: too high; model.dropout: above 1"
    assert trial_.one_line(UserError("a\n  b\tc ")) == "a b c"
    assert trial_.one_line("no finite val_loss") == "no finite val_loss"


def test_overlaid_sets_each_value_in_a_copy_of_the_params_even_values_they_refuse(params_file: Path) -> None:
    p = load_params(params_file)
    out = trial_._overlaid(p, {"train.lr": 0.0001, "train.min_lr": 0.5, "model.kwargs.width": 3})
    assert (out["train"]["lr"], out["train"]["min_lr"], out["model"]["kwargs"]) == (0.0001, 0.5, {"width": 3})
    assert out["model"]["dropout"] == 0.1 and p.train.lr == 0.002  # the rest as it was; the params untouched


class Points:
    def __init__(self) -> None:
        self.logged: list[tuple[dict[str, float], int]] = []
        self.closed = False

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.logged.append((metrics, step))

    def close(self) -> None:
        self.closed = True


def test_the_reporter_tells_optuna_each_evaluation_once_and_stops_a_trial_the_pruner_gives_up_on() -> None:
    s = optuna.create_study(pruner=optuna.pruners.ThresholdPruner(upper=0.75))
    t = s.ask()
    inner = Points()
    r = trial_.Reporter(t, "val_loss", inner)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Optuna warns when a step is reported twice
        r.log({"train_loss": 0.9}, 1)
        r.log({"val_loss": math.nan}, 2)
        r.log({"val_loss": 0.5}, 3)
        r.log({"val_loss": 0.7}, 3)  # a resumed trial replays an evaluation Optuna already has
    assert s.trials[0].intermediate_values == {3: 0.5}
    with pytest.raises(optuna.TrialPruned, match=r"val_loss 0.8 at update 4"):
        r.log({"val_loss": 0.8}, 4)
    assert s.trials[0].intermediate_values == {3: 0.5, 4: 0.8}
    assert [step for _, step in inner.logged] == [1, 2, 3, 3, 4]  # every point still goes to MLflow
    r.close()
    assert inner.closed


def open_claimed(root: Path, *overrides: str, budget: int = 1) -> tuple[Study, Any]:
    p = sweep_params(root, *overrides)
    s = open_study(p, root, budget, "data-hash", "code-hash", on_create=tune_runs.parent_run(p, root))
    c = claim(s)
    assert c is not None
    return s, c


def test_a_trial_trains_with_its_sampled_values_and_ends_with_the_metric_at_its_best_update(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    given = fake_training(
        monkeypatch,
        [{"update": 7, "val_loss": 0.5}, {"update": 14, "val_loss": 0.25}, {"update": 21, "val_loss": 0.3}],
        14,
        resumed_from=7,
    )
    space_ = (
        "tune.space={train.lr: {type: categorical, choices: [0.05]}, "
        "model.hidden_sizes: {type: categorical, choices: [[16]]}}"
    )
    s, c = open_claimed(project, space_)
    assert trial_.run(s, c, "data-hash") == "complete"
    c.release()

    (params,) = [g["params"] for g in given]
    assert (params.train.lr, params.model.hidden_sizes, params.train.epochs) == (0.05, [16], 1)
    assert given[0]["checkpoints"] == s.trial_dir(0) / "checkpoints" and given[0]["discarded"]
    frozen = s.study.trials[0]
    assert (frozen.state, frozen.value) == (TrialState.COMPLETE, 0.25)
    assert frozen.params == {"train.lr": 0.05, "model.hidden_sizes": "[16]"}
    assert frozen.intermediate_values == {7: 0.5, 14: 0.25, 21: 0.3}
    assert frozen.user_attrs["resumed_from_update"] == 7
    assert not (s.trial_dir(0) / "checkpoints").exists()  # ended: nothing will resume it

    run = get_run(project, frozen.user_attrs["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "trainflow-trial-0"
    assert (run.data.params["train.lr"], run.data.params["model.hidden_sizes"]) == ("0.05", "[16]")
    assert run.data.metrics["best_val_loss"] == 0.25
    tags = run.data.tags
    assert tags["mlflow.parentRunId"] == s.study.user_attrs[PARENT_RUN]
    assert tags[runs.KEY_TAG] == frozen.user_attrs["mlflow_run_key"]
    assert (tags["trainflow.tune.state"], tags["trainflow.tune.trial"], tags["trainflow.tune.study"]) == (
        "complete",
        "0",
        "trainflow",
    )
    assert (tags["trainflow.data_sha256"], tags["git_commit"], tags["git_dirty"]) == ("data-hash", "c0ffee", "false")
    assert "trainflow.tune.error" not in tags and "error" not in frozen.user_attrs


def test_a_trial_that_ends_without_a_finite_metric_fails_saying_so(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_training(monkeypatch, [{"update": 7, "val_loss": math.nan}], 7)
    s, c = open_claimed(project)
    assert trial_.run(s, c, "data-hash") == "failed"
    c.release()
    frozen = s.study.trials[0]
    assert (frozen.state, frozen.value, frozen.user_attrs["error"]) == (TrialState.FAIL, None, "no finite val_loss")
    assert "resumed_from_update" not in frozen.user_attrs
    run = get_run(project, frozen.user_attrs["mlflow_run_id"])
    assert run.info.status == "FAILED" and run.data.tags["trainflow.tune.error"] == "no finite val_loss"


def test_values_the_params_refuse_together_fail_the_trial_naming_the_fields(project: Path) -> None:
    """Each bound is valid beside the current params, their combination (min_lr above lr) is not: the trial fails
    with the params' message, and its MLflow run holds the values it was given."""
    refused = (
        "tune.space={train.lr: {type: categorical, choices: [0.0001]}, "
        "train.min_lr: {type: categorical, choices: [0.001]}}"
    )
    s, c = open_claimed(project, refused)
    assert trial_.run(s, c, "data-hash") == "failed"
    c.release()
    frozen = s.study.trials[0]
    assert frozen.state == TrialState.FAIL
    assert "train.min_lr (0.001) is above train.lr (0.0001)" in frozen.user_attrs["error"]
    assert "\n" not in frozen.user_attrs["error"]
    run = get_run(project, frozen.user_attrs["mlflow_run_id"])
    assert run.info.status == "FAILED"
    assert run.data.tags["trainflow.tune.error"] == frozen.user_attrs["error"]
    assert run.data.tags["trainflow.tune.state"] == "failed"
    assert (run.data.params["train.lr"], run.data.params["train.min_lr"]) == ("0.0001", "0.001")


def test_values_the_model_cannot_take_fail_in_setup_and_the_study_goes_on(project: Path) -> None:
    """An MLP has no numbered layers, so layer_decay fails in the train stage's real `setup`."""
    s, c = open_claimed(project, "tune.space={train.layer_decay: {type: categorical, choices: [0.8]}}", budget=2)
    assert trial_.run(s, c, "data-hash") == "failed"
    c.release()
    assert "train.layer_decay: MLP has no numbered layers" in s.study.trials[0].user_attrs["error"]
    assert [t.state for t in s.trials()] == [TrialState.FAIL, TrialState.WAITING]
    following = claim(s)
    assert following is not None and following.trial.number == 1  # the study goes on
    following.release()


def test_a_trial_the_pruner_stops_ends_pruned_at_that_value_and_keeps_no_checkpoints(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    given = fake_training(monkeypatch, [{"update": 7, "val_loss": 0.5}, {"update": 14, "val_loss": 0.4}], 14)
    s, c = open_claimed(project)
    s.study.pruner = optuna.pruners.ThresholdPruner(upper=0.45)
    assert trial_.run(s, c, "data-hash") == "pruned"
    c.release()
    assert given[0]["discarded"]  # streamed data's files go when the pruner stops the trial too
    frozen = s.study.trials[0]
    assert (frozen.state, frozen.value, frozen.intermediate_values) == (TrialState.PRUNED, 0.5, {7: 0.5})
    assert not (s.trial_dir(0) / "checkpoints").exists()
    run = get_run(project, frozen.user_attrs["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["trainflow.tune.state"] == "pruned"


@pytest.mark.parametrize("stop", [KeyboardInterrupt(), DiskFullError("models/tune: no space left")])
def test_a_trial_stopped_by_an_interrupt_or_a_full_disk_stays_running_for_a_rerun(
    project: Path, monkeypatch: pytest.MonkeyPatch, stop: BaseException
) -> None:
    given = fake_training(monkeypatch, [{"update": 7, "val_loss": 0.5}], 7)
    fitted: Callable[..., Any] = trainflow.stages.train.setup

    def setup(*args: Any) -> Any:
        built = fitted(*args)

        def fit(train: Any, val: Any) -> Any:
            raise stop  # after the checkpoint at update 7

        built.trainer.fit = fit
        return built

    monkeypatch.setattr(trainflow.stages.train, "setup", setup)
    s, c = open_claimed(project)
    with pytest.raises(type(stop)):
        trial_.run(s, c, "data-hash")
    c.release()
    assert given[0]["discarded"]
    assert (s.trial_dir(0) / "checkpoints/update_7.safetensors").is_file()  # what the rerun resumes from
    frozen = s.study.trials[0]
    assert frozen.state == TrialState.RUNNING and "error" not in frozen.user_attrs
    assert stale(s) == [0]  # the next worker resumes it
    assert get_run(project, frozen.user_attrs["mlflow_run_id"]).info.status == "KILLED"


def test_a_trials_mlflow_run_is_made_once_even_when_its_id_was_not_recorded(project: Path) -> None:
    s, c = open_claimed(project, budget=2)
    first = trial_.child_run(s, c, {"a": 1}, "data-hash")
    assert first.run_id is not None
    again = trial_.child_run(s, c, {"a": 1}, "data-hash")  # a resumed trial carries on its run
    assert again.run_id == first.run_id

    # Trial 1's worker started its run under a key and was killed before it recorded the run's id.
    other = claim(s)
    assert other is not None
    other.trial.set_user_attr(trial_.RUN_KEY, "k-1")
    started = tracking.TrainingRun(project, "trainflow", project / "unused.json")
    started.start({}, tags={runs.KEY_TAG: "k-1"})
    found = trial_.child_run(s, other, {"a": 1}, "data-hash")
    assert found.run_id == started.run_id
    assert s.study.trials[1].user_attrs[trial_.RUN_ID] == started.run_id
    children = [r for r in mlflow_runs(project) if "trainflow.tune.trial" in r.data.tags]
    assert [r.info.run_id for r in children] == [first.run_id]  # no second run for either trial
    c.release()
    other.release()
