"""tune.backend: ray (trainflow.tune.ray_backend), without a running Ray. Where Ray is not installed (CI's default
tier): a clear error whose advice exists (the extra). The helpers that need no Ray: trial numbers, the sampler and the
encoded space, Ray's results as Optuna trials, the study's and the trials' MLflow runs. Every report a Ray trial makes
and the run it leaves in each way it can end, also when killed at a failpoint; and how `ray_backend.run` sets Ray up
(search, scheduler, resources, what each trial is given).

Ray is a stand-in module (its trial id and the reports a trial makes) or, for `ray_backend.run`, Ray's own module with
its Tuner, search and scheduler replaced by recorders; training is the train stage's `setup` replaced by one that logs
a fixed history. Expected values are written out by hand from those histories; the project is support/sweeps.py's iris
project (its own MLflow store). The sweep code is called in this process, so that mutation testing sees which function
each test reached (tests/stages/test_tune*.py run `trainflow tune` in subprocesses)."""

from __future__ import annotations

import functools
import json
import math
import os
import sys
import tomllib
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pandas as pd
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState
from support import sweeps
from support.sweeps import CURRENT, LR, SIZES, get_run, mlflow_runs, own_tags, stand_in_ray, sweep_params, trial_spec

import trainflow.stages.train
from trainflow import tracking, tune
from trainflow.core.errors import DiskFullError, UserError
from trainflow.core.paths import Paths
from trainflow.engine import distributed
from trainflow.params import PipelineParams, load_params
from trainflow.tune import ray_backend, results, runs
from trainflow.tune.study import PARENT_RUN

REPO = Path(__file__).resolve().parents[2]

optuna.logging.set_verbosity(optuna.logging.WARNING)

# --- the project: iris split in this process, an MLflow database whose tables exist --------------------------------
prepared, project = sweeps.prepared, sweeps.project  # the fixtures, in tests/support/sweeps.py


def test_without_ray_the_backend_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(UserError, match=r"pip install -e '\.\[ray\]'.*or set tune.backend: optuna"):
        ray_backend._require_ray()
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.startswith("ray[tune]") for req in extras["ray"])  # what the message tells users to install


# --- the helpers that need no running Ray ------------------------------------------------------------------


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


# --- ray_backend.trial: every report, and the run it leaves ----------------------------------------------------


E, F = ray_backend.ENDED, ray_backend.FAILED


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


# --- killed at a failpoint: the run record and the next attempt ------------------------------------------------


class Killed(Exception):
    """Stands in for the SIGKILL a failpoint sends."""


def test_a_ray_trial_killed_right_after_starting_its_run_leaves_the_runs_key_in_run_json(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed at the failpoint tune-run-start (the trial's MLflow run started, its id not yet recorded), run.json holds
    exactly {"key": <the key tag of the started run>, "run_id": null}; the restored trial finds that run by the key and
    carries it on instead of starting a second one."""
    import trainflow.core.io

    real = trainflow.core.io.failpoint

    def failpoint(name: str) -> None:
        if name == "tune-run-start":
            raise Killed(name)
        real(name)

    p = sweep_params(project)
    record = project / "models/tune/trainflow/ray/t1/run.json"
    record.parent.mkdir(parents=True)
    spec = {"data_hash": "dh", "parent": None}
    with monkeypatch.context() as m:
        m.setattr(trainflow.core.io, "failpoint", failpoint)
        with pytest.raises(Killed):
            ray_backend._child_run(project, p, p, "t1", spec, record)
    (started,) = mlflow_runs(project)
    key = started.data.tags[runs.KEY_TAG]
    assert json.loads(record.read_text()) == {"key": key, "run_id": None}

    run = ray_backend._child_run(project, p, p, "t1", spec, record)  # the restored trial
    assert run.run_id == started.info.run_id
    assert json.loads(record.read_text()) == {"key": key, "run_id": started.info.run_id}
    assert [r.info.run_id for r in mlflow_runs(project)] == [started.info.run_id]  # no second run


def test_a_ray_sweep_killed_after_starting_its_parent_run_finds_that_run_again(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed at the failpoint tune-parent (the study's MLflow run started, its id not yet recorded): the record
    holds the run's key and no id; the next sweep finds the run by that key and records it, never a second run."""
    import json

    import trainflow.core.io
    from trainflow.tune import ray_backend, runs

    real = trainflow.core.io.failpoint

    def failpoint(name: str) -> None:
        if name == "tune-parent":
            raise Killed(name)
        real(name)

    p = sweep_params(project)
    experiment = project / "models/tune/trainflow/ray"
    record = experiment.parent / f"{p.tune.study}.parent.json"
    with monkeypatch.context() as m:
        m.setattr(trainflow.core.io, "failpoint", failpoint)
        with pytest.raises(Killed):
            ray_backend._parent(p, Paths(project), experiment)
    (started,) = mlflow_runs(project)
    key = started.data.tags[runs.KEY_TAG]
    assert {k: v for k, v in json.loads(record.read_text()).items() if k != "identity"} == {"key": key, "run_id": None}
    assert ray_backend._parent(p, Paths(project), experiment) == started.info.run_id
    assert json.loads(record.read_text())["run_id"] == started.info.run_id
    assert [r.info.run_id for r in mlflow_runs(project)] == [started.info.run_id]


# --- ray_backend.run: how Ray is set up -----------------------------------------------------------------------


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
