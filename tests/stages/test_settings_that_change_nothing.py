"""Settings that change how a run goes but not the model (train.progress, train.resume, tracking.*) retrain at most by
an instant resume: models/final comes out byte for byte, register adds no version, DVC reruns nothing for
tracking.experiment, and turning TensorBoard on for a trained model writes the curves that exist (issue 30, 8-9)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pandas as pd
import pytest
import yaml
from support.event_files import scalars
from support.stages import run_all

from trainflow.core.io import read_json
from trainflow.core.paths import Paths
from trainflow.params import write_overrides


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_a_rerun_for_a_setting_that_changes_nothing_exports_the_same_bytes_and_registers_no_version(
    csv_project: Path,
) -> None:
    from mlflow.tracking import MlflowClient

    first = run_all(csv_project)
    paths = Paths(csv_project)
    exported, first_run = digests(paths.final), read_json(paths.train_run)["run_id"]
    history = pd.read_csv(paths.plots / "history.csv")  # the first run's evaluations, written by the first run

    # train.progress and tracking.tensorboard are in the train stage's params: DVC reruns train, which resumes the
    # finished run and trains nothing; then evaluate and register run as after any train.
    write_overrides(paths.params, ["train.progress=true", "tracking.tensorboard=true"])
    again = run_all(csv_project, ("train", "evaluate", "register"))
    assert again["train"]["resumed_from_update"] == first["train"]["updates"] > 0
    assert read_json(paths.train_run)["resumed_from_update"] == first["train"]["updates"]  # how the run went
    assert digests(paths.final) == exported  # ... is not part of the model
    assert "resumed_from_update" not in read_json(paths.final / "training.json")

    second_run = read_json(paths.train_run)["run_id"]
    assert second_run != first_run  # a new MLflow run, of the same model
    client = MlflowClient()
    assert [int(v.version) for v in client.search_model_versions("name='blobs'")] == [1]
    reg = read_json(paths.registration)
    assert reg["version"] == 1 and reg["champion"] is True and reg["model_uri"] == "models:/blobs/1"
    assert reg["decision"].startswith(f"no new version: run {second_run} exported byte for byte the model of version 1")
    assert reg["tags"]["mlflow_run_id"] == first_run  # the version's lineage, not the resumed run's
    from trainflow.stages.report import summary

    said = summary(paths, {s: {} for s in ("train", "evaluate", "register")})
    assert "registry: models:/blobs/1 (registered by an earlier run; champion;" in said
    assert "load it:  trainflow.serving.load('models:/blobs@champion')" in said
    assert {k: str(v) for k, v in client.get_registered_model("blobs").aliases.items()} == {
        "champion": "1",
        "challenger": "1",
    }

    # The resumed run trained nothing, yet its TensorBoard folder holds every evaluation of the checkpoint's history.
    (folder,) = [d for d in (paths.tensorboard).iterdir() if d.name.endswith(second_run)]
    logged = scalars(folder)
    assert [step for step, _ in logged["val_loss"]] == [int(u) for u in history["update"]]
    assert [v for _, v in logged["val_loss"]] == pytest.approx(list(history["val_loss"]), rel=1e-6)

    # A model that differs (another seed) is a new version, as before.
    write_overrides(paths.params, ["seed=1"])
    third = run_all(csv_project, ("train", "evaluate", "register"))["register"]
    assert third["version"] == 2 and not third["decision"].startswith("no new version")


def test_only_settings_that_change_the_model_are_train_stage_params() -> None:
    """tracking.experiment says where runs are logged; DVC must not rerun train (and register) when it changes. The
    stage's params as DVC reads them from the committed dvc.yaml."""
    repo = Path(__file__).resolve().parents[2]
    params = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]["train"]["params"]
    assert "tracking" not in params and "tracking.experiment" not in params
    assert "tracking.tensorboard" in params  # turning it on writes the curves of a trained model (a resume)
    assert {"seed", "features", "model", "train"} <= set(params)
