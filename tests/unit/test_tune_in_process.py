"""The sweep code (trainflow.tune) called in this process, so that mutation testing sees which function each test
reached (tests/stages/test_tune*.py run `trainflow tune` in subprocesses): the search space as Optuna distributions,
the results files and the best trial, the study's slots and claims, how a trial's values become its params and how it
ends, the MLflow run keys, the worker entry, the pure helpers of the Ray backend, and a whole two-trial sweep.

Expectations come from hand-made studies (Optuna's create_trial), hand-computed values, or Optuna and MLflow read
back; the project (tests/support/sweeps.py) is iris made by the ingest and split stages in this process (no DVC;
git only in the cached read of the committed params.yaml)."""

from __future__ import annotations

import io
import json
import math
import os
import re
import socket
import sys
import warnings
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pandas as pd
import pytest
import yaml
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial
from support import sweeps
from support.sweeps import CURRENT, LR, SIZES, ended, get_run, hand_made, mlflow_runs, sweep_params

import trainflow.stages.train
from trainflow import tracking, tune
from trainflow.core.errors import DiskFullError, ParamsError, ServiceError, UserError
from trainflow.core.paths import Paths
from trainflow.params import Dimension, PipelineParams, load_params, write_overrides
from trainflow.tune import ray_backend, results, runs, space, worker
from trainflow.tune import runs as tune_runs
from trainflow.tune import study as study_
from trainflow.tune import study as tune_study
from trainflow.tune import trial as trial_
from trainflow.tune.study import (
    CLAIMED,
    CREATOR,
    IDENTITY,
    PARENT_KEY,
    PARENT_RUN,
    SETTING_UP,
    SLOTS_READY,
    Study,
    claim,
    open_study,
    stale,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)


def dims(spec: dict[str, dict[str, Any]]) -> dict[str, Dimension]:
    return {path: Dimension.model_validate(d) for path, d in spec.items()}


# --- the project: iris split in this process, an MLflow database whose tables exist --------------------------------
prepared, project = sweeps.prepared, sweeps.project  # the fixtures, in tests/support/sweeps.py


def fake_training(
    monkeypatch: pytest.MonkeyPatch, history: list[dict[str, float]], best: int, resumed_from: int | None = None
) -> list[dict[str, Any]]:
    """The train stage's `setup` replaced by one whose trainer logs `history` through the trial's logger and ends with
    it, without training; it leaves a checkpoint file. Returns what each call was given (and whether the trial
    discarded what it built)."""
    given: list[dict[str, Any]] = []

    def setup(params: PipelineParams, paths: Paths, device: Any, group: Any, checkpoints: Path, logger: Any) -> Any:
        call = {"params": params, "checkpoints": checkpoints, "discarded": False}
        given.append(call)
        checkpoints.mkdir(parents=True, exist_ok=True)
        (checkpoints / "update_7.safetensors").write_bytes(b"weights")

        def fit(train: Any, val: Any) -> Any:
            for point in history:
                logger.log({k: v for k, v in point.items() if k != "update"}, int(point["update"]))
            return SimpleNamespace(history=history, best_update=best)

        def discard() -> None:
            call["discarded"] = True

        trainer = SimpleNamespace(fit=fit, resumed_from=resumed_from)
        return SimpleNamespace(trainer=trainer, train=None, val=None, discard=discard)

    monkeypatch.setattr(trainflow.stages.train, "setup", setup)
    return given


# --- space.py --------------------------------------------------------------------------------------------------------


def test_each_dimension_kind_becomes_its_optuna_distribution_and_values_come_back_as_params_hold_them() -> None:
    d = dims(
        {
            "train.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True},
            "model.dropout": {"type": "float", "low": 0.0, "high": 0.5, "step": 0.1},
            "train.epochs": {"type": "int", "low": 2, "high": 8, "step": 3},
            "train.accumulate": {"type": "int", "low": 1, "high": 4},
            "model.hidden_sizes": {"type": "categorical", "choices": [[128], [256, 128]]},
            "train.layer_decay": {"type": "categorical", "choices": [None, 0.8]},
        }
    )
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3)).ask()
    values = space.suggest(trial, d)
    assert trial.distributions == {
        "train.lr": FloatDistribution(1e-4, 1e-2, log=True),
        "model.dropout": FloatDistribution(0.0, 0.5, step=0.1),
        "train.epochs": IntDistribution(2, 8, step=3),
        "train.accumulate": IntDistribution(1, 4),
        "model.hidden_sizes": CategoricalDistribution(["[128]", "[256, 128]"]),
        "train.layer_decay": CategoricalDistribution([None, 0.8]),
    }
    assert values == {**trial.params, "model.hidden_sizes": json.loads(trial.params["model.hidden_sizes"])}
    assert isinstance(values["train.epochs"], int) and isinstance(values["model.hidden_sizes"], list)

    # A trial that already has its values (a resumed one; Ray's config) gets them back, decoded.
    fixed: Any = optuna.trial.FixedTrial(
        {
            "train.lr": 0.003,
            "model.dropout": 0.2,
            "train.epochs": 5,
            "train.accumulate": 3,
            "model.hidden_sizes": "[256, 128]",
            "train.layer_decay": None,
        }
    )
    assert space.suggest(fixed, d) == {
        "train.lr": 0.003,
        "model.dropout": 0.2,
        "train.epochs": 5,
        "train.accumulate": 3,
        "model.hidden_sizes": [256, 128],
        "train.layer_decay": None,
    }


def test_every_choice_goes_through_optuna_and_comes_back_with_its_type() -> None:
    choices: list[Any] = [None, True, 1, 1.5, "1", [1], [256, 128], {"a": 1}]
    d = Dimension.model_validate({"type": "categorical", "choices": choices})
    encoded = [space.encode(c) for c in choices]
    assert encoded == [None, True, 1, 1.5, "1", "[1]", "[256, 128]", '{"a": 1}']
    assert encoded[1] is True  # a bool stays a bool (Optuna takes it), not the text "true"
    back = [space.decode(d, e) for e in encoded]
    assert back == choices
    assert [type(b) for b in back] == [type(c) for c in choices]  # True is not 1, "1" is not 1


def test_the_current_params_are_a_point_of_the_space_only_inside_its_bounds_and_steps(params_file: Path) -> None:
    p = load_params(params_file)  # lr 0.002, dropout 0.1, hidden_sizes [256, 128]

    def point(lr: dict[str, Any], dropout: dict[str, Any], sizes: list[Any]) -> dict[str, Any] | None:
        d = dims(
            {
                "train.lr": {"type": "float", **lr},
                "model.dropout": {"type": "float", **dropout},
                "model.hidden_sizes": {"type": "categorical", "choices": sizes},
            }
        )
        return space.current_point(p, d)

    inside = point({"low": 0.001, "high": 0.002}, {"low": 0.0, "high": 0.5, "step": 0.05}, [[128], [256, 128]])
    assert inside == CURRENT  # lr at its high bound (included); dropout 0.1 on the 0.05 grid; the list as JSON text
    assert point({"low": 0.002, "high": 0.01}, {"low": 0.1, "high": 0.5}, [[256, 128]]) == CURRENT  # low included
    assert point({"low": 0.001, "high": 0.0019}, {"low": 0.0, "high": 0.5}, [[256, 128]]) is None  # lr above high
    assert point({"low": 0.0021, "high": 0.01}, {"low": 0.0, "high": 0.5}, [[256, 128]]) is None  # lr below low
    assert point({"low": 0.001, "high": 0.01}, {"low": 0.0, "high": 0.5, "step": 0.03}, [[256, 128]]) is None
    assert point({"low": 0.001, "high": 0.01}, {"low": 0.0, "high": 0.5}, [[128], [512, 256]]) is None

    assert space.value_at(p, "train.lr") == 0.002
    assert space.value_at(p, "model.hidden_sizes") == [256, 128]
    assert space.value_at(p, "model.kwargs.width") is None  # no such key
    assert space.value_at(p, "train.lr.x") is None  # below a value, not a section


