"""tracking.tensorboard: every point the engine logs reaches the event files (read back with TensorBoard's own
reader), each run in its own folder, beside MLflow; a failing writer warns and never stops training."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from support.event_files import scalars
from support.projects import make_project

from trainflow import tracking
from trainflow.core.io import read_json
from trainflow.core.paths import Paths
from trainflow.params import load_params
from trainflow.stages import run_stage


def float32(value: float) -> float:
    return float(np.float32(value))  # event files hold scalars as float32


def same(a: list[tuple[int, float]], b: list[tuple[int, float]]) -> bool:
    """Equal steps and values, NaN equal to NaN."""
    return len(a) == len(b) and all(
        sa == sb and (va == vb or (math.isnan(va) and math.isnan(vb))) for (sa, va), (sb, vb) in zip(a, b)
    )


def test_every_point_logged_reaches_the_event_file(tmp_path: Path) -> None:
    logged: list[tuple[int, dict[str, float]]] = []
    for step in (1, 2, 5, 10, 11, 50, 51):  # gaps, as log_every and evaluations make
        metrics = {"train_loss": 1.0 / step, "lr": 0.1 * 0.9**step}
        if step % 5 == 0:
            metrics["val_loss"] = math.nan if step == 50 else 2.0 / step
        logged.append((step, metrics))
    logger = tracking.TensorBoardLogger(tmp_path / "run")
    for step, metrics in logged:
        logger.log(metrics, step)
    logger.close()
    logger.close()  # twice: harmless, as for MLflowLogger

    expected: dict[str, list[tuple[int, float]]] = {}
    for step, metrics in logged:
        for key, value in metrics.items():
            expected.setdefault(key, []).append((step, float32(value)))
    got = scalars(tmp_path / "run")
    assert set(got) == set(expected)
    for tag in expected:
        assert same(got[tag], expected[tag]), tag
    assert logger.error is None


class Recording:
    def __init__(self, fail_close: bool = False) -> None:
        self.points: list[tuple[dict[str, float], int]] = []
        self.closed = False
        self.fail_close = fail_close

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.points.append((dict(metrics), step))

    def close(self) -> None:
        self.closed = True
        if self.fail_close:
            raise RuntimeError("close failed")


def test_loggers_fan_out_and_close_every_one() -> None:
    first, second = Recording(fail_close=True), Recording()
    both = tracking.Loggers([first, second])
    both.log({"loss": 1.0}, 3)
    both.log({"loss": 0.5, "lr": 0.1}, 4)
    assert first.points == second.points == [({"loss": 1.0}, 3), ({"loss": 0.5, "lr": 0.1}, 4)]
    with pytest.raises(RuntimeError, match="close failed"):
        both.close()
    assert first.closed and second.closed  # the first one's failure did not keep the second from flushing


def test_run_folders_never_mix() -> None:
    assert tracking.run_folder("abc123").endswith("_abc123")
    assert tracking.run_folder(None) != tracking.run_folder(None)  # tracking down: still one folder per run


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Paths:
    root = make_project(
        tmp_path_factory.mktemp("tb") / "proj",
        {"data.source": "builtin:iris", "train.epochs": 3, "train.progress": "false", "train.batch_size": 16,
         "train.log_every": 2, "train.resume": "never", "tracking.tensorboard": "true"},
    )  # fmt: skip
    paths = Paths(root)
    for stage in ("ingest", "split"):
        run_stage(stage, load_params(paths.params), paths)
    return paths


def mlflow_points(run_id: str) -> dict[str, list[tuple[int, float]]]:
    client = MlflowClient()
    keys = client.get_run(run_id).data.metrics
    return {k: sorted((m.step, float32(m.value)) for m in client.get_metric_history(run_id, k)) for k in keys}


def test_the_train_stage_writes_every_logged_point_beside_mlflow(project: Paths) -> None:
    result: dict[str, Any] = run_stage("train", load_params(project.params), project)
    run_id = result["mlflow_run_id"]
    folders = list(project.tensorboard.iterdir())
    assert [f.name for f in folders] == [next(f.name for f in folders if f.name.endswith(run_id))]
    got = scalars(folders[0])
    # MLflow holds what the engine logged (plus the final best_<monitor>, which the run logs itself).
    sent = {k: v for k, v in mlflow_points(run_id).items() if not k.startswith("best_")}
    assert set(got) == set(sent) and "train_loss" in got and "val_loss" in got
    for tag, points in sent.items():
        assert same(got[tag], points), tag
    history = pd.read_csv(project.plots / "history.csv")  # one row per evaluation
    assert got["val_loss"] == [(int(u), float32(v)) for u, v in zip(history["update"], history["val_loss"])]
    assert max(step for step, _ in got["train_loss"]) == result["updates"]


def test_a_failing_writer_warns_and_training_goes_on(project: Paths, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.utils.tensorboard import SummaryWriter

    def broken(self: Any, *args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(SummaryWriter, "add_scalar", broken)
    before = set(project.tensorboard.iterdir())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run_stage("train", load_params(project.params), project)
    tb = [str(w.message) for w in caught if "TensorBoard" in str(w.message)]
    assert len(tb) == 1 and "disk full" in tb[0] and "training goes on" in tb[0], tb
    assert result["updates"] > 0 and project.final.is_dir()
    assert read_json(project.train_run)["tracking_error"] is None  # MLflow was not disturbed
    assert "train_loss" in mlflow_points(result["mlflow_run_id"])
    assert before < set(project.tensorboard.iterdir())  # a new folder; the first run's stays as it was


@pytest.mark.slow  # 15 s: README line 2 stays under 10 minutes (CI runs the slow tier after it)
def test_each_sweep_trial_writes_into_its_own_folder(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    root = make_project(
        tmp_path / "proj",
        {"data.source": "builtin:iris", "train.epochs": 2, "train.batch_size": 16, "train.progress": "false",
         "tune.trials": 2, "tune.workers": 1, "tracking.tensorboard": "true"},
    )  # fmt: skip
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}"}
    done = subprocess.run(
        [sys.executable, "-m", "trainflow", "tune"], cwd=root, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    study = Paths(root).tensorboard / "tune" / "trainflow"
    assert sorted(p.name for p in study.iterdir()) == ["trial_0000", "trial_0001"]
    for trial in study.iterdir():
        (run,) = trial.iterdir()  # one run each, named by its MLflow child run
        assert "val_loss" in scalars(run) and "train_loss" in scalars(run)
