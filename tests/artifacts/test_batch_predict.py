"""`trainflow predict` on a file (trainflow.artifacts.batch_predict): the JSON it prints names the model it scored with,
in memory and streamed a block at a time. The model is a stand-in (a regression that predicts x1 + x2)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pandas as pd
import pytest


class _Exported:
    """Stands in for a loaded model: a regression on two features that predicts x1 + x2."""

    pre = types.SimpleNamespace(image_column=None, task="regression", width=2, target="y", columns=[])

    def predict_frame(self, frame: pd.DataFrame, batch_size: int, where: str, base: Path | None = None) -> pd.DataFrame:
        return frame.assign(prediction=frame["x1"] + frame["x2"])


@pytest.mark.parametrize("budget", [None, "0.000001"], ids=["in-memory", "streamed"])
def test_predict_prints_json_naming_the_model_it_scored_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], budget: str | None
) -> None:
    from trainflow import cli
    from trainflow.artifacts import batch_predict

    loaded: list[str] = []

    def load(model: str) -> _Exported:
        loaded.append(model)
        return _Exported()

    monkeypatch.setattr(batch_predict, "load", load)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the CLI puts the project root on sys.path
    pd.DataFrame({"x1": [1.0, 2.0, 3.0], "x2": [10.0, 20.0, 30.0]}).to_parquet(tmp_path / "in.parquet")
    args = ["predict", "--model", "models:/sales@champion", "--input", "in.parquet", "--output", "out.csv"]
    assert cli.main([*args, *(["--memory-budget-mb", budget] if budget else [])]) == 0
    out, err = capsys.readouterr()
    assert ("streamed a block at a time" in err) == (budget is not None)  # both of predict_file's ways
    printed = json.loads(out)
    assert loaded == ["models:/sales@champion"]
    assert printed == {"model": "models:/sales@champion", "input": "in.parquet", "output": "out.csv", "rows": 3,
                       "task": "regression"}  # fmt: skip
    assert pd.read_csv(tmp_path / "out.csv")["prediction"].tolist() == [11.0, 22.0, 33.0]