def test_the_grid_lists_every_step_of_each_dimension_and_refuses_a_range_without_one() -> None:
    d = dims(
        {
            "train.epochs": {"type": "int", "low": 2, "high": 8, "step": 3},
            "train.accumulate": {"type": "int", "low": 1, "high": 3},
            "model.dropout": {"type": "float", "low": 0.1, "high": 0.3, "step": 0.1},
            "model.hidden_sizes": {"type": "categorical", "choices": [[8], [16, 8]]},
        }
    )
    g = space.grid(d)
    assert g["train.epochs"] == [2, 5, 8] and g["train.accumulate"] == [1, 2, 3]
    assert all(type(v) is int for v in g["train.epochs"] + g["train.accumulate"])
    assert g["model.dropout"] == pytest.approx([0.1, 0.2, 0.3])  # (0.3 - 0.1) / 0.1 is 1.999...: still 3 points
    assert g["model.hidden_sizes"] == ["[8]", "[16, 8]"]
    assert space.grid_size(d) == 3 * 3 * 3 * 2

    with pytest.raises(ParamsError) as err:
        space.grid(
            dims(
                {
                    "train.epochs": {"type": "int", "low": 1, "high": 2},
                    "train.lr": {"type": "float", "low": 0.1, "high": 1},
                }
            )
        )
    assert [path for path, _ in err.value.problems] == ["tune.space.train.lr"]
    assert "needs choices or a step" in err.value.problems[0][1] and "add step" in err.value.problems[0][1]


@pytest.mark.parametrize(
    ("dimension", "path", "why"),
    [
        ("train.lr: {type: float, low: 0.1, high: 0.01}", "tune.space.train.lr", "low (0.1) is above high (0.01)"),
        ("model.dropout: {type: float, low: 0.1}", "tune.space.model.dropout", "takes `low` and `high`"),
        (
            "model.hidden_sizes: {type: categorical, choices: [[8]], low: 1}",
            "tune.space.model.hidden_sizes",
            "takes `choices`",
        ),
        ("model.hidden_sizes: {type: categorical}", "tune.space.model.hidden_sizes", "takes `choices`"),
        ("train.lr: {type: float, low: 0, high: 0.1, log: true}", "tune.space.train.lr", "log: true needs low > 0"),
        ("train.epochs: {type: int, low: 1, high: 2.5}", "tune.space.train.epochs", "whole numbers"),
        ("train.lr: {type: normal, low: 0, high: 1}", "tune.space.train.lr.type", "'float', 'int' or 'categorical'"),
    ],
)
def test_a_bad_dimension_is_refused_naming_its_path(params_file: Path, dimension: str, path: str, why: str) -> None:
    with pytest.raises(ParamsError) as err:
        load_params(params_file, [f"tune.space={{{dimension}}}"])
    assert [p for p, _ in err.value.problems] == [path]
    assert why in err.value.problems[0][1]


# --- results.py ------------------------------------------------------------------------------------------------------

# Trials 2 and 4 tie for the lowest complete value, 5 and 6 for the highest; pruned trials (Optuna gives them their
# last reported value) and trials beyond the budget hold better values than any of those, and never count.
BEST_CASE = [
    ("COMPLETE", 0.5, 0.001, [128]),
    ("PRUNED", 0.05, 0.002, [128]),
    ("COMPLETE", 0.3, 0.003, [256, 128]),
    ("FAIL", None, 0.004, [128]),
    ("COMPLETE", 0.3, 0.005, [128]),
    ("COMPLETE", 0.9, 0.006, [512, 256]),
    ("COMPLETE", 0.9, 0.007, [128]),
    ("PRUNED", 0.99, 0.008, [128]),
    ("COMPLETE", 0.01, 0.009, [128]),  # trial 8, beyond the budget of 8
    ("COMPLETE", 1.5, 0.0099, [128]),
]


@pytest.mark.parametrize(
    ("minimize", "trial", "lr", "sizes"), [(True, 2, 0.003, [256, 128]), (False, 5, 0.006, [512, 256])]
)
def test_the_best_trial_is_the_lowest_or_highest_complete_one_within_the_budget_and_the_first_of_a_tie(
    params_file: Path, minimize: bool, trial: int, lr: float, sizes: list[int]
) -> None:
    p = load_params(params_file)
    s = hand_made(p, [ended(*row) for row in BEST_CASE], minimize=minimize, budget=8)
    assert results.best(s) == {
        "study": "trainflow",
        "trial": trial,
        "metric": "val_loss",
        "direction": "minimize" if minimize else "maximize",
        "value": BEST_CASE[trial][1],
        "params": {"train.lr": lr, "model.hidden_sizes": sizes},
    }
    none_complete = hand_made(p, [ended("PRUNED", 0.1, 0.001, [128]), ended("FAIL", None, 0.001, [128])])
    assert results.best(none_complete) is None


def test_write_puts_every_trial_in_trials_csv_and_the_best_in_best_params_yaml(
    params_file: Path, tmp_path: Path
) -> None:
    p = load_params(params_file)
    start = datetime(2026, 1, 1, 12, 0, 0)
    rows = [
        ended("COMPLETE", 0.5, 0.001, [128], intermediate_values={7: 0.6, 14: 0.5}, user_attrs={"mlflow_run_id": "r0"}),
        ended(
            "PRUNED",
            0.8,
            0.005,
            [256, 128],
            intermediate_values={7: 0.8},
            user_attrs={"mlflow_run_id": "r1", "resumed_from_update": 7},
        ),
        ended("FAIL", None, 0.0002, [128], user_attrs={"mlflow_run_id": "r2", "error": "train.x: no numbered layers"}),
        ended("COMPLETE", 0.4, 0.002, [256, 128], intermediate_values={7: 0.45, 14: 0.4}),
        create_trial(state=TrialState.WAITING),
    ]
    for n, t in enumerate(rows[:4]):
        t.datetime_start, t.datetime_complete = start, start + timedelta(seconds=10 * n + 0.5)
    out = tmp_path / "reports" / "tune"
    top = results.write(hand_made(p, rows), out)

    assert sorted(f.name for f in out.iterdir()) == [
        "best_params.yaml",
        "history.csv",
        "importance.csv",
        "optimization_history.png",
        "param_importances.png",
        "trials.csv",
    ]
    want = {
        "trial": [0, 1, 2, 3, 4],
        "state": ["complete", "pruned", "failed", "complete", "waiting"],
        "val_loss": [0.5, 0.8, None, 0.4, None],
        "last_update": [14, 7, None, 14, None],
        "train.lr": [0.001, 0.005, 0.0002, 0.002, None],
        "model.hidden_sizes": ["[128]", "[256, 128]", "[128]", "[256, 128]", None],
        "resumed_from_update": [None, 7, None, None, None],
        "seconds": [0.5, 10.5, 20.5, 30.5, None],
        "mlflow_run_id": ["r0", "r1", "r2", None, None],
        "error": [None, None, "train.x: no numbered layers", None, None],
    }
    got = pd.read_csv(out / "trials.csv")
    assert list(got.columns) == list(want)
    pd.testing.assert_frame_equal(got, pd.DataFrame(want), check_dtype=False)
    best = {
        "study": "trainflow",
        "trial": 3,
        "metric": "val_loss",
        "direction": "minimize",
        "value": 0.4,
        "params": {"train.lr": 0.002, "model.hidden_sizes": [256, 128]},
    }
    assert top == best
    assert yaml.safe_load((out / "best_params.yaml").read_text()) == best
    assert list(yaml.safe_load((out / "best_params.yaml").read_text())) == list(best)  # in this order
    history = pd.read_csv(out / "history.csv")  # complete and pruned trials; the best complete value so far
    want_history = {
        "trial": [0, 1, 3],
        "state": ["complete", "pruned", "complete"],
        "value": [0.5, 0.8, 0.4],
        "best": [0.5, None, 0.4],
    }
    pd.testing.assert_frame_equal(history, pd.DataFrame(want_history), check_dtype=False)
    assert (out / "optimization_history.png").read_bytes()[:4] == b"\x89PNG"


