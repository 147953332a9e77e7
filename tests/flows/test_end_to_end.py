"""The whole pipeline through each driver on built-in iris: the Prefect flow and `dvc repro` agree with DVC."""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

import pytest
from support.vcs import dvc

from trainflow.core.io import read_json
from trainflow.core.paths import Paths
from trainflow.params import write_overrides


def dvc_status(root: Path) -> dict[str, object]:
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        return dict(repo.status())


def artifact_keys(flow_run_id: UUID | None) -> set[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return {a.key for a in artifacts if a.key}


def test_flow_runs_only_what_changed_and_keeps_dvc_true(iris_project: Path, prefect_server: None) -> None:
    from flows.training_pipeline import training_pipeline

    first = training_pipeline(root=str(iris_project))
    assert all(not r.get("skipped") for r in first.values())
    assert dvc_status(iris_project) == {}
    paths = Paths(iris_project)
    assert read_json(paths.metrics)["accuracy"] >= 0.86  # what it reaches: 0.909 (20 of the 22 test rows)
    reg1 = read_json(paths.registration)
    assert reg1["champion"] is True

    state = training_pipeline(root=str(iris_project), return_state=True)
    again = state.result()
    assert all(r.get("skipped") for r in again.values())  # unchanged pipeline: nothing recomputed
    # ... and the run still shows the metrics, the MLflow run and the registry decision, from the reports
    keys = {"training-metrics", "mlflow-run", "registry-decision", "model-card"}
    assert artifact_keys(state.state_details.flow_run_id) == keys

    write_overrides(paths.params, ["train.lr=0.0005"])
    third = training_pipeline(root=str(iris_project))
    ran = [name for name, r in third.items() if not r.get("skipped")]
    assert ran == ["train", "evaluate", "register"]
    assert dvc_status(iris_project) == {}
    assert "Running stage" not in dvc(iris_project, "repro")

    from mlflow.tracking import MlflowClient

    reg2 = read_json(paths.registration)
    best = max((reg1, reg2), key=lambda r: (r["value"], -r["version"]))  # ties keep the older champion
    assert int(MlflowClient().get_model_version_by_alias("iris", "champion").version) == best["version"]


# `dvc repro` of the whole pipeline, then again with nothing to do (dvc status empty, one registry version): the
# first steps of tests/flows/test_dvc_remote.py, on the same project, before it pushes and clones.


def test_run_reports_a_data_error_in_one_paragraph(
    iris_project: Path, prefect_server: None, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from trainflow import cli

    monkeypatch.chdir(iris_project)
    assert cli.main(["run", "-S", "data.source=data/raw/missing.csv"]) == 2
    err = capfd.readouterr().err
    assert "data/raw/missing.csv does not exist" in err
    assert "Traceback" not in err
    assert not (iris_project / "data/processed").exists()


def test_batch_predict_flow_scores_with_the_champion(iris_project: Path, prefect_server: None) -> None:
    import pandas as pd

    from flows.batch_predict import batch_predict
    from trainflow.params import load_params
    from trainflow.stages import STAGES, run_stage

    paths = Paths(iris_project)
    for stage in STAGES:
        run_stage(stage, load_params(paths.params), paths)
    out = iris_project / "scored.parquet"
    result = batch_predict("models:/iris@champion", str(paths.split_file("test")), str(out))
    assert result["rows"] == read_json(paths.metrics)["n_test"]
    scored = pd.read_parquet(out)
    confusion = pd.read_csv(paths.test_plots / "predictions.csv", dtype=str)  # labels are strings ("0", "1", "2")
    assert list(scored["prediction"]) == list(confusion["predicted"])
