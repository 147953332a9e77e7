"""`trainflow tune`: the budget holds across kills, restarts and concurrent commands; a killed trial resumes from its
own checkpoint; a restarted study suggests what the uninterrupted one did; pruning follows the median rule; MLflow
nests one child run per trial under the study's run; --apply feeds the normal pipeline."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from support.projects import make_project, split_project
from support.sweeps import trials

from trainflow.core.errors import ParamsError
from trainflow.params import load_params

SWEEP = {
    "data.source": "builtin:iris",
    "register.model_name": "iris",
    "train.epochs": 4,
    "train.batch_size": 16,
    "train.progress": "false",
    "tune.trials": 8,
    "tune.workers": 1,
}


def tune(root: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}", **env}
    return subprocess.run(
        [sys.executable, "-m", "trainflow", "tune", *args], cwd=root, env=full, capture_output=True, text=True
    )


def study(root: Path) -> Any:
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(root / "models/tune/journal.log")))
    return optuna.load_study(study_name="trainflow", storage=storage)


def runs(root: Path) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    return client.search_runs([client.get_experiment_by_name("trainflow").experiment_id])


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project with its splits made and committed and its MLflow database created, for each test to copy."""
    return split_project(tmp_path_factory.mktemp("prepared") / "proj", SWEEP)


def copy(prepared: Path, dest: Path) -> Path:
    return Path(shutil.copytree(prepared, dest))