def test_the_history_keeps_the_best_value_so_far_in_the_studys_direction(params_file: Path) -> None:
    p = load_params(params_file)
    trials = [
        ended("COMPLETE", 0.5, 0.001, [128]),
        ended("COMPLETE", 0.7, 0.001, [128]),
        ended("PRUNED", 0.9, 0.001, [128]),
        ended("COMPLETE", 0.6, 0.001, [128]),
    ]
    for minimize, best in ((True, [0.5, 0.5, math.nan, 0.5]), (False, [0.5, 0.7, math.nan, 0.7])):
        s = hand_made(p, trials, minimize=minimize)
        history = results._history(results.trials_frame(s), s)
        assert list(history["trial"]) == [0, 1, 2, 3]
        assert history["best"].tolist() == pytest.approx(best, nan_ok=True)
    waiting = hand_made(p, [create_trial(state=TrialState.WAITING)])
    empty = results._history(results.trials_frame(waiting), waiting)
    assert list(empty.columns) == ["trial", "state", "value", "best"] and len(empty) == 0


def test_the_history_plot_draws_the_best_so_far_in_red_apart_from_the_blue_trials(
    params_file: Path, tmp_path: Path
) -> None:
    import numpy as np
    from matplotlib.colors import to_rgb
    from PIL import Image

    p = load_params(params_file)
    s = hand_made(p, [ended("COMPLETE", v, 0.001, [128]) for v in (0.9, 0.5, 0.7, 0.3, 0.6, 0.2)])
    results.write(s, tmp_path)
    pixels = np.asarray(Image.open(tmp_path / "optimization_history.png").convert("RGB")).reshape(-1, 3)

    def count(colour: str) -> int:
        return int((pixels == np.round(np.array(to_rgb(colour)) * 255)).all(axis=1).sum())

    assert count("tab:red") > 500  # the step line across the plot (and its legend entry)
    assert count("tab:blue") > 100  # the trials' points


def test_a_failed_write_of_best_params_leaves_the_previous_file_whole(
    params_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = load_params(params_file)
    s = hand_made(p, [ended("COMPLETE", 0.5, 0.001, [128])])
    out = tmp_path / "tune"
    results.write(s, out)
    before = (out / "best_params.yaml").read_text()
    # A text that fails half-way through being written (it cannot be encoded): the file being written is cut short.
    monkeypatch.setattr(results.yaml, "safe_dump", lambda *a, **k: "study: " + "x" * 10_000 + "\udc80")
    with pytest.raises(UnicodeEncodeError):
        results.write(s, out)
    assert (out / "best_params.yaml").read_text() == before
    assert not [f.name for f in out.iterdir() if f.name.endswith(".tmp")]


def test_importances_rank_the_param_that_decides_the_value_and_leave_out_constant_ones(params_file: Path) -> None:
    p = load_params(params_file)
    drop = FloatDistribution(0.0, 0.5)
    trials = []
    for i in range(12):
        lr = 0.0001 * 1.5**i
        trials.append(
            create_trial(
                value=1000 * lr,  # the value is the lr's alone
                params={"train.lr": lr, "model.hidden_sizes": ["[128]", "[256, 128]"][i % 2], "model.dropout": 0.1},
                distributions={"train.lr": LR, "model.hidden_sizes": SIZES, "model.dropout": drop},
            )
        )
    scores = results._importance(hand_made(p, trials)).set_index("param")["importance"]
    assert set(scores.index) == {"train.lr", "model.hidden_sizes"}  # dropout never varied
    assert scores["train.lr"] > 0.9 > scores["model.hidden_sizes"]
    assert scores.sum() == pytest.approx(1.0)
    one = results._importance(hand_made(p, trials[:1]))
    assert list(one.columns) == ["param", "importance"] and len(one) == 0
    same = [ended("COMPLETE", v, 0.001, [128]) for v in (0.1, 0.2)]  # two complete trials, nothing varied
    assert len(results._importance(hand_made(p, same))) == 0


def test_a_study_whose_trials_all_scored_alike_writes_its_results_without_importances(
    params_file: Path, tmp_path: Path
) -> None:
    """val_accuracy 1.0 in every trial (iris): fANOVA has no variance to explain. (It raised, and `trainflow tune`
    failed after its last trial, writing no plots.)"""
    p = load_params(params_file)
    s = hand_made(p, [ended("COMPLETE", 1.0, lr, [128]) for lr in (0.001, 0.002, 0.004)], minimize=False)
    top = results.write(s, tmp_path)
    assert top is not None and top["trial"] == 0
    assert len(pd.read_csv(tmp_path / "importance.csv")) == 0
    assert (tmp_path / "param_importances.png").is_file()


def test_apply_writes_the_best_params_and_the_trial_into_params_yaml(params_file: Path) -> None:
    write_overrides(params_file, ["train.layer_decay=0.9"])
    best = {"train.lr": 0.004, "model.hidden_sizes": [512, 256], "train.layer_decay": None}
    written = results.apply({"study": "s1", "trial": 3, "params": best}, params_file)
    assert written == [
        "train.lr=0.004",
        "model.hidden_sizes=[512, 256]",
        "train.layer_decay=null",
        'register.tags.tune_study="s1"',
        "register.tags.tune_trial='3'",
    ]
    p = load_params(params_file)
    assert (p.train.lr, p.model.hidden_sizes, p.train.layer_decay) == (0.004, [512, 256], None)
    assert p.register.tags == {"tune_study": "s1", "tune_trial": "3"}
    assert "# micro-batch size" in params_file.read_text()  # comments kept


# --- study.py --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "want"),
    [
        ([], ("val_loss", True)),
        (["train.monitor=val_accuracy"], ("val_accuracy", False)),
        (["tune.metric=val_accuracy"], ("val_accuracy", False)),
        (["tune.metric=val_ece"], ("val_ece", True)),
        (["train.monitor=val_accuracy", "tune.metric=val_loss"], ("val_loss", True)),
        (["train.mode=max"], ("val_loss", False)),  # the monitor's own direction, as train.mode says
        (["tune.direction=maximize"], ("val_loss", False)),
        (["train.monitor=val_accuracy", "tune.direction=minimize"], ("val_accuracy", True)),
    ],
)
def test_the_objective_is_the_monitor_in_its_direction_unless_tune_says_otherwise(
    params_file: Path, overrides: list[str], want: tuple[str, bool]
) -> None:
    assert study_.objective(load_params(params_file, overrides)) == want


