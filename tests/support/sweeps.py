"""Sweeps (trainflow.tune) for the tests that run them in this process or by `trainflow tune`: the iris project split
once per module, hand-made Optuna studies and trials, a stand-in for Ray, and what a sweep leaves to read back."""

from __future__ import annotations

import json
import shutil
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pandas as pd
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import FrozenTrial, TrialState, create_trial

import trainflow.stages.train
from support.projects import REPO, committed
from trainflow.core.paths import Paths
from trainflow.params import PipelineParams, load_params, write_overrides
from trainflow.registry import lineage
from trainflow.stages import run_stage
from trainflow.tune.study import Study

SWEEP = [
    "data.source=builtin:iris",
    "register.model_name=iris",
    "train.epochs=1",
    "train.batch_size=16",
    "train.progress=false",
    "tune.trials=2",
    "tune.workers=1",
]
# The default space (params.yaml) as Optuna holds it; the committed params are lr 0.002, dropout 0.1, [256, 128].
LR = FloatDistribution(1e-4, 1e-2, log=True)
SIZES = CategoricalDistribution(["[128]", "[256, 128]", "[512, 256]"])
CURRENT = {"train.lr": 0.002, "model.dropout": 0.1, "model.hidden_sizes": "[256, 128]"}


def ended(state: str, value: float | None, lr: float, sizes: list[int], **kw: Any) -> FrozenTrial:
    """A trial of the default space as Optuna stores it (hidden_sizes as its JSON text)."""
    return create_trial(
        state=TrialState[state],
        value=value,
        params={"train.lr": lr, "model.hidden_sizes": json.dumps(sizes)},
        distributions={"train.lr": LR, "model.hidden_sizes": SIZES},
        **kw,
    )


def hand_made(params: PipelineParams, trials: list[FrozenTrial], minimize: bool = True, budget: int = 0) -> Study:
    s = optuna.create_study(direction="minimize" if minimize else "maximize")
    for t in trials:
        s.add_trial(t)
    return Study(s, params, Path("unused"), budget or len(trials), "val_loss", minimize)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory, _empty_mlflow_store: Path) -> Path:
    root = tmp_path_factory.mktemp("tune") / "proj"
    root.mkdir()
    (root / "params.yaml").write_bytes(committed("params.yaml")["params.yaml"])
    shutil.copytree(
        REPO / "trainflow" / "models", root / "trainflow" / "models", ignore=shutil.ignore_patterns("__pycache__")
    )
    write_overrides(root / "params.yaml", SWEEP)
    paths = Paths(root)
    for stage in ("ingest", "split"):
        run_stage(stage, load_params(paths.params), paths)
    shutil.copyfile(_empty_mlflow_store, root / "mlflow.db")  # its tables made (conftest): no migrations (~4 s)
    return root


@pytest.fixture
def project(prepared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the prepared project, its own MLflow store, and a fixed git commit (no `git` subprocess)."""
    root = tmp_path / "proj"
    shutil.copytree(prepared, root)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlflow.db'}")
    monkeypatch.setattr(lineage, "git_commit", lambda root: ("c0ffee", False))
    monkeypatch.setattr(sys, "path", list(sys.path))  # the worker puts the project on it
    return root


def sweep_params(root: Path, *overrides: str) -> PipelineParams:
    return load_params(root / "params.yaml", list(overrides))


def mlflow_runs(root: Path, experiment: str = "trainflow") -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    found = client.get_experiment_by_name(experiment)
    return [] if found is None else client.search_runs([found.experiment_id])


def get_run(root: Path, run_id: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{root / 'mlflow.db'}").get_run(run_id)


def stand_in_ray(monkeypatch: pytest.MonkeyPatch, trial_id: str) -> list[dict[str, Any]]:
    """`from ray import tune` gives a trial its id and keeps its reports (returned); Ray itself is not imported."""
    reports: list[dict[str, Any]] = []
    context = SimpleNamespace(get_trial_id=lambda: trial_id)
    ray = types.ModuleType("ray")
    ray.tune = SimpleNamespace(get_context=lambda: context, report=reports.append)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", ray)
    return reports


def trial_spec(root: Path, p: PipelineParams) -> dict[str, Any]:
    return {"root": str(root), "params": p.model_dump(mode="json"), "metric": "val_loss", "data_hash": "dh"}


def trials(root: Path) -> pd.DataFrame:
    return pd.read_csv(root / "reports/tune/trials.csv")


def own_tags(run: Any) -> dict[str, str]:
    """A run's tags less those MLflow adds itself (mlflow.runName, ...), but with its parent."""
    return {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.") or k == "mlflow.parentRunId"}


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