@pytest.fixture(scope="module")
def uninterrupted(prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = copy(prepared, tmp_path_factory.mktemp("a") / "proj")
    done = tune(root)
    assert done.returncode == 0, done.stderr
    return root


@pytest.mark.slow  # about a minute: README line 2 stays under 10 minutes
def test_a_killed_sweep_resumes_its_trial_and_suggests_what_the_uninterrupted_one_did(
    prepared: Path, uninterrupted: Path, tmp_path: Path
) -> None:
    root = copy(prepared, tmp_path / "proj")
    # Each trial writes 4 checkpoints (one per epoch): the 7th write is trial 1's third (update 21), so its
    # checkpoint at update 14 is complete when the process dies.
    killed = tune(root, TRAINFLOW_FAILPOINT="checkpoint_write:7")
    assert killed.returncode == -9, killed.stderr
    assert study(root).trials[1].state.name == "RUNNING"  # what Optuna alone would leave behind forever
    rerun = tune(root)
    assert rerun.returncode == 0, rerun.stderr
    assert "trial 1: taking over the trial of a stopped worker" in rerun.stderr
    assert "at update 14" in rerun.stderr

    got, want = trials(root), trials(uninterrupted)
    assert list(got["trial"]) == list(range(8))  # exactly the budget, no number twice
    assert set(got["state"]) <= {"complete", "pruned"}
    assert got.loc[got["trial"] == 1, "resumed_from_update"].item() == 14
    assert got["resumed_from_update"].isna().sum() == 7
    columns = ["trial", "state", "val_loss", "last_update", "train.lr", "model.dropout", "model.hidden_sizes"]
    # The same params trial by trial (per-trial sampler seeds), and bit-exact resume: the same values.
    pd.testing.assert_frame_equal(got[columns], want[columns])
    # Trial 0 is the params as they are; the best trial is never worse.
    params = load_params(root / "params.yaml")
    first = got.iloc[0]
    assert (first["train.lr"], first["model.dropout"]) == (params.train.lr, params.model.dropout)
    assert json.loads(first["model.hidden_sizes"]) == params.model.hidden_sizes
    best = yaml.safe_load((root / "reports/tune/best_params.yaml").read_text())
    complete = got[got["state"] == "complete"]
    assert best["value"] == complete["val_loss"].min() <= first["val_loss"]
    assert best["trial"] == complete.loc[complete["val_loss"].idxmin(), "trial"]

    # MLflow: one study run, one child per trial (the resumed trial carried on its run, not a second one).
    all_runs = runs(root)
    parents = [r for r in all_runs if r.data.tags.get("trainflow.tune.role") == "study"]
    children = [r for r in all_runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert sorted(int(r.data.tags["trainflow.tune.trial"]) for r in children) == list(range(8))
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    assert {r.data.tags["trainflow.tune.state"] for r in children} == set(got["state"])
    assert all(r.data.tags["git_commit"] != "unknown" and r.data.tags["trainflow.data_sha256"] for r in children)
    # A trial's checkpoints go once it has ended; the pipeline's are never touched.
    assert not list((root / "models/tune").rglob("*.safetensors"))
    assert not (root / "models/checkpoints").exists()

    # The budget holds across reruns: nothing left to do, then a larger budget adds exactly the difference.
    again = tune(root)
    assert again.returncode == 0 and "8/8 trials ended" in again.stderr
    more = tune(root, "--trials", "10")
    assert more.returncode == 0, more.stderr
    assert list(trials(root)["trial"]) == list(range(10))


@pytest.mark.slow  # a study of 8 trials, shared (~20 s); line 2: tests/tune/test_study.py
def test_pruned_trials_were_below_the_median_of_the_finished_ones_at_that_update(uninterrupted: Path) -> None:
    s = study(uninterrupted)
    ended = sorted((t for t in s.trials if t.state.name in ("COMPLETE", "PRUNED")), key=lambda t: t.number)
    pruned = [t for t in ended if t.state.name == "PRUNED"]
    assert pruned, "a sweep of 8 trials with the median pruner pruned none"
    for t in pruned:
        step = max(t.intermediate_values)
        # MedianPruner: after 5 trials have finished, a trial whose value at a step is worse (val_loss: higher)
        # than the median of the finished trials' values at that step stops there. (Sequential: trials finish in
        # number order.)
        before = [u for u in ended if u.number < t.number and u.state.name == "COMPLETE"]
        assert len(before) >= 5
        median = statistics.median(u.intermediate_values[step] for u in before if step in u.intermediate_values)
        assert t.intermediate_values[step] > median
        assert step < max(ended[0].intermediate_values)  # stopped before the end


@pytest.mark.slow  # about 30 s
def test_two_commands_on_one_study_share_its_budget(prepared: Path, tmp_path: Path) -> None:
    from trainflow.params import write_overrides

    # Trials of ~1 s (more, smaller updates), so that the two commands overlap. (The splits and the MLflow database's
    # schema are made already: neither command makes them while the other does.)
    root = copy(prepared, tmp_path / "proj")
    write_overrides(root / "params.yaml", ["train.epochs=10", "train.batch_size=4"])
    # One core each (as `trainflow tune --workers 2` gives its workers): two torch processes that each spin two
    # threads on two cores run several times slower.
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}", "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "trainflow", "tune"], cwd=root, env=env, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    errs = [p.communicate()[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    got = trials(root)
    assert list(got["trial"]) == list(range(8)) and set(got["state"]) <= {"complete", "pruned"}
    ran = [
        int(line.split("trial ")[1].split()[0])
        for e in errs
        for line in e.splitlines()
        if " complete: " in line or " pruned: " in line
    ]
    assert sorted(ran) == list(range(8))  # each trial ran in exactly one of the two commands
    assert all(" complete: " in e or " pruned: " in e for e in errs)  # both did work
    children = [r for r in runs(root) if "mlflow.parentRunId" in r.data.tags]
    assert sorted(int(r.data.tags["trainflow.tune.trial"]) for r in children) == list(range(8))


@pytest.mark.slow  # a study of 8 trials, shared (~20 s); line 2: tests/tune/test_results.py
def test_apply_writes_the_best_params_and_the_registered_version_names_its_trial(
    uninterrupted: Path, tmp_path: Path
) -> None:
    from trainflow.core.paths import Paths
    from trainflow.stages import run_stage

    root = tmp_path / "proj"
    shutil.copytree(uninterrupted, root)
    before = (root / "params.yaml").read_text()
    applied = tune(root, "--apply")
    assert applied.returncode == 0, applied.stderr
    best = yaml.safe_load((root / "reports/tune/best_params.yaml").read_text())
    params = load_params(root / "params.yaml")
    assert params.train.lr == best["params"]["train.lr"] != 0.002
    assert params.model.dropout == best["params"]["model.dropout"]
    assert params.model.hidden_sizes == best["params"]["model.hidden_sizes"]
    assert params.register.tags == {"tune_study": "trainflow", "tune_trial": str(best["trial"])}
    text = (root / "params.yaml").read_text()
    assert "# micro-batch size" in text and len(text.splitlines()) >= len(before.splitlines())
    paths = Paths(root)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{root / 'mlflow.db'}"
    for stage in ("train", "evaluate", "register"):
        result = run_stage(stage, params, paths)
    assert result["tags"]["tune_study"] == "trainflow" and result["tags"]["tune_trial"] == str(best["trial"])
    from mlflow.tracking import MlflowClient

    version = MlflowClient().get_model_version("iris", str(result["version"]))
    assert version.tags["tune_trial"] == str(best["trial"]) and version.tags["tune_study"] == "trainflow"


@pytest.mark.slow  # a study of 8 trials, shared (~20 s); line 2: tests/tune/test_study.py
def test_a_study_refuses_other_params_and_a_sweep_refuses_data_overrides(
    uninterrupted: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainflow.cli import main

    root = tmp_path / "proj"
    shutil.copytree(uninterrupted, root)
    # The refusals in this process (`main` as the command runs it): they come before any trial, and a process
    # start costs seconds.
    monkeypatch.chdir(root)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlflow.db'}")
    assert main(["tune", "-S", "train.epochs=5"]) == 2
    err = capsys.readouterr().err
    assert "study 'trainflow' was started with other params" in err
    assert "-S tune.study=trainflow-2" in err
    followed = tune(root, "-S", "train.epochs=5", "-S", "tune.study=trainflow-2", "--trials", "1")
    assert followed.returncode == 0, followed.stderr  # the fix the message suggests works
    assert main(["tune", "-S", "split.val_fraction=0.2"]) == 2
    err = capsys.readouterr().err
    assert "split.val_fraction" in err and "dvc repro split" in err
    assert (root / "params.yaml").read_text() == (uninterrupted / "params.yaml").read_text()  # never rewritten


@pytest.mark.parametrize(
    ("override", "path", "why"),
    [
        ("tune.space={train.lrr: {type: float, low: 0.1, high: 1}}", "tune.space.train.lrr", "has no field 'lrr'"),
        ("tune.space={data.source: {type: categorical, choices: [a]}}", "tune.space.data.source", "data and split"),
        ("tune.space={model.dropout: {type: float, low: 0.1, high: 1.5}}", "tune.space.model.dropout", "1.5"),
        ("tune.space={train.world_size: {type: int, low: 1, high: 2}}", "tune.space.train.world_size", "one process"),
        (
            "tune.space={model.hidden_sizes: {type: categorical, choices: [[8], [0]]}}",
            "tune.space.model.hidden_sizes",
            "[0] is not a valid value",
        ),
    ],
)
def test_the_space_is_checked_against_the_params_schema(params_file: Path, override: str, path: str, why: str) -> None:
    with pytest.raises(ParamsError) as err:
        load_params(params_file, [override])
    assert [p for p, _ in err.value.problems] == [path]
    assert why in err.value.problems[0][1]


def test_grid_needs_steps_and_fits_the_budget(params_file: Path, tmp_path: Path) -> None:
    from trainflow.tune import space

    p = load_params(params_file, ["tune.sampler=grid"])
    with pytest.raises(ParamsError, match="needs choices or a step"):
        space.grid(p.tune.space)
    p = load_params(
        params_file,
        [
            "tune.space={train.lr: {type: float, low: 0.001, high: 0.003, step: 0.001}, "
            "model.hidden_sizes: {type: categorical, choices: [[8], [16, 8]]}}"
        ],
    )
    assert space.grid(p.tune.space) == {"train.lr": [0.001, 0.002, 0.003], "model.hidden_sizes": ["[8]", "[16, 8]"]}


@pytest.mark.slow
def test_the_sweep_flow_fans_trials_out_as_tasks(tmp_path: Path, prefect_server: None) -> None:
    from flows.sweep import sweep

    # 3 trials, 2 at a time: one task waits for a free worker. (Each task is a worker process: seconds to start.)
    root = make_project(tmp_path / "proj", {**SWEEP, "tune.trials": 3, "tune.workers": 2})
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{root / 'mlflow.db'}"
    summary = sweep(root=str(root), overrides=["train.epochs=3"])
    assert summary["ended"] == summary["trials"] == 3
    got = trials(root)
    assert list(got["trial"]) == [0, 1, 2] and set(got["state"]) <= {"complete", "pruned"}
    assert (root / "reports/tune/best_params.yaml").is_file()
    children = [r for r in runs(root) if "mlflow.parentRunId" in r.data.tags]
    assert sorted(int(r.data.tags["trainflow.tune.trial"]) for r in children) == [0, 1, 2]
    assert load_params(root / "params.yaml").train.epochs == 4  # the overrides were the sweep's alone


@pytest.mark.slow
def test_the_default_sweep_with_a_killed_worker_then_apply_and_run(tmp_path: Path) -> None:
    """The acceptance run on the default dataset (digits): 12 trials, 2 workers, median pruner; worker 1 is SIGKILLed
    in its second trial; then --apply and `trainflow run` register the best params."""
    import time

    root = make_project(tmp_path / "proj", {"train.progress": "false"})
    start = time.perf_counter()
    swept = tune(root, TRAINFLOW_FAILPOINT="checkpoint_write:45", TRAINFLOW_FAILPOINT_WORKER="1")
    seconds = time.perf_counter() - start
    assert "worker 1" in swept.stderr and "killed by signal 9" in swept.stderr
    assert seconds < 300
    if swept.returncode != 0:  # worker 0 had finished before worker 1 died: the rerun resumes its trial
        assert "rerun `trainflow tune` to resume" in swept.stderr
        swept = tune(root)
        assert swept.returncode == 0, swept.stderr
    got = trials(root)
    assert list(got["trial"]) == list(range(12)) and set(got["state"]) <= {"complete", "pruned"}
    assert (got["state"] == "pruned").any()
    assert got["resumed_from_update"].notna().sum() == 1  # the killed trial, from its own checkpoint
    baseline = got.iloc[0]["val_loss"]
    assert got.loc[got["state"] == "complete", "val_loss"].min() <= baseline
    all_runs = runs(root)
    assert sum(r.data.tags.get("trainflow.tune.role") == "study" for r in all_runs) == 1
    assert sorted(
        int(r.data.tags["trainflow.tune.trial"]) for r in all_runs if "mlflow.parentRunId" in r.data.tags
    ) == list(range(12))

    assert tune(root, "--apply").returncode == 0
    best = yaml.safe_load((root / "reports/tune/best_params.yaml").read_text())
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}"}
    ran = subprocess.run([sys.executable, "-m", "trainflow", "run"], cwd=root, env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    registration = json.loads((root / "reports/registration.json").read_text())
    assert (
        registration["tags"]["tune_trial"] == str(best["trial"]) and registration["tags"]["tune_study"] == "trainflow"
    )
    params = load_params(root / "params.yaml")
    assert params.train.lr == best["params"]["train.lr"]
    status = subprocess.run(["dvc", "status"], cwd=root, capture_output=True, text=True)
    assert "up to date" in status.stdout, status.stdout


def test_a_ranked_tune_metric_must_be_the_monitor(tmp_path: Path) -> None:
    """val_roc_auc is measured only when it is train.monitor: a sweep on it otherwise is refused up front, saying so,
    and following the advice is accepted (the next complaint is the missing splits)."""
    from trainflow import tune
    from trainflow.core.errors import UserError
    from trainflow.core.paths import Paths

    root = make_project(tmp_path / "p")
    params = load_params(root / "params.yaml", ["tune.metric=val_roc_auc"])
    with pytest.raises(ParamsError, match=r"tune.metric.*set train.monitor: val_roc_auc"):
        tune.check(params, Paths(root))
    params = load_params(root / "params.yaml", ["tune.metric=val_roc_auc", "train.monitor=val_roc_auc"])
    with pytest.raises(UserError, match="run `trainflow stage split` first"):
        tune.check(params, Paths(root))
    assert params.train.minimize is False  # AUCs are maximised; ece minimised
    assert load_params(root / "params.yaml", ["train.monitor=val_ece"]).train.minimize is True