def test_the_storage_is_a_journal_under_the_project_or_the_database_a_url_names(tmp_path: Path) -> None:
    from optuna.storages import JournalStorage, RDBStorage

    for spec, file in ((None, "models/tune/journal.log"), ("elsewhere/j.log", "elsewhere/j.log")):
        store = study_.storage(spec, tmp_path)
        assert isinstance(store, JournalStorage)
        optuna.create_study(study_name="s", storage=store)
        assert (tmp_path / file).stat().st_size > 0
    db = study_.storage(f"sqlite:///{tmp_path / 'optuna.db'}", tmp_path)
    assert isinstance(db, RDBStorage)
    optuna.create_study(study_name="s", storage=db)
    assert (tmp_path / "optuna.db").is_file()


def test_trial_seeds_are_fixed_numbers_of_the_seed_and_the_trial_number() -> None:
    # The first 4 bytes of sha256("42:0") and so on, big-endian (`echo -n 42:0 | sha256sum`).
    assert study_.trial_seed(42, 0) == 1416840650
    assert study_.trial_seed(42, 1) == 64878673
    assert study_.trial_seed(7, 0) == 4127154647


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_a_restarted_study_suggests_for_each_trial_what_the_uninterrupted_one_did(
    params_file: Path, tmp_path: Path, sampler: str
) -> None:
    """Trial 0 is the current params; each later trial is sampled from a seed of its own number, so a study opened
    afresh (a new process) for each trial suggests what one process running them all did."""
    p = load_params(params_file, [f"tune.sampler={sampler}"])

    def run_one(s: Study, value: float) -> dict[str, Any]:
        c = claim(s)
        assert c is not None
        values = space.suggest(c.trial, p.tune.space)
        s.study.tell(c.trial, value)
        c.release()
        return values

    one = open_study(p, tmp_path / "one", 3, "d", "c")
    uninterrupted = [run_one(one, v) for v in (1.0, 2.0, 3.0)]
    restarted = [run_one(open_study(p, tmp_path / "again", 3, "d", "c"), v) for v in (1.0, 2.0, 3.0)]
    assert restarted == uninterrupted
    assert uninterrupted[0] == {**CURRENT, "model.hidden_sizes": [256, 128]}
    assert uninterrupted[1] != uninterrupted[2] != uninterrupted[0]


def test_a_grid_study_visits_each_point_once_and_refuses_a_budget_beyond_the_grid(
    params_file: Path, tmp_path: Path
) -> None:
    """Each trial is claimed by a study opened afresh, as by a new worker process. (It once drew each trial's point
    from a grid shuffled with that trial's own seed: points repeated, others were never visited.)"""
    grid = (
        "{train.lr: {type: float, low: 0.001, high: 0.003, step: 0.001}, "
        "model.hidden_sizes: {type: categorical, choices: [[8], [16, 8]]}}"
    )
    p = load_params(params_file, ["tune.sampler=grid", f"tune.space={grid}"])
    with pytest.raises(ParamsError) as err:
        open_study(p, tmp_path, 7, "d", "c")
    assert err.value.problems == [("tune.trials", "7 trials exceed the grid's 6 points; set at most 6")]

    assert "fixed_params" not in open_study(p, tmp_path, 6, "d", "c").trials()[0].system_attrs  # no room for them
    seen = []
    for _ in range(6):
        s = open_study(p, tmp_path, 6, "d", "c")
        c = claim(s)
        assert c is not None
        v = space.suggest(c.trial, p.tune.space)
        seen.append((round(v["train.lr"], 6), tuple(v["model.hidden_sizes"])))
        s.study.tell(c.trial, 1.0)  # the last one: GridSampler stops the study, which is no error here
        c.release()
    assert sorted(seen) == sorted((lr, sizes) for lr in (0.001, 0.002, 0.003) for sizes in ((8,), (16, 8)))


def test_the_median_pruner_waits_for_five_finished_trials_and_none_never_prunes(params_file: Path) -> None:
    def prunes(kind: str, finished: int, value: float) -> bool:
        s = optuna.create_study(pruner=study_.pruner(load_params(params_file, [f"tune.pruner={kind}"]).tune))
        for _ in range(finished):
            s.add_trial(create_trial(value=0.5, intermediate_values={1: 0.5}))
        t = s.ask()
        t.report(value, 1)
        return t.should_prune()

    assert not prunes("median", 4, 0.9)  # four finished: too few to judge
    assert prunes("median", 5, 0.9)  # worse than the median of five
    assert not prunes("median", 5, 0.1)
    assert not prunes("none", 5, 0.9)
    hyperband = study_.pruner(load_params(params_file, ["tune.pruner=hyperband"]).tune)
    assert isinstance(hyperband, optuna.pruners.HyperbandPruner)


def test_open_study_makes_exactly_the_budget_of_slots_with_the_current_params_first(
    params_file: Path, tmp_path: Path
) -> None:
    p = load_params(params_file)
    created: list[optuna.Study] = []
    s = open_study(p, tmp_path, 3, "data-1", "code-1", on_create=created.append)
    assert [(t.number, t.state) for t in s.trials()] == [(n, TrialState.WAITING) for n in range(3)]
    assert [t.system_attrs.get("fixed_params") for t in s.trials()] == [CURRENT, None, None]
    attrs = s.study.user_attrs
    assert attrs[SLOTS_READY] is True
    assert (attrs[IDENTITY]["data"], attrs[IDENTITY]["code"], len(attrs[IDENTITY]["params"])) == (
        "data-1",
        "code-1",
        64,
    )
    assert str(attrs[CREATOR]).startswith(socket.gethostname() + ":")
    assert len(created) == 1 and created[0].study_name == "trainflow"
    assert not (tmp_path / "models/tune/trainflow" / SETTING_UP).exists()
    assert (s.name, s.budget, s.metric, s.minimize) == ("trainflow", 3, "val_loss", True)
    assert s.trial_dir(2) == tmp_path / "models/tune/trainflow/trial_0002" and s.directory == s.trial_dir(2).parent

    larger = open_study(p, tmp_path, 5, "data-1", "code-1", on_create=created.append)
    assert len(created) == 1  # set up once
    assert [t.number for t in larger.trials()] == [0, 1, 2, 3, 4]
    assert [t.system_attrs.get("fixed_params") for t in larger.trials()] == [CURRENT, None, None, None, None]
    smaller = open_study(p, tmp_path, 2, "data-1", "code-1")
    assert [t.number for t in smaller.trials()] == [0, 1] and len(smaller.study.trials) == 5
    smaller.study.tell(smaller.study.ask(), 1.0)  # trial 0 (WAITING slots go first)
    larger.study.tell(larger.study.ask(), 1.0)  # trial 1
    larger.study.tell(larger.study.ask(), 1.0)  # trial 2
    assert smaller.terminal() == 2 and larger.terminal() == 3

    outside = load_params(params_file, ["train.lr=0.05", "tune.study=other"])  # lr above the space's 0.01
    assert "fixed_params" not in open_study(outside, tmp_path, 1, "d", "c").trials()[0].system_attrs


