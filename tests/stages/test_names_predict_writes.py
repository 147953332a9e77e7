"""A feature named as a column `trainflow predict` writes (`prediction`, `proba_<class>`) would train a model predict
can never score (it refuses input holding such a column): ingest refuses it (exit 2), naming the column and the -S
that leaves it out, and following that -S ends in a model predict scores."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pandas as pd
import pytest
from support.projects import FAST, blobs, make_project

from trainflow import cli
from trainflow.core.errors import DataError
from trainflow.data import validate
from trainflow.data.sources import RawTable
from trainflow.params import DataParams, write_overrides


def refused_then_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Path:
    """A project whose table has a feature named `prediction`: `trainflow stage ingest` exits 2 with the -S that
    leaves it out, which is then set as the message gives it, and ingest passes."""
    root = make_project(tmp_path / "p", {"data.source": "data/raw/t.csv", "data.target": "label",
                                         "data.exclude": "[f3]", **FAST})  # fmt: skip
    data = blobs(n=120)
    data["prediction"] = data["f0"].round(1)  # a column of an earlier model's outputs, say
    data.to_csv(root / "data/raw/t.csv", index=False)
    monkeypatch.chdir(root)
    assert cli.main(["stage", "ingest"]) == 2
    err = capsys.readouterr().err
    assert (
        "data.source: data/raw/t.csv: the model would read column(s) 'prediction', but `trainflow predict` writes "
        "'prediction' and 'proba_<class>' columns into its output and refuses input that holds one, so no row could be "
        "scored; leave it out: -S 'data.exclude=[f3, prediction]', or rename it in the file"
    ) in err
    setting = shlex.split(err.split("leave it out: -S ")[1].split(", or rename")[0])[0]
    write_overrides(root / "params.yaml", [setting])  # as it says
    assert cli.main(["stage", "ingest"]) == 0
    schema = json.loads((root / "data/processed/schema.json").read_text())
    assert schema["features"] == ["f0", "f1", "f2"] and schema["carried"] == ["f3", "prediction"]
    return root


def test_a_feature_named_prediction_is_refused_at_ingest_with_the_setting_that_leaves_it_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    refused_then_followed(tmp_path, monkeypatch, capsys)


@pytest.mark.slow
def test_leaving_out_a_feature_named_prediction_ends_in_a_model_predict_scores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = refused_then_followed(tmp_path, monkeypatch, capsys)
    for stage in ("split", "train"):
        assert cli.main(["stage", stage]) == 0
    new = pd.read_csv(root / "data/raw/t.csv").drop(columns=["label", "prediction"])
    new.to_csv(root / "new.csv", index=False)
    assert cli.main(["predict", "--model", "models/final", "--input", "new.csv", "--output", "out.csv"]) == 0
    out = pd.read_csv(root / "out.csv")
    assert len(out) == 120 and set(out["prediction"]) <= {"a", "b", "c"}


def test_names_predict_writes_among_listed_features_or_as_the_text_column(tmp_path: Path) -> None:
    frame = pd.DataFrame({"x": [1.0, 2.0] * 20, "proba_a": [0.5, 0.1] * 20, "prediction": ["p q", "r"] * 20,
                          "label": ["a", "b"] * 20})  # fmt: skip

    def message(**kw: object) -> str:
        d = DataParams.model_validate({"source": "t.csv", "target": "label", **kw})
        with pytest.raises(DataError) as info:
            validate.infer_schema(RawTable(frame, "t.csv", [], [len(frame)], "csv"), d)
        return str(info.value).split("so no row could be scored; ")[1]

    assert message(features=["x", "proba_a"]) == "leave it out: -S 'data.features=[x]', or rename it in the file"
    assert message(features=["proba_a"]) == "rename it in the file and in data.features"
    assert (
        message(exclude=["x"])
        == "leave them out: -S 'data.exclude=[x, proba_a, prediction]', or rename them in the file"
    )
    assert message(exclude=["proba_a"], text_column="prediction") == (
        "rename it in the file and set data.text_column to the new name"
    )
    d = DataParams.model_validate({"source": "t.csv", "target": "label", "exclude": ["proba_a", "prediction"]})
    schema, _ = validate.infer_schema(RawTable(frame, "t.csv", [], [len(frame)], "csv"), d)
    assert schema.features == ["x"] and schema.carried == ["proba_a", "prediction"]
