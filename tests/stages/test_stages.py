"""Each stage on small data in a temp project: outputs, errors naming what to fix, resume rules, the champion gate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainflow import cli
from trainflow.errors import DataError
from trainflow.io import read_json, write_json
from trainflow.params import load_params, write_overrides
from trainflow.paths import Paths
from trainflow.stages import STAGES, run_stage


def run_all(root: Path, stages: tuple[str, ...] = STAGES) -> dict[str, dict]:
    paths = Paths(root)
    return {s: run_stage(s, load_params(paths.params), paths) for s in stages}


def champion(name: str) -> str:
    from mlflow.tracking import MlflowClient

    return str(MlflowClient().get_model_version_by_alias(name, "champion").version)


def test_pipeline_outputs_and_lineage(csv_project: Path) -> None:
    out = run_all(csv_project)
    paths = Paths(csv_project)
    assert out["ingest"] == {"rows": 240, "features": 4, "classes": 3, "task": "classification"}
    assert sum(out["split"].values()) == 240
    metrics = read_json(paths.metrics)
    assert set(metrics) == {"accuracy", "f1_macro", "log_loss", "n_test"}
    assert metrics["accuracy"] >= 0.9  # separable blobs
    # The exported model is safetensors + JSON only: nothing that could be unpickled.
    assert sorted(p.name for p in paths.final.iterdir()) == [
        "model.json",
        "model.safetensors",
        "preprocess.json",
        "schema.json",
        "training.json",
    ]
    for png in ("training_curves.png", "test/confusion_matrix.png"):
        assert (paths.plots / png).read_bytes()[:4] == b"\x89PNG"
    assert "val_loss" in (paths.plots / "history.csv").read_text().splitlines()[0]

    reg = read_json(paths.registration)
    assert reg["version"] == 1 and reg["champion"] is True
    from mlflow.tracking import MlflowClient

    version = MlflowClient().get_model_version("blobs", "1")
    assert len(version.tags["git_commit"]) == 40
    assert version.tags["mlflow_run_id"] == read_json(paths.train_run)["run_id"]
    assert float(version.tags["metric.accuracy"]) == metrics["accuracy"]
    assert version.tags["data_sha256"] == read_json(paths.final / "training.json")["data_sha256"]
    assert champion("blobs") == "1"

    # The registered model loads through MLflow (no pickle) and predicts what evaluate scored.
    import mlflow.pyfunc
    import pandas as pd

    test = pd.read_parquet(paths.split_file("test"))
    served = mlflow.pyfunc.load_model("models:/blobs@champion").predict(test)
    confusion = pd.read_csv(paths.test_plots / "confusion.csv")
    assert list(served["prediction"]) == list(confusion["predicted"])


def test_champion_moves_only_when_the_gate_metric_improves(csv_project: Path) -> None:
    run_all(csv_project)
    paths = Paths(csv_project)
    metrics = read_json(paths.metrics)
    run_all(csv_project, ("register",))  # equal, not better
    assert read_json(paths.registration)["version"] == 2
    assert champion("blobs") == "1"
    write_json(paths.metrics, {**metrics, "accuracy": metrics["accuracy"] - 0.1})  # worse
    run_all(csv_project, ("register",))
    assert champion("blobs") == "1"
    write_json(paths.metrics, {**metrics, "accuracy": metrics["accuracy"] + 0.01})  # better
    run_all(csv_project, ("register",))
    assert champion("blobs") == "4"
    assert read_json(paths.registration)["previous_champion"] == 1


def test_resume_only_when_training_params_and_data_match(csv_project: Path) -> None:
    run_all(csv_project, ("ingest", "split", "train"))
    paths = Paths(csv_project)
    weights = (paths.final / "model.safetensors").read_bytes()
    # Unchanged params and data: the finished run resumes and the exported model is bit-identical.
    run_all(csv_project, ("train",))
    assert (paths.final / "model.safetensors").read_bytes() == weights
    # A changed lr must retrain, not "resume" the finished run and change nothing.
    write_overrides(paths.params, ["train.lr=0.0005"])
    run_all(csv_project, ("train",))
    assert (paths.final / "model.safetensors").read_bytes() != weights


def _cli(root: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    monkeypatch.chdir(root)
    return cli.main(list(args))


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for d in ("data", "models", "reports")
        if (root / d).exists()
        for p in (root / d).rglob("*")
        if p.is_file()
    }


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("data.source=data/raw/nope.csv", "data/raw/nope.csv"),
        ("data.target=species", "'species' is not a column"),
    ],
)
def test_data_errors_exit_2_and_leave_outputs_intact(
    csv_project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], override: str, needle: str
) -> None:
    assert _cli(csv_project, monkeypatch, "stage", "ingest") == 0
    before = _snapshot(csv_project)
    capsys.readouterr()
    assert _cli(csv_project, monkeypatch, "stage", "ingest", "-S", override) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    assert _snapshot(csv_project) == before


def test_a_wrong_typed_value_is_named_by_file_line_and_column(csv_project: Path) -> None:
    import pandas as pd

    frame = pd.read_csv(csv_project / "data/raw/blobs.csv")
    frame["f2"] = frame["f2"].astype(object)
    frame.loc[57, "f2"] = "abc"  # data row 57 is line 59: the header is line 1
    frame["city"] = "Oslo"  # a string column is a categorical feature, not an error
    frame.to_csv(csv_project / "data/raw/blobs.csv", index=False)
    with pytest.raises(DataError, match=r"data/raw/blobs.csv, line 59, column 'f2': 'abc' is not a number"):
        run_all(csv_project, ("ingest",))
    assert not (csv_project / "data/processed").exists()


def test_stage_writes_overrides_into_params_yaml(csv_project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _cli(csv_project, monkeypatch, "stage", "ingest", "-S", "data.exclude=[f3]") == 0
    assert load_params(csv_project / "params.yaml").data.exclude == ["f3"]
    schema = json.loads((csv_project / "data/processed/schema.json").read_text())
    assert schema["features"] == ["f0", "f1", "f2"]