def test_a_study_refuses_other_params_data_or_code_naming_which(params_file: Path, tmp_path: Path) -> None:
    p = load_params(params_file)
    open_study(p, tmp_path, 2, "d", "c")
    with pytest.raises(UserError, match=r"other params \(besides tune.trials, workers and storage\);.*trainflow-2"):
        open_study(load_params(params_file, ["train.epochs=9"]), tmp_path, 2, "d", "c")
    with pytest.raises(UserError, match=r"with other data \(data/splits\) and training code; its trials"):
        open_study(p, tmp_path, 2, "d2", "c2")
    with pytest.raises(UserError, match=r"with other training code; its trials"):
        open_study(p, tmp_path, 2, "d", "c2")
    # What a trial does not depend on may change: budget, workers, storage, backend, progress bars, the other stages.
    same = load_params(
        params_file,
        [
            "tune.trials=99",
            "tune.workers=7",
            "tune.storage=x.log",
            "tune.backend=ray",
            "train.progress=true",
            "tracking.experiment=e2",
            "register.model_name=m2",
            "evaluate.batch_size=3",
            "deploy.name=n2",
        ],
    )
    assert study_.identity(same, "d", "c") == study_.identity(p, "d", "c")
    for changed in ("tune.sampler=random", "tune.metric=val_accuracy", "train.epochs=9", "seed=1"):
        other = study_.identity(load_params(params_file, [changed]), "d", "c")
        assert other["params"] != study_.identity(p, "d", "c")["params"], changed


@pytest.mark.parametrize(
    ("marker", "creator", "finished"),
    [
        (True, None, True),  # killed right after create_study: its marker is here, it holds no lock
        (False, "{host}:4242:1700000000.00", True),  # a process of this machine, which holds no lock: dead
        (False, None, False),  # no marker, no creator: a process elsewhere may be just past create_study
        (False, "gpu-box-7:4242:1700000000.00", False),  # begun on another machine: not ours to finish
    ],
)
def test_a_study_begun_by_a_dead_process_of_this_machine_is_finished_at_once_and_one_of_another_is_not(
    params_file: Path, tmp_path: Path, marker: bool, creator: str | None, finished: bool
) -> None:
    p = load_params(params_file)
    begun = optuna.create_study(study_name="trainflow", storage=study_.storage(None, tmp_path))
    if creator is not None:
        begun.set_user_attr(CREATOR, creator.format(host=socket.gethostname()))
    if marker:
        (tmp_path / "models/tune/trainflow").mkdir(parents=True)
        (tmp_path / "models/tune/trainflow" / SETTING_UP).write_text('{"process": "x"}')
    if finished:
        s = open_study(p, tmp_path, 3, "d", "c", wait_s=0.0)
        assert [t.state for t in s.trials()] == [TrialState.WAITING] * 3
        assert s.study.user_attrs[IDENTITY]["code"] == "c"
    else:
        where = "on gpu-box-7 (gpu-box-7:4242:1700000000.00)" if creator else "on another machine"
        there = "on gpu-box-7" if creator else "where it was begun"
        why = re.escape(f"begun {where} and is still not set up after 0 s") + ".*" + re.escape(f"tune` {there} to")
        with pytest.raises(UserError, match=why):
            open_study(p, tmp_path, 3, "d", "c", wait_s=0.0)
        assert begun.trials == []  # nothing done to it


def test_a_study_whose_set_up_lock_is_held_too_long_names_the_process_holding_it(
    params_file: Path, tmp_path: Path
) -> None:
    from filelock import FileLock

    directory = tmp_path / "models/tune/trainflow"
    directory.mkdir(parents=True)
    (directory / SETTING_UP).write_text('{"process": "box:77:1.0"}')
    held = FileLock(directory / "setup.lock")
    held.acquire()
    try:
        with pytest.raises(UserError, match=r"setting it up for too long \(\{\"process\": \"box:77:1.0\"\}\), holding"):
            open_study(load_params(params_file), tmp_path, 2, "d", "c", wait_s=0.0)
    finally:
        held.release()


def test_claims_give_each_slot_once_and_a_stopped_workers_trial_to_the_next_one(
    params_file: Path, tmp_path: Path
) -> None:
    s = open_study(load_params(params_file), tmp_path, 3, "d", "c")
    claims = [claim(s) for _ in range(3)]
    assert [(c.trial.number, c.resumed) for c in claims if c] == [(0, False), (1, False), (2, False)]
    assert [t.state for t in s.trials()] == [TrialState.RUNNING] * 3
    record = json.loads((s.trial_dir(1) / CLAIMED).read_text())
    assert (record["host"], record["pid"]) == (socket.gethostname(), os.getpid())
    assert claim(s) is None and stale(s) == []  # every trial held by a live worker
    c0, c1, c2 = claims
    assert c0 and c1 and c2

    c1.release()  # its worker died: the trial is RUNNING, its lock free
    assert stale(s) == [1]
    again = claim(s)
    assert again is not None and (again.trial.number, again.resumed) == (1, True)
    assert again.directory == s.trial_dir(1)
    assert stale(s) == [] and claim(s) is None

    s.study.tell(c0.trial, 0.5)
    c0.release()
    (s.trial_dir(2) / CLAIMED).unlink()  # as if claimed on another machine: its checkpoints are not here
    c2.release()
    assert claim(s) is None and stale(s) == []
    again.release()


@pytest.mark.parametrize("then", ["running", "finished"])
def test_a_slot_another_worker_took_first_is_left_to_it(
    params_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, then: str
) -> None:
    from filelock import FileLock

    s = open_study(load_params(params_file), tmp_path, 2, "d", "c")
    storage = s.study._storage
    transition = storage.set_trial_state_values
    raced: list[int] = []

    def racing(trial_id: int, state: TrialState, values: Any = None) -> bool:
        if not raced:  # a worker elsewhere wins trial 0 between our lock and our transition (and maybe ends it)
            raced.append(trial_id)
            transition(trial_id, state=TrialState.RUNNING)
            if then == "finished":
                transition(trial_id, state=TrialState.COMPLETE, values=[1.0])
        return transition(trial_id, state=state, values=values)

    monkeypatch.setattr(storage, "set_trial_state_values", racing)
    c = claim(s)
    assert c is not None and c.trial.number == 1
    assert not (s.trial_dir(0) / CLAIMED).exists()  # it ran elsewhere
    free = FileLock(s.trial_dir(0) / "owner.lock")
    free.acquire(timeout=0)  # the lock on trial 0 was given back
    free.release()
    c.release()


def test_describe_names_each_value_by_its_last_key() -> None:
    values = {
        "train.lr": 0.00064781,
        "model.dropout": 0.1,
        "model.hidden_sizes": [128],
        "model.activation": "relu",
        "train.epochs": 3,
        "train.layer_decay": None,
    }
    assert study_.describe(values) == (
        "lr=0.0006478, dropout=0.1, hidden_sizes=[128], activation=relu, epochs=3, layer_decay=null"
    )


# --- trial.py --------------------------------------------------------------------------------------------------------


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


# --- runs.py ---------------------------------------------------------------------------------------------------------


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


# --- tune/__init__.py: the study's run, the checks, the sweep --------------------------------------------------------


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


def test_a_sweep_may_not_override_what_makes_the_splits() -> None:
    # The training seed makes no split (split.seed does): a sweep may set it.
    tune.check_overrides(["train.lr=0.1", "model.dropout=0.2", "seeds.x=1", "dataset=1", "seed=1"])
    refused = [
        ("split.seed=1", "split.seed"),
        ("data.source=x.csv", "data.source"),
        (" split.val_fraction =0.3", "split.val_fraction"),
    ]
    for override, key in refused:
        with pytest.raises(ParamsError) as err:
            tune.check_overrides(["train.lr=0.1", override])
        assert [path for path, _ in err.value.problems] == [key]
        assert "run `trainflow run` (or `dvc repro split`) first" in err.value.problems[0][1]


