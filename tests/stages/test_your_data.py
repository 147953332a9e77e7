"""A new user's first hour, on tables shaped like the public CSVs people try first: the task is inferred sensibly and
said, changing the target, the task or the features just works, test rows stay put across feature changes, the
champion is compared on them with its own preprocessing, and the registry can be steered by hand."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from support.projects import make_project
from support.shapes import cars, taxis, tips
from support.stages import trainflow

from trainflow.artifacts.predict import ExportedModel
from trainflow.core.io import read_json
from trainflow.core.paths import Paths
from trainflow.stages import STAGES

FAST = {"train.epochs": 4, "train.progress": "false", "train.batch_size": 32}


def project(tmp: Path, name: str, frame: pd.DataFrame, **params: object) -> Path:
    settings = {"data.source": f"data/raw/{name}.csv", "register.model_name": name, **FAST, **params}
    root = make_project(tmp / name, settings)
    frame.to_csv(root / "data" / "raw" / f"{name}.csv", index=False)
    return root


def pipeline(root: Path, monkeypatch: pytest.MonkeyPatch, *overrides: str) -> None:
    """Every stage, as dvc.yaml runs them, the first with the -S overrides."""
    sets = [a for o in overrides for a in ("-S", o)]
    for i, stage in enumerate(STAGES):
        assert trainflow(root, monkeypatch, "stage", stage, *(sets if i == 0 else [])) == 0, stage


def test_a_decimal_target_trains_as_regression_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    frame = taxis()
    assert 0.02 < frame["fare"].nunique() / len(frame) < 0.05  # few distinct values: a classifier's trap
    root = project(tmp_path, "taxis", frame, **{"data.target": "fare"})
    assert trainflow(root, monkeypatch, "stage", "ingest") == 0
    assert "ingest: task regression: target 'fare' holds numbers with fractions" in capsys.readouterr().err
    pipeline(root, monkeypatch)
    metrics = read_json(Paths(root).metrics)
    baselines = {f"baseline_{b}.{m}" for b in ("linear", "boosting") for m in ("r2", "rmse", "mae")}
    assert set(metrics) == {"r2", "rmse", "mae", "n_test", *baselines} and metrics["r2"] > 0.8


def test_a_number_read_as_mostly_one_row_classes_is_an_error_that_says_what_to_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    frame = tips().head(100).assign(code=np.arange(100))  # integer codes 0..99 over 100 rows: one row each
    root = project(tmp_path, "ids", frame, **{"data.target": "code"})
    assert trainflow(root, monkeypatch, "stage", "ingest") == 2
    err = capsys.readouterr().err
    assert "the target has 100 of them and 100 have a single row" in err and "set data.task: regression" in err
    assert trainflow(root, monkeypatch, "stage", "ingest", "-S", "data.task=regression") == 0  # the advice works


def test_target_task_and_feature_changes_just_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = project(tmp_path, "tips", tips(), **{"data.target": "tip", "register.model_name": "auto"})
    paths = Paths(root)

    def registered() -> tuple[str, int]:
        reg = read_json(paths.registration)
        return reg["model_name"], reg["version"]

    pipeline(root, monkeypatch)
    assert read_json(paths.split_schema)["task"] == "regression" and registered() == ("tips-tip", 1)
    pipeline(root, monkeypatch, "data.target=day")  # another target: no drift error, no deletion
    assert read_json(paths.split_schema)["task"] == "classification"
    assert registered() == ("tips-day", 1)  # a model of another target: its own name (one name, one kind)
    pipeline(root, monkeypatch, "data.target=size")
    assert read_json(paths.split_schema)["task"] == "classification"  # 6 distinct integers for 244 rows
    pipeline(root, monkeypatch, "data.task=regression")  # the user says otherwise: that is what it trains
    assert read_json(paths.split_schema)["task"] == "regression" and "r2" in read_json(paths.metrics)
    assert registered() == ("tips-size-regression", 1)
    pipeline(root, monkeypatch, "data.exclude=[sex, smoker]")
    assert "sex" not in read_json(paths.split_schema)["features"]
    assert "data params changed (data.exclude)" in capsys.readouterr().err


def test_a_feature_change_keeps_the_test_rows_and_the_better_model_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sklearn.metrics import r2_score

    root = project(tmp_path, "cars", cars(), **{"data.target": "mpg"})
    paths = Paths(root)
    pipeline(root, monkeypatch)
    first_test = pd.read_parquet(paths.split_file("test"))
    shutil.copytree(paths.final, tmp_path / "v1")
    pipeline(root, monkeypatch, "data.exclude=[name]")  # the name is an id: leave it out
    test = pd.read_parquet(paths.split_file("test"))
    assert sorted(test["name"]) == sorted(first_test["name"])  # the same rows, the name column still there
    # The champion (v1, which used `name`) was compared on these rows, scored with its own preprocessing.
    reg = read_json(paths.registration)
    v1, v2 = (r2_score(test["mpg"], ExportedModel.load(d).outputs(test)) for d in (tmp_path / "v1", paths.final))
    assert reg["previous_champion"] == 1 and reg["previous_value"] == pytest.approx(v1, rel=1e-6)  # float32 labels
    assert reg["value"] == pytest.approx(v2, rel=1e-6)
    assert reg["champion_version"] == (2 if v2 > v1 else 1)  # the better one is champion


def test_models_list_promote_and_rollback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlflow.tracking import MlflowClient

    from trainflow.core.io import write_json

    # register.decide: point: the r2 values below are made up (the paired rule re-scores both models instead)
    root = project(tmp_path, "tips", tips(), **{"data.target": "tip", "register.decide": "point"})
    paths = Paths(root)
    pipeline(root, monkeypatch)
    for seed, delta in ((1, 0.05), (2, -0.05)):  # version 2 better (champion), version 3 worse
        assert trainflow(root, monkeypatch, "stage", "train", "-S", f"seed={seed}") == 0
        assert trainflow(root, monkeypatch, "stage", "evaluate") == 0
        metrics = read_json(paths.metrics)
        write_json(paths.metrics, {**metrics, "r2": metrics["r2"] + delta + 1})
        assert trainflow(root, monkeypatch, "stage", "register") == 0
    client = MlflowClient()

    def champion() -> int:
        return int(client.get_model_version_by_alias("tips", "champion").version)

    assert champion() == 2
    capsys.readouterr()
    assert trainflow(root, monkeypatch, "models", "list") == 0
    listing = capsys.readouterr().out.splitlines()
    assert listing[0] == "tips: 3 versions" and listing[1].split()[:3] == ["version", "aliases", "mae"]
    rows = {line.split()[0]: line.split()[1] for line in listing[2:]}
    assert rows == {"3": "challenger", "2": "champion", "1": "-"}

    assert trainflow(root, monkeypatch, "models", "promote", "3", "--reason", "A/B test won") == 0
    assert champion() == 3
    assert (
        "promoted by hand (trainflow models promote): A/B test won"
        in client.get_model_version("tips", "3").tags["champion_change"]
    )
    assert trainflow(root, monkeypatch, "models", "rollback", "--reason", "latency") == 0
    assert champion() == 2  # back to the one before
    assert client.get_model_version("tips", "3").tags["rolled_back"].endswith("latency")
    assert trainflow(root, monkeypatch, "models", "rollback") == 0
    assert champion() == 1
    capsys.readouterr()
    assert trainflow(root, monkeypatch, "models", "rollback") == 2  # version 1 was the first champion
    assert "the only champion it has had" in capsys.readouterr().err
    assert trainflow(root, monkeypatch, "models", "promote", "9") == 2
    assert "tips has no version 9" in capsys.readouterr().err
    assert trainflow(root, monkeypatch, "models", "list", "--name", "nope") == 2
    assert "no registered model 'nope'" in capsys.readouterr().err


def test_rows_without_a_target_are_an_error_or_dropped_as_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    frame = tips().astype({"tip": object})
    frame.loc[[5, 17, 30], "tip"] = None
    root = project(tmp_path, "tips", frame, **{"data.target": "tip"})
    assert trainflow(root, monkeypatch, "stage", "ingest") == 2
    err = capsys.readouterr().err
    assert "line 7, column 'tip': the target value is missing (3 rows without one)" in err
    assert "set data.missing_target: drop" in err
    assert trainflow(root, monkeypatch, "stage", "ingest", "-S", "data.missing_target=drop") == 0  # following it
    assert "dropped 3 rows without a target value 'tip'" in capsys.readouterr().err
    assert read_json(Paths(root).schema)["n_rows"] == 244 - 3


def test_drift_advice_works_when_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = project(tmp_path, "tips", tips(), **{"data.target": "tip"})
    raw = root / "data" / "raw" / "tips.csv"
    assert trainflow(root, monkeypatch, "stage", "ingest") == 0
    tips().assign(table=3).to_csv(raw, index=False)  # the source grows a column under the same params
    capsys.readouterr()
    assert trainflow(root, monkeypatch, "stage", "ingest") == 2
    err = capsys.readouterr().err
    assert "'table' (numeric) is new" in err
    features = "data.features=[total_bill, sex, smoker, day, time, size]"
    assert f"-S '{features}'" in err
    assert trainflow(root, monkeypatch, "stage", "ingest", "-S", features) == 0  # the first way out
    # A column gone: the one way out is to accept the new schema once; then it is the baseline.
    root = project(tmp_path / "again", "tips", tips(), **{"data.target": "tip"})
    raw = root / "data" / "raw" / "tips.csv"
    assert trainflow(root, monkeypatch, "stage", "ingest") == 0
    tips().drop(columns=["sex"]).to_csv(raw, index=False)
    capsys.readouterr()
    assert trainflow(root, monkeypatch, "stage", "ingest") == 2
    err = capsys.readouterr().err
    assert "'sex' (categorical) is missing" in err and "data.features" not in err
    assert trainflow(root, monkeypatch, "stage", "ingest", "--accept-schema") == 0
    assert trainflow(root, monkeypatch, "stage", "ingest") == 0


@pytest.mark.parametrize(
    ("shape", "target"),
    [("taxis", "fare"), ("cars", "origin"), ("tips", "tip")],
    ids=["datetimes-and-missing", "ints-and-question-marks", "yes-no-strings"],
)
def test_the_printed_load_it_recipe_works_on_the_raw_csv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: str, target: str
) -> None:
    import re

    from trainflow import serving
    from trainflow.stages.report import summary

    frame = {"taxis": taxis(n=1200), "cars": cars(), "tips": tips()}[shape]
    root = project(tmp_path, shape, frame, **{"data.target": target})
    pipeline(root, monkeypatch)
    recipe = next(line for line in summary(Paths(root), {}).splitlines() if "load it:" in line)
    match = re.fullmatch(r"\s*load it:\s+trainflow\.serving\.load\('([^']+)'\)", recipe)
    assert match is not None, recipe
    raw_file = root / "data" / "raw" / f"{shape}.csv"
    raw = pd.read_csv(raw_file)  # what a user does: ints stay ints, "?" and "Yes" stay text, dates are text
    served = serving.load(match.group(1)).predict(raw)
    assert trainflow(root, monkeypatch, "predict", "--model", match.group(1), "--input", str(raw_file),
                     "--output", "scored.parquet") == 0  # fmt: skip
    expected = pd.read_parquet(root / "scored.parquet")
    assert len(served) == len(raw)
    if not pd.api.types.is_numeric_dtype(frame[target]):
        assert list(served["prediction"]) == list(expected["prediction"])
    else:
        np.testing.assert_allclose(served["prediction"], expected["prediction"], rtol=1e-6)
