"""`trainflow predict`: what it hands predict_file (each option's default included), a batch size under one refused
before anything loads, and predict_file's result, which the command prints: the rows written with their predictions,
and a Parquet input over the memory budget streamed."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest
from support.cli import CONFIGURED, recorder

from trainflow import cli
from trainflow.artifacts import batch_predict
from trainflow.core.paths import Paths


def test_predict_hands_its_defaults_to_predict_file_and_prints_its_result_as_json(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No --batch-size: 1024 rows a pass; no --memory-budget-mb: None (predict_file picks a quarter of the memory);
    no --runtime: torch.
    The project's registry is configured and its root importable before the model loads."""
    calls: list[Any] = []
    monkeypatch.setattr(batch_predict, "predict_file", recorder(calls, {"rows": 3, "output": "out.csv"}))
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert cli.main(["predict", "--model", "models:/m@champion", "--input", "in.csv", "--output", "out.csv"]) == 0
    assert calls == [(("models:/m@champion", Path("in.csv"), Path("out.csv"), 1024, None, "torch"), {})]
    assert capsys.readouterr() == ('{\n  "rows": 3,\n  "output": "out.csv"\n}\n', "")
    assert [project.root] == CONFIGURED and sys.path[0] == str(project.root)


def test_predict_passes_the_batch_size_memory_budget_and_runtime_given(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(batch_predict, "predict_file", recorder(calls, {}))
    argv = ["predict", "--model", "runs:/r/model", "--input", "a.parquet", "--output", "b.jsonl"]
    assert cli.main([*argv, "--batch-size", "1", "--memory-budget-mb", "2.5", "--runtime", "onnx"]) == 0
    assert calls == [(("runs:/r/model", Path("a.parquet"), Path("b.jsonl"), 1, 2.5, "onnx"), {})]
    assert capsys.readouterr().out == "{}\n"


@pytest.mark.parametrize("size", ["0", "-3"])
def test_a_batch_size_under_one_is_refused_before_anything_loads(
    size: str, project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(batch_predict, "predict_file", recorder(calls, {}))
    argv = ["predict", "--model", "m", "--input", "a.csv", "--output", "b.csv", "--batch-size", size]
    assert cli.main(argv) == 2
    assert capsys.readouterr() == ("", f"error: --batch-size must be at least 1, not {size}\n")
    assert calls == [] and CONFIGURED == []


class Scorer:
    """An exported tabular model that predicts "p<row>" and records how it was asked."""

    def __init__(self) -> None:
        self.pre = types.SimpleNamespace(image_column=None, target="label", task="classification", width=2, columns=[])
        self.asked: list[Any] = []

    def predict_frame(self, frame: Any, batch_size: int, **where: Any) -> Any:
        self.asked.append((list(frame.columns), batch_size, where))
        return frame.assign(prediction=[f"p{i}" for i in range(len(frame))])


def test_predict_file_writes_the_rows_with_their_predictions_and_says_what_it_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scorer = Scorer()
    monkeypatch.setattr(batch_predict, "load", lambda model: scorer)
    source = tmp_path / "in.csv"
    source.write_text("x1,x2\n1,2\n3,4\n5,6\n")
    out = tmp_path / "out.tsv"
    assert batch_predict.predict_file("models:/m/1", source, out, 7) == {
        "model": "models:/m/1",
        "input": str(source),
        "output": str(out),
        "rows": 3,
        "task": "classification",
    }
    assert out.read_text() == "x1\tx2\tprediction\n1\t2\tp0\n3\t4\tp1\n5\t6\tp2\n"
    assert scorer.asked == [(["x1", "x2"], 7, {"where": str(source), "base": tmp_path.resolve()})]


def test_a_parquet_input_over_the_budget_is_streamed_and_says_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import pandas as pd

    scorer = Scorer()
    monkeypatch.setattr(batch_predict, "load", lambda model: scorer)
    source = tmp_path / "in.parquet"
    pd.DataFrame({"x1": [1, 3], "x2": [2, 4]}).to_parquet(source, index=False)
    out = tmp_path / "out.jsonl"
    assert batch_predict.predict_file("m", source, out, 5, memory_budget_mb=1e-9) == {
        "model": "m",
        "input": str(source),
        "output": str(out),
        "rows": 2,
        "task": "classification",
    }
    assert out.read_text() == '{"x1": 1, "x2": 2, "prediction": "p0"}\n{"x1": 3, "x2": 4, "prediction": "p1"}\n'
    assert scorer.asked == [(["x1", "x2"], 5, {"where": str(source), "base": None})]
    err = capsys.readouterr().err
    assert err.startswith(f"predict: {source} is 0.0 MiB once read, over the 0 MiB budget: streamed a block at a time")