def test_a_sweep_runs_one_process_per_trial_on_a_measured_metric_and_existing_splits(project: Path) -> None:
    paths = Paths(project)
    tune.check(sweep_params(project), paths)
    tune.check(sweep_params(project, "tune.metric=val_roc_auc", "train.monitor=val_roc_auc"), paths)
    with pytest.raises(ParamsError) as err:
        tune.check(sweep_params(project, "train.world_size=2"), paths)
    assert [path for path, _ in err.value.problems] == ["train.world_size"]
    with pytest.raises(ParamsError) as err:
        tune.check(sweep_params(project, "tune.metric=val_pr_auc"), paths)
    assert err.value.problems == [
        ("tune.metric", "val_pr_auc is measured only when it is train.monitor; set train.monitor: val_pr_auc too")
    ]
    paths.split_file("val").unlink()
    with pytest.raises(UserError, match=rf"tune: {paths.split_file('val')} is missing; run `trainflow stage split`"):
        tune.check(sweep_params(project), paths)


def test_the_worker_reads_its_spec_from_stdin_and_runs_the_study_without_progress_bars(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainflow.engine.fingerprint import data_hash

    p = sweep_params(project, "train.progress=true")
    spec = {"root": str(project), "params": p.model_dump(mode="json"), "budget": "3", "max_trials": 1}
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(spec)))
    calls: list[tuple[Any, ...]] = []

    def work(*args: Any) -> int:
        calls.append(args)
        return 1

    monkeypatch.setattr(tune, "work", work)
    assert worker.main() == 0
    assert json.loads(capsys.readouterr().out) == {"trials_run": 1}
    ((params, root, budget, data, code, max_trials),) = calls
    assert params.train.progress is False and params.model_dump(exclude={"train"}) == p.model_dump(exclude={"train"})
    assert (root, budget, max_trials) == (project, 3, 1)
    assert data == data_hash(Paths(project)) and len(code) == 64
    assert sys.path[0] == str(project)  # a user model imports from the project


def test_a_worker_that_meets_a_user_or_service_error_says_so_and_exits_with_its_code(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def main(p: PipelineParams) -> int:
        spec = {"root": str(project), "params": p.model_dump(mode="json"), "budget": 2}
        monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(spec)))
        return worker.main()

    assert main(sweep_params(project, "model.code=missing.py")) == 2
    assert "error: model.code: missing.py does not exist under" in capsys.readouterr().err

    def down(*args: Any) -> int:
        raise ServiceError("MLflow did not answer")

    monkeypatch.setattr(tune, "work", down)
    assert main(sweep_params(project)) == 1
    captured = capsys.readouterr()
    assert "error: MLflow did not answer" in captured.err and captured.out == ""


def test_a_two_trial_sweep_in_this_process_writes_its_results_ends_its_run_and_applies_the_best(
    project: Path,
) -> None:
    """Real training (iris, one epoch a trial): trial 0 is params.yaml's values, the best trial is the lowest val_loss
    of trials.csv, the study's run ends with it, --apply writes it; a rerun with the budget spent runs nothing."""
    paths, p = Paths(project), sweep_params(project)
    summary = tune.run(p, paths, apply=True)
    got = pd.read_csv(paths.reports / "tune/trials.csv")
    assert list(got["trial"]) == [0, 1] and list(got["state"]) == ["complete", "complete"]
    assert got.loc[0, ["train.lr", "model.dropout", "model.hidden_sizes"]].tolist() == [0.002, 0.1, "[256, 128]"]
    best = yaml.safe_load((paths.reports / "tune/best_params.yaml").read_text())
    assert best["value"] == got["val_loss"].min() and best["trial"] == got["val_loss"].idxmin()
    assert summary["best"] == best and summary["states"] == {"complete": 2} and summary["trials"] == 2
    assert summary["applied"][-1] == f"register.tags.tune_trial='{best['trial']}'"
    applied = load_params(paths.params)
    assert applied.train.lr == best["params"]["train.lr"] and applied.register.tags["tune_trial"] == str(best["trial"])

    all_runs = mlflow_runs(project)
    (parent,) = [r for r in all_runs if r.data.tags.get("trainflow.tune.role") == "study"]
    children = [r for r in all_runs if "mlflow.parentRunId" in r.data.tags]
    assert parent.info.status == "FINISHED" and parent.data.metrics["best_val_loss"] == best["value"]
    assert sorted(r.data.tags["trainflow.tune.trial"] for r in children) == ["0", "1"]
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parent.info.run_id}
    assert not list((project / "models/tune").rglob("checkpoints"))  # ended trials keep no checkpoints

    again = tune.run(p, paths)  # the params before --apply (applied ones are another study's)
    assert again["best"] == best and len(mlflow_runs(project)) == 3  # the budget was spent: nothing ran


