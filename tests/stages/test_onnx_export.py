"""models/final/model.onnx (issue 29, item 1): every model family the train stage exports is scored by ONNX Runtime
as torch scores it, on the test split, through the same preprocessing; `trainflow predict --runtime onnx`
reproduces evaluate's metrics; a model the exporter cannot freeze gets no graph and says why.

The reference is the torch model's own outputs (`ExportedModel.outputs`, what evaluate and `trainflow predict`
compute); ONNX Runtime, the thing under test, runs the graph alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import blobs, make_project, tiny_bert
from test_hf import FILLER, NEGATIVE, POSITIVE, reviews
from test_images import shapes

from trainflow import cli
from trainflow.data.schema import Schema
from trainflow.errors import UserError
from trainflow.export import export
from trainflow.io import read_json
from trainflow.onnx_export import ONNX, TOLERANCE, Scores, to_onnx
from trainflow.params import load_params
from trainflow.paths import Paths
from trainflow.predict import ExportedModel
from trainflow.stages import run_stage

QUICK = {"train.epochs": 2, "train.progress": "false", "train.batch_size": 16}
TEXT = {"data.source": "data/raw/reviews.csv", "data.target": "label", "data.text_column": "text",
        "features.max_length": 24}  # fmt: skip
CASES = {
    "mlp": {"data.source": "data/raw/blobs.csv", "data.target": "label"},
    "mlp-regression": {"data.source": "data/raw/blobs.csv", "data.target": "f0"},
    "text_transformer": {**TEXT, "model.name": "text_transformer", "model.d_model": 16, "model.n_layers": 1},
    # Sequences cut at 8 tokens (+ [CLS]; the least features.max_length allows): shorter than the longest example
    # batch the export checks with.
    "text_transformer-short": {
        **TEXT,
        "model.name": "text_transformer",
        "model.d_model": 16,
        "model.n_layers": 1,
        "features.max_length": 8,
    },
    "text_bag-pairs": {**TEXT, "model.name": "text_bag", "model.kwargs": '{"buckets": 64}'},
    "cnn": {"data.source": "data/raw/shapes", "model.cnn_channels": "[8]", "train.batch_size": 8},
    "hf-bert": {**TEXT, "model.name": "hf:pretrained/tiny-bert"},
}


def trained(root: Path, case: str) -> Paths:
    if case.startswith("mlp"):
        blobs(120).to_csv(root / "data/raw/blobs.csv", index=False)
    elif case == "cnn":
        shapes(root / "data/raw/shapes", per_class=30)
    else:
        reviews(120).to_csv(root / "data/raw/reviews.csv", index=False)
        if case == "hf-bert":
            tiny_bert(root / "pretrained/tiny-bert", [*POSITIVE, *NEGATIVE, *FILLER, "."])
    paths = Paths(root)
    for stage in ("ingest", "split", "train"):
        run_stage(stage, load_params(paths.params), paths)
    return paths


@pytest.mark.parametrize("case", list(CASES))
def test_onnx_runtime_scores_the_test_split_as_torch_does(
    tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = trained(make_project(tmp_path / "proj", {**QUICK, **CASES[case]}), case)
    assert (paths.final / ONNX).is_file()
    assert read_json(paths.final / "training.json")["onnx_not_exported"] is None
    test = pd.read_parquet(paths.split_file("test"))
    torch_model = ExportedModel.load(paths.final)
    onnx_model = torch_model.on_onnx()
    assert onnx_model.onnx is not None and torch_model.onnx is None
    base = paths.root  # image paths are relative to the project
    expected = torch_model.outputs(test, base=base)

    def not_torch(*_: object, **__: object) -> None:
        raise AssertionError("the torch model ran: the ONNX runtime scores without it")

    monkeypatch.setattr(torch_model.model, "forward", not_torch)
    got = onnx_model.outputs(test, base=base)
    assert got.shape == expected.shape == ((len(test), len(torch_model.pre.classes)) if "regression" not in case
                                           else (len(test),))  # fmt: skip
    assert len(test) >= 10 and np.max(np.abs(got - expected)) <= TOLERANCE
    # Batches of 7 rows (text: other paddings) score the same.
    assert np.max(np.abs(onnx_model.outputs(test, batch_size=7, base=base) - expected)) <= TOLERANCE
    if "regression" in case:  # in the target's units: the graph undoes the standardisation
        assert abs(float(np.mean(got)) - float(test["f0"].mean())) < 3 * float(test["f0"].std())
    else:
        assert np.array_equal(got.argmax(axis=1), expected.argmax(axis=1))


def test_predict_with_the_onnx_runtime_reproduces_evaluate_s_accuracy(
    csv_project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = Paths(csv_project)
    for stage in ("ingest", "split", "train", "evaluate"):
        run_stage(stage, load_params(paths.params), paths)
    monkeypatch.chdir(csv_project)
    test = pd.read_parquet(paths.split_file("test"))
    test.drop(columns=["label"]).to_csv("test.csv", index=False)
    capsys.readouterr()
    args = ["predict", "--model", "models/final", "--input", "test.csv", "--output", "out.csv", "--runtime", "onnx"]
    assert cli.main(args) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == len(test)
    out = pd.read_csv("out.csv")
    accuracy = float((out["prediction"].astype(str).to_numpy() == test["label"].astype(str).to_numpy()).mean())
    assert accuracy == read_json(paths.metrics)["accuracy"]
    # Without the graph, the error names the file and the way back (the torch runtime), and the way back works.
    (paths.final / ONNX).unlink()
    with pytest.raises(UserError, match=r"no model\.onnx \(trained before .*--runtime torch"):
        ExportedModel.load(paths.final).on_onnx()
    capsys.readouterr()
    assert cli.main(args) == 2
    assert "no model.onnx" in capsys.readouterr().err
    assert cli.main(args[:-2]) == 0
    assert pd.read_csv("out.csv")["prediction"].astype(str).tolist() == out["prediction"].astype(str).tolist()
    # The other way back the message gives: `trainflow stage train` exports it, and --runtime onnx works again.
    assert cli.main(["stage", "train"]) == 0
    assert (paths.final / ONNX).is_file() and cli.main(args) == 0
    assert pd.read_csv("out.csv")["prediction"].astype(str).tolist() == out["prediction"].astype(str).tolist()


class HostRead(torch.nn.Module):
    """Reads a value to the host in forward: the trace freezes it, so the graph is wrong for other inputs."""

    def __init__(self, width: int, classes: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * float(x.abs().mean())


def test_a_model_the_trace_gets_wrong_gets_no_graph_and_says_why(csv_project: Path) -> None:
    paths = Paths(csv_project)
    for stage in ("ingest", "split", "train"):
        run_stage(stage, load_params(paths.params), paths)
    pre = ExportedModel.load(paths.final).pre
    graph, why = to_onnx(HostRead(pre.width, len(pre.classes)).eval(), pre, {})
    assert graph is None and why.startswith("ONNX Runtime's outputs differ from torch's by"), why
    # The trained MLP itself exports, with its difference in the note.
    ok, note = to_onnx(ExportedModel.load(paths.final).model, pre, {})
    assert ok is not None and note.startswith("max |ONNX Runtime - torch|")


HOST_READ = """
import torch


