"""A whole sweep (trainflow.tune: `run`, `work`, `check`, the local workers and `apply`): what a sweep may override, the
lines `trainflow tune` prints and the summary it returns, trials.csv, the runs it leaves, when it starts workers and
what it says when they stop, how a worker claims and releases trials, and applying the best params afterwards. Training
is the train stage's `setup` replaced by one that logs a fixed history; the project is support/sweeps.py's iris project
(its own MLflow store). The sweep code is called in this process, so that mutation testing sees which function each test
reached (tests/stages/test_tune*.py run `trainflow tune` in subprocesses)."""

from __future__ import annotations

import io
import json
import math
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pandas as pd
import pytest
import yaml
from support import sweeps
from support.sweeps import fake_training, get_run, mlflow_runs, own_tags, sweep_params

import trainflow.stages.train
from trainflow import tune
from trainflow.core.errors import ParamsError, UserError
from trainflow.core.paths import Paths
from trainflow.params import PipelineParams, load_params
from trainflow.tune import runs
from trainflow.tune import runs as tune_runs
from trainflow.tune import study as tune_study
from trainflow.tune.study import PARENT_RUN, claim, open_study

optuna.logging.set_verbosity(optuna.logging.WARNING)


# --- the project: iris split in this process, an MLflow database whose tables exist --------------------------------
prepared, project = sweeps.prepared, sweeps.project  # the fixtures, in tests/support/sweeps.py


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
    from trainflow.cli import tune as tune_cmd

    monkeypatch.chdir(project)
    monkeypatch.setattr(tune_cmd, "prepare_data", lambda paths: None)  # the splits are made (no DVC in this project)
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


# --- tune.run: the lines it prints, its summary, trials.csv, the runs it leaves ------------------------------------


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


# --- when workers start and stop -------------------------------------------------------------------------------


def ended_study(root: Path, budget: int) -> None:
    """The study of the project's params with every one of its `budget` trials complete."""
    p, paths = sweep_params(root), Paths(root)
    s = open_study(p, root, budget, *tune_study.hashes(p, paths), on_create=tune_runs.parent_run(p, root))
    for n in range(budget):
        s.study.tell(s.study.ask(), 0.5 - 0.1 * n)  # the WAITING slots, in order
    assert s.terminal() == budget


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


# --- tune.work: a worker claims, runs and releases trials ------------------------------------------------------


class Claim:
    def __init__(self, number: int, log: list[str]) -> None:
        self.number, self.log = number, log

    def release(self) -> None:
        self.log.append(f"release {self.number}")


@pytest.mark.parametrize(("max_trials", "ran"), [(None, 3), (1, 1), (2, 2), (5, 3)])
def test_a_worker_runs_trials_until_none_is_left_or_its_limit_and_counts_them(
    max_trials: int | None, ran: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`trainflow tune work --max-trials N`: a worker claims and runs at most N trials of the three left, releasing
    each claim, and returns how many it ran."""
    import trainflow.tune as tune
    from trainflow.tune import study, trial

    log: list[str] = []
    left = [Claim(n, log) for n in (1, 2, 3)]
    monkeypatch.setattr(tune, "parent_run", lambda params, root: "on_create")
    monkeypatch.setattr(study, "open_study", lambda *a, **kw: log.append(f"open {a[2:]} {kw}") or "the study")
    monkeypatch.setattr(study, "claim", lambda s: left.pop(0) if left else None)
    monkeypatch.setattr(trial, "run", lambda s, c, data: log.append(f"run {c.number} of {s} on {data}"))
    assert tune.work(PipelineParams(), tmp_path, 3, "data9", "code9", max_trials) == ran
    assert log == ["open (3, 'data9', 'code9') {'on_create': 'on_create'}"] + [
        entry for n in range(1, ran + 1) for entry in (f"run {n} of the study on data9", f"release {n}")
    ]


def test_a_trial_that_raises_still_releases_its_claim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import trainflow.tune as tune
    from trainflow.tune import study, trial

    log: list[str] = []
    monkeypatch.setattr(tune, "parent_run", lambda params, root: None)
    monkeypatch.setattr(study, "open_study", lambda *a, **kw: "s")
    monkeypatch.setattr(study, "claim", lambda s: Claim(7, log))

    def fail(s: Any, c: Any, data: str) -> None:
        raise RuntimeError("trial crashed")

    monkeypatch.setattr(trial, "run", fail)
    with pytest.raises(RuntimeError, match="trial crashed"):
        tune.work(PipelineParams(), tmp_path, 1, "d", "c")
    assert log == ["release 7"]