def test_a_sweep_leaves_a_trial_a_live_worker_holds_and_a_rerun_resumes_the_one_a_stopped_worker_left(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_training(monkeypatch, [{"update": 7, "val_loss": 0.5}], 7)
    p, paths = sweep_params(project), Paths(project)
    elsewhere = open_study(p, project, 2, *tune_study.hashes(p, paths), on_create=tune_runs.parent_run(p, project))
    held = claim(elsewhere)  # another command's worker runs trial 0
    assert held is not None and held.trial.number == 0
    summary = tune.run(p, paths)
    assert summary["running_elsewhere"] == 1 and summary["states"] == {"running": 1, "complete": 1}
    (parent,) = [r for r in mlflow_runs(project) if r.data.tags.get("trainflow.tune.role") == "study"]
    assert parent.info.status == "RUNNING"  # the last worker to end finishes it

    held.release()  # that worker was killed
    with monkeypatch.context() as m:
        m.setattr(tune, "work", lambda *args: 0)  # and this command's worker stops too
        left = r"1 of 2 trials did not end \(trials left by a stopped worker: \[0\]\)"
        with pytest.raises(tune.TuneIncomplete, match=left):
            tune.run(p, paths)
    summary = tune.run(p, paths)  # the rerun takes trial 0 over
    assert summary["states"] == {"complete": 2} and "running_elsewhere" not in summary
    assert get_run(project, parent.info.run_id).info.status == "FINISHED"


def test_a_sweep_whose_trials_all_failed_has_nothing_to_apply(project: Path) -> None:
    paths = Paths(project)
    before = paths.params.read_text()
    p = sweep_params(project, "tune.space={train.layer_decay: {type: categorical, choices: [0.8]}}")
    with pytest.raises(UserError, match="tune --apply: no trial completed, nothing to apply"):
        tune.run(p, paths, apply=True)
    assert list(pd.read_csv(paths.reports / "tune/trials.csv")["state"]) == ["failed", "failed"]
    assert not (paths.reports / "tune/best_params.yaml").exists()
    assert paths.params.read_text() == before
    (parent,) = [r for r in mlflow_runs(project) if r.data.tags.get("trainflow.tune.role") == "study"]
    assert parent.info.status == "FINISHED" and "best_val_loss" not in parent.data.metrics


# --- ray_backend.py: the helpers that need no running Ray ------------------------------------------------------------


def test_ray_trials_are_numbered_by_the_order_in_their_directory_names() -> None:
    names = ["trial_ab_10_lr=0.1", "trial_ab_2_lr=0.1", "odd", "trial_ab_x_1", "trial_cd_1"]
    order = [ray_backend._order(SimpleNamespace(path=f"/ray/exp/{n}")) for n in names]
    assert order == [10, 2, 1 << 30, 1 << 30, 1]


def test_ray_samples_with_the_sampler_tune_names_and_defines_the_encoded_space(params_file: Path) -> None:
    from optuna.samplers import GridSampler, RandomSampler, TPESampler

    def made(kind: str, *extra: str) -> Any:
        return ray_backend._sampler(load_params(params_file, [f"tune.sampler={kind}", *extra]).tune, 0)

    assert type(made("tpe")) is TPESampler and type(made("random")) is RandomSampler
    stepped = "tune.space={train.epochs: {type: int, low: 1, high: 3}}"
    grid = made("grid", stepped)
    assert type(grid) is GridSampler
    s = optuna.create_study(sampler=grid)
    epochs = load_params(params_file, [stepped]).tune.space

    def objective(t: optuna.Trial) -> float:
        ray_backend._define(t, epochs)
        return 1.0

    s.optimize(objective, n_trials=5)  # the grid stops it after its 3 points
    assert sorted(t.params["train.epochs"] for t in s.trials) == [1, 2, 3]

    t = optuna.create_study().ask()
    ray_backend._define(t, load_params(params_file).tune.space)
    assert t.distributions == {
        "train.lr": LR,
        "model.dropout": FloatDistribution(0.0, 0.5),
        "model.hidden_sizes": SIZES,
    }


def ray_result(n: int, metrics: dict[str, Any], history: pd.DataFrame | None = None, error: Any = None) -> Any:
    config = {"train.lr": 0.001 * n, "model.dropout": 0.1, "model.hidden_sizes": "[128]", "not.in.space": 1}
    return SimpleNamespace(
        path=f"/ray/exp/trial_{n:x}_{n}_lr", metrics=metrics, metrics_dataframe=history, error=error, config=config
    )


def test_ray_results_become_optuna_trials_by_how_each_ended(params_file: Path, tmp_path: Path) -> None:
    E, F = ray_backend.ENDED, ray_backend.FAILED
    # Evaluations at updates 7, 14 and 21, then the final report: the value at the best update (14), at update 21.
    complete = pd.DataFrame({"update": [7, 14, 21, 21], "val_loss": [0.5, 0.4, 0.45, 0.4], E: [None, None, None, 1]})
    grid = [
        ray_result(5, {}),  # never reported
        ray_result(
            3, {"trial_id": "c", "val_loss": 0.9, "update": 7}, pd.DataFrame({"update": [7], "val_loss": [0.9]})
        ),
        ray_result(
            1, {"trial_id": "a", "val_loss": 0.4, E: 1, "resumed_from_update": -1, "time_total_s": 12.0}, complete
        ),
        ray_result(2, {"trial_id": "b", E: 1, F: "train: min_lr above lr"}),
        ray_result(4, {"trial_id": "d", "val_loss": 0.7}, error=RuntimeError("worker died")),
        ray_result(6, {"trial_id": "f", E: 1, "val_loss": math.nan}),
        ray_result(7, {"trial_id": "g", "val_loss": 0.3, E: 1, "resumed_from_update": 14}),
    ]
    run_json = tmp_path / "models/tune/trainflow/ray/a/run.json"
    run_json.parent.mkdir(parents=True)
    run_json.write_text(json.dumps({"key": "k", "run_id": "run-a"}))
    s, left = ray_backend._study(load_params(params_file), Paths(tmp_path), grid, "val_loss", True, 8)

    trials = s.study.trials
    assert [t.user_attrs["ray_trial_id"] for t in trials] == ["a", "b", "c", "d", "", "f", "g"]  # Ray's order
    assert [t.state for t in trials] == [
        TrialState.COMPLETE,
        TrialState.FAIL,
        TrialState.PRUNED,
        TrialState.RUNNING,
        TrialState.WAITING,
        TrialState.FAIL,
        TrialState.COMPLETE,
    ]
    assert [t.value for t in trials] == [0.4, None, None, None, None, None, 0.3]
    assert left == 3  # the RUNNING and WAITING ones, and one of the budget Ray never made
    a = trials[0]
    assert a.intermediate_values == {7: 0.5, 14: 0.4, 21: 0.45}  # the evaluations, not the final report
    assert a.params == {"train.lr": 0.001, "model.dropout": 0.1, "model.hidden_sizes": "[128]"}
    assert a.user_attrs == {"ray_trial_id": "a", "mlflow_run_id": "run-a"}
    assert a.datetime_complete is not None and a.datetime_start == a.datetime_complete - timedelta(seconds=12)
    assert trials[6].user_attrs["resumed_from_update"] == 14 and trials[2].intermediate_values == {7: 0.9}
    assert (s.name, s.budget, s.metric, s.minimize) == ("trainflow", 8, "val_loss", True)
    top = results.best(s)
    assert top is not None and top["trial"] == 6


def test_the_ray_studys_run_is_made_once_beside_the_experiment_and_refuses_other_params(project: Path) -> None:
    paths = Paths(project)
    experiment = project / "models/tune/ray/trainflow"
    record = project / "models/tune/ray/trainflow.parent.json"
    first = ray_backend._parent(sweep_params(project), paths, experiment)
    assert first is not None
    held = json.loads(record.read_text())
    assert held["run_id"] == first and get_run(project, first).data.tags[runs.KEY_TAG] == held["key"]
    assert ray_backend._parent(sweep_params(project), paths, experiment) == first
    record.write_text(json.dumps({**held, "run_id": None}))  # killed before it recorded the run's id
    assert ray_backend._parent(sweep_params(project), paths, experiment) == first
    assert json.loads(record.read_text())["run_id"] == first
    assert [r.info.run_id for r in mlflow_runs(project)] == [first]
    with pytest.raises(UserError, match=r"was run with other params; .*-S tune.study=<new name>"):
        ray_backend._parent(sweep_params(project, "train.epochs=3"), paths, experiment)

    p = sweep_params(project)
    spec = {"data_hash": "dh", "parent": first}
    trial_record = project / "models/tune/trainflow/ray/t1/run.json"
    trial_record.parent.mkdir(parents=True)
    run = ray_backend._child_run(project, p, p, "t1", spec, trial_record)
    tags = get_run(project, str(run.run_id)).data.tags
    assert json.loads(trial_record.read_text()) == {"key": tags[runs.KEY_TAG], "run_id": run.run_id}
    assert (tags["mlflow.parentRunId"], tags["trainflow.tune.backend"], tags["trainflow.data_sha256"]) == (
        first,
        "ray",
        "dh",
    )
    assert ray_backend._child_run(project, p, p, "t1", spec, trial_record).run_id == run.run_id  # restored: carried on
    assert len(mlflow_runs(project)) == 2


def test_a_trial_asha_stopped_is_marked_pruned_and_its_run_ended_unless_it_had_ended(project: Path) -> None:
    from mlflow.tracking import MlflowClient

    tracking.configure(project)  # as ray_backend.run does before it marks trials
    client = MlflowClient()
    experiment = tracking.ensure_experiment("trainflow", project)
    stopped = client.create_run(experiment).info.run_id  # ASHA stopped its process: the run was left RUNNING
    failed = client.create_run(experiment).info.run_id
    client.set_terminated(failed, "FAILED")
    for run_id in (stopped, failed, ""):  # "": the trial recorded no run
        ray_backend._mark_pruned(run_id)
    assert get_run(project, stopped).info.status == "FINISHED"
    assert get_run(project, failed).info.status == "FAILED"
    assert {get_run(project, r).data.tags["trainflow.tune.state"] for r in (stopped, failed)} == {"pruned"}


class FakeTuner:
    """ray.tune.Tuner run in this process: each trial's config, one after another, through the trainable that
    ray_backend.run built (Ray's context and reports faked); fit() returns the results as a ResultGrid holds them."""

    def __init__(self, trainable: Any, tune_config: Any, run_config: Any) -> None:
        self.trainable, self.samples = trainable, tune_config.num_samples

    @staticmethod
    def can_restore(path: str) -> bool:
        return False

    def fit(self) -> list[Any]:
        from ray import tune as ray_tune

        configs = [CURRENT, {"train.lr": 0.0005, "model.dropout": 0.3, "model.hidden_sizes": "[128]"}]
        grid = []
        for n, config in enumerate(configs[: self.samples], start=1):
            trial_id = f"t{n}"
            reports: list[dict[str, Any]] = []
            context = SimpleNamespace(get_trial_id=lambda trial_id=trial_id: trial_id)
            with pytest.MonkeyPatch.context() as m:
                m.setattr(ray_tune, "get_context", lambda context=context: context)
                m.setattr(ray_tune, "report", reports.append)
                self.trainable(config)
            grid.append(SimpleNamespace(
                path=f"/ray/exp/trial_{trial_id}_{n}_x", config=config, error=None,
                metrics={**reports[-1], "trial_id": trial_id}, metrics_dataframe=pd.DataFrame(reports),
            ))  # fmt: skip
        return grid


def test_a_ray_sweep_gives_its_trials_the_data_hash_and_writes_the_results_ray_returns(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ray_backend.run without a Ray cluster: Tuner, with_parameters (which needs Ray's object store) and
    with_resources faked; the trials are ray_backend.trial itself, on training that logs two evaluations. Ray is an
    optional extra (README line 2 does not install it; `scripts/test.sh --slow` and bench/mutation.sh's venv do)."""
    ray = pytest.importorskip("ray", reason="tune.backend ray is an optional extra: pip install -e '.[ray]'")
    from ray import tune as ray_tune

    from trainflow.engine.fingerprint import data_hash

    def setup(params: PipelineParams, paths: Paths, device: Any, group: Any, checkpoints: Path, logger: Any) -> Any:
        history = [{"update": 7, "val_loss": 0.6 + params.model.dropout}, {"update": 14, "val_loss": 0.5}]

        def fit(train: Any, val: Any) -> Any:
            for point in history:
                logger.log({"val_loss": point["val_loss"]}, point["update"])
            return SimpleNamespace(history=history, best_update=14, updates=14)

        return SimpleNamespace(trainer=SimpleNamespace(fit=fit, resumed_from=None), train=None, val=None,
                               discard=lambda: None)  # fmt: skip

    monkeypatch.setattr(trainflow.stages.train, "setup", setup)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray_tune, "with_parameters", lambda trainable, **kw: lambda config: trainable(config, **kw))
    monkeypatch.setattr(ray_tune, "with_resources", lambda trainable, resources: trainable)
    monkeypatch.setattr(ray_tune, "Tuner", FakeTuner)
    paths = Paths(project)
    summary = tune.run(sweep_params(project, "tune.backend=ray"), paths)

    got = pd.read_csv(paths.reports / "tune/trials.csv")
    assert list(got["state"]) == ["complete", "complete"] and list(got["val_loss"]) == [0.5, 0.5]
    assert list(got["model.dropout"]) == [0.1, 0.3] and summary["trials"] == 2
    children = {r.info.run_id: r for r in mlflow_runs(project) if "mlflow.parentRunId" in r.data.tags}
    assert set(children) == set(got["mlflow_run_id"])
    assert {r.data.tags["trainflow.data_sha256"] for r in children.values()} == {data_hash(paths)}
    assert {r.data.tags["trainflow.tune.trial"] for r in children.values()} == {"t1", "t2"}


def test_local_workers_each_get_their_share_of_the_cores_and_the_study_on_stdin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`trainflow tune` with 2 workers on 8 cores: each worker process is `python -m trainflow.tune.worker`, numbered,
    with OMP_NUM_THREADS=4 (torch's threads: the cores split between them), the study's spec on its stdin; a worker
    that exits non-zero is returned as stopped."""
    started: list[dict[str, Any]] = []

    class Worker:
        def __init__(self, argv: list[str], stdin: Any, env: dict[str, str]) -> None:
            self.stdin = io.BytesIO()
            self.stdin.close = lambda: None  # type: ignore[method-assign]  # keep what was written readable
            self.pid = 1000 + len(started)
            self.returncode = 3 if started else 0  # the second one fails
            started.append({"argv": argv, "env": env, "stdin": self.stdin})

        def poll(self) -> int:
            return self.returncode

    monkeypatch.setattr(tune, "subprocess", SimpleNamespace(Popen=Worker, PIPE=-1))
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setenv("OMP_NUM_THREADS", "16")  # this process's own setting is not the workers'
    study = SimpleNamespace(
        budget=6, root=tmp_path, params=SimpleNamespace(model_dump=lambda mode: {"seed": 7}), terminal=lambda: 6
    )
    assert tune._work_locally(study, 2) == ["1"]
    assert [w["argv"] for w in started] == [[sys.executable, "-m", "trainflow.tune.worker"]] * 2
    numbered = [(w["env"]["TRAINFLOW_TUNE_WORKER"], w["env"]["OMP_NUM_THREADS"]) for w in started]
    assert numbered == [("0", "4"), ("1", "4")]
    assert all(w["env"]["PATH"] == os.environ["PATH"] for w in started)  # the rest of the environment is inherited
    assert [json.loads(w["stdin"].getvalue()) for w in started] == [
        {"root": str(tmp_path), "params": {"seed": 7}, "budget": 6}
    ] * 2


def test_apply_alone_after_a_sweep_with_s_reopens_the_study_with_its_s_and_adds_no_trial(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """README's `trainflow tune -S train.epochs=10 --trials 30` then `trainflow tune --apply`: the second command has
    no -S, and a study refuses other params than it was run with, so --apply alone refused unless the -S were repeated.
    The study records them; --apply alone reopens it with them, applies its best trial, and runs nothing more."""
    from trainflow import cli

    monkeypatch.chdir(project)
    monkeypatch.setattr(cli, "prepare_data", lambda paths: None)  # the splits are made (no DVC in this project)
    fake_training(monkeypatch, [{"update": 1, "val_loss": 0.5}], best=1)
    assert cli.main(["tune", "-S", "train.epochs=2", "--trials", "3", "--workers", "1"]) == 0
    before = load_params(project / "params.yaml")
    assert before.train.epochs == 1  # -S applies to the sweep only
    capsys.readouterr()

    assert cli.main(["tune", "--apply"]) == 0
    out, err = capsys.readouterr()
    assert "was run with -S train.epochs=2; reopened with them" in err
    result = json.loads(out)
    assert result["trials"] == 3 and result["states"] == {"complete": 3}  # its 3 trials, none added, none run
    applied = load_params(project / "params.yaml")
    assert applied.register.tags["tune_trial"] == str(result["best"]["trial"])
    assert applied.train.epochs == 1  # the sweep's -S are not written: only the best trial's values are