class HostRead(torch.nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = torch.nn.Linear(in_features, out_features)

    def forward(self, x):
        return self.linear(x) * float(x.abs().mean())
"""


def test_the_train_stage_s_export_says_at_train_time_why_a_model_has_no_graph(
    csv_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """export() (what the train stage calls) with a user model the trace gets wrong: the other files are written,
    model.onnx is not, the stage's output says why, training.json keeps it, and predict --runtime onnx repeats it."""
    paths = Paths(csv_project)
    for stage in ("ingest", "split", "train"):
        run_stage(stage, load_params(paths.params), paths)
    (tmp_path / "hostread_model.py").write_text(HOST_READ)
    monkeypatch.syspath_prepend(str(tmp_path))
    pre = ExportedModel.load(paths.final).pre
    config = {"name": "hostread_model:HostRead", "in_features": pre.width, "out_features": len(pre.classes)}
    torch.manual_seed(0)
    weights = {k: v.clone() for k, v in torch.nn.Linear(pre.width, len(pre.classes)).state_dict().items()}
    weights = {f"linear.{k}": v for k, v in weights.items()}
    schema = Schema.read(paths.final / "schema.json")
    dest = tmp_path / "final"
    capsys.readouterr()
    export(weights, config, pre, schema, {"epochs": 1}, dest)
    err = capsys.readouterr().err
    assert "train: model.onnx not written (ONNX Runtime's outputs differ from torch's by" in err, err
    assert sorted(p.name for p in dest.iterdir()) == [
        "model.json", "model.safetensors", "preprocess.json", "schema.json", "training.json"
    ]  # fmt: skip
    why = read_json(dest / "training.json")["onnx_not_exported"]
    assert why.startswith("ONNX Runtime's outputs differ from torch's by")
    with pytest.raises(UserError, match=r"no model\.onnx \(the train stage could not export it: ONNX Runtime's"):
        ExportedModel.load(dest).on_onnx()


def mixed(n: int, seed: int = 0) -> pd.DataFrame:
    """A table of every feature kind, each with missing values: numbers, categories (rare ones too), yes/no,
    timestamps before and after 1970 at every hour; the label depends on each. (An infinity is refused by ingest: the
    test adds one to the rows it predicts.)"""
    rng = np.random.default_rng(seed)
    size = rng.normal(10.0, 3.0, n)
    colour = rng.choice(["red", "green", "blue", "teal", "plum"], n, p=[0.4, 0.3, 0.2, 0.07, 0.03]).astype(object)
    member = rng.choice(["yes", "no"], n).astype(object)
    when = pd.to_datetime("1969-06-01") + pd.to_timedelta(rng.integers(0, 2 * 365 * 24, n), unit="h")
    score = (size - 10) / 3 + (colour == "red") + (member == "yes") + (when.hour.to_numpy() >= 12) - 1.2
    frame = pd.DataFrame({"size": size, "colour": colour, "member": member, "when": when.astype(object),
                          "label": np.where(score > 0, "high", "low")})  # fmt: skip
    frame.loc[::9, "size"] = np.nan
    frame.loc[4::11, "colour"] = None
    frame.loc[2::13, "member"] = None
    frame.loc[5::17, "when"] = None
    return frame


def test_the_graph_preprocesses_raw_columns_of_every_kind_as_trainflow_does(tmp_path: Path) -> None:
    """A table's graph takes the raw columns (numbers, categories, yes/no, timestamps) and computes the same scores
    and labels as the torch model after trainflow's preprocessing, on test rows and on rows the train split never had:
    unseen categories, missing values everywhere, timestamps decades away."""
    import onnx
    import onnxruntime

    root = make_project(tmp_path / "proj", {**QUICK, "data.source": "data/raw/mixed.csv", "data.target": "label",
                                            "features.max_categories": 3})  # fmt: skip
    mixed(300).to_csv(root / "data/raw/mixed.csv", index=False)
    paths = Paths(root)
    for stage in ("ingest", "split", "train"):
        run_stage(stage, load_params(paths.params), paths)
    model = ExportedModel.load(paths.final)
    kinds = {c.name: c.kind for c in model.pre.columns}
    assert kinds == {"size": "numeric", "colour": "categorical", "member": "boolean", "when": "datetime"}, kinds
    graph = onnx.load(paths.final / ONNX)
    types = {i.name: i.type.tensor_type.elem_type for i in graph.graph.input}
    assert types == {"size": onnx.TensorProto.DOUBLE, "colour": onnx.TensorProto.STRING,
                     "member": onnx.TensorProto.DOUBLE, "when": onnx.TensorProto.INT64}, types  # fmt: skip
    session = onnxruntime.InferenceSession(str(paths.final / ONNX), providers=["CPUExecutionProvider"])
    test = pd.read_parquet(paths.split_file("test"))
    far = mixed(40, seed=1).drop(columns="label")
    far["colour"] = ["mauve", None, "red", "teal"] * 10  # unseen, missing, kept, rare (not kept: max_categories 3)
    far["when"] = pd.to_datetime(["1901-03-01 05:00", None, "2099-12-31 23:59", "1970-01-01 00:00"] * 10)
    far.loc[7, "size"] = np.inf  # missing, as trainflow reads it at prediction
    for rows in (test, far):
        expected = model.outputs(rows)  # torch, after trainflow's preprocessing
        feed = model.pre.typed_columns(rows)
        scores, labels = session.run(["scores", "label"], feed)
        assert np.max(np.abs(scores - expected)) <= TOLERANCE
        assert labels.tolist() == np.asarray(model.pre.classes)[expected.argmax(axis=1)].tolist()
    # The graph's preprocessing alone gives trainflow's float32 features bit for bit.
    cut = onnx.utils.Extractor(graph).extract_model(list(types), ["pre/features"])
    (features,) = onnxruntime.InferenceSession(cut.SerializeToString()).run(None, model.pre.typed_columns(far))
    assert np.array_equal(features, model.pre.features(far))


def test_a_table_graph_exported_before_the_preprocessing_moved_in_still_scores(csv_project: Path) -> None:
    """models/final from before 2026-11-27: model.onnx takes the preprocessed `features` matrix (2-d). Predict feeds
    it that matrix, and the scores are torch's."""
    import io

    paths = Paths(csv_project)
    for stage in ("ingest", "split", "train"):
        run_stage(stage, load_params(paths.params), paths)
    model = ExportedModel.load(paths.final)
    old = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(
            Scores(model.model, model.pre, ["x"]).eval(), (torch.zeros(3, model.pre.width),), old,
            input_names=["features"], output_names=["scores"], dynamic_axes={"features": {0: "rows"}},
            opset_version=18, dynamo=False,
        )  # fmt: skip
    (paths.final / ONNX).write_bytes(old.getvalue())
    scored = model.on_onnx()
    assert scored.onnx is not None and not scored.onnx.raw
    test = pd.read_parquet(paths.split_file("test"))
    assert np.max(np.abs(scored.outputs(test) - model.outputs(test))) <= TOLERANCE


def test_a_feature_named_like_the_graph_s_output_gets_no_graph_and_the_rename_it_says_works() -> None:
    from trainflow.data.preprocess import Column, Preprocessor
    from trainflow.models import build_model

    def table(name: str) -> Preprocessor:
        return Preprocessor(target="t", task="classification", classes=["a", "b"], raw_features=[name],
                            columns=[Column(name, "numeric", [0.0], [0.0], [1.0])])  # fmt: skip

    mlp = build_model({"name": "mlp", "in_features": 1, "out_features": 2, "hidden_sizes": [4], "dropout": 0.0}).eval()
    graph, why = to_onnx(mlp, table("scores"), {})
    assert graph is None and "feature column 'scores' has a name the graph uses itself" in why and "rename" in why
    renamed, _ = to_onnx(mlp, table("scores_1"), {})
    assert renamed is not None
