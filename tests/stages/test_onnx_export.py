"""models/final/model.onnx (issue 29, item 1): every model family the train stage exports is scored by ONNX Runtime
as torch scores it, on the test split, through the same preprocessing; `trainflow predict --runtime onnx`
reproduces evaluate's metrics; a model the exporter cannot freeze gets no graph and says why.

The reference is the torch model's own outputs (`ExportedModel.outputs`, what evaluate and `trainflow predict`
compute); ONNX Runtime, the thing under test, runs the graph alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import pytest
import torch
from support.images import shapes
from support.projects import blobs, make_project
from support.reviews import FILLER, NEGATIVE, POSITIVE, reviews
from support.tiny_models import tiny_bert

from trainflow import cli
from trainflow.artifacts.export import export
from trainflow.artifacts.onnx import ONNX, TOLERANCE, Scores, gap, to_onnx
from trainflow.artifacts.predict import ExportedModel
from trainflow.core.errors import UserError
from trainflow.core.io import read_json
from trainflow.core.paths import Paths
from trainflow.data.preprocess import Column, Preprocessor
from trainflow.data.schema import Schema
from trainflow.params import load_params
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
    assert len(test) >= 10 and gap(got, expected, torch_model.pre) <= TOLERANCE
    # Batches of 7 rows (text: other paddings) score the same.
    assert gap(onnx_model.outputs(test, batch_size=7, base=base), expected, torch_model.pre) <= TOLERANCE
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


# --- parity at the target's scale, long text, infinities --------------------------------------------------------------


def numeric_table(task: Literal["classification", "regression"], mean: float = 0.0, std: float = 1.0) -> Preprocessor:
    """Four numeric features (x1 with a missing-value indicator) as a fitted preprocessing would hold them."""
    columns = [Column(f"x{i}", "numeric", [0.5 * i], [0.25 * i], [1.0 + i], indicator=i == 1) for i in range(4)]
    classes = ["a", "b", "c"] if task == "classification" else []
    return Preprocessor(target="t", task=task, classes=classes, raw_features=[c.name for c in columns],
                        columns=columns, target_mean=mean, target_std=std)  # fmt: skip


def mlp(pre: Preprocessor) -> torch.nn.Module:
    from trainflow.models import build_model

    torch.manual_seed(0)
    outputs = len(pre.classes) or 1
    config = {"name": "mlp", "in_features": pre.width, "out_features": outputs, "hidden_sizes": [128, 64]}
    return build_model({**config, "dropout": 0.0}).eval()


def offset_scores(graph: bytes, delta: float) -> bytes:
    """`graph` with `delta` added to its scores: a graph that is wrong by that much."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load_from_string(graph)
    for node in model.graph.node:
        node.output[:] = ["scores/right" if o == "scores" else o for o in node.output]
    model.graph.initializer.append(numpy_helper.from_array(np.array(delta), "scores/delta"))
    model.graph.node.append(helper.make_node("Add", ["scores/right", "scores/delta"], ["scores"], name="scores/add"))
    return bytes(model.SerializeToString())


@pytest.mark.parametrize(("mean", "std"), [(5e3, 1e3), (2e-3, 1e-3)])
def test_regression_targets_of_any_scale_export_and_a_wrong_graph_is_still_refused(
    mean: float, std: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Targets in thousands and in thousandths both get a graph whose values are torch's within 1e-5 of the target's
    standard deviation; a graph wrong by 1e-3 of it is refused at either scale (in thousandths, that is 1e-6: under
    an absolute 1e-5)."""
    import onnxruntime

    from trainflow.artifacts import onnx as onnx_graph

    pre = numeric_table("regression", mean, std)
    model = mlp(pre)
    graph, note = to_onnx(model, pre, {})
    assert graph is not None, note
    assert note.endswith("of the target's standard deviation on the example batches"), note
    rows = pd.DataFrame(np.random.default_rng(1).normal(0.0, 2.0, (64, 4)), columns=pre.raw_features)
    session = onnxruntime.InferenceSession(graph, providers=["CPUExecutionProvider"])
    (got,) = session.run(["scores"], pre.typed_columns(rows))
    with torch.no_grad():  # by hand: the model on trainflow's features, unscaled in float64
        expected = model(torch.from_numpy(pre.features(rows))).double().numpy().reshape(-1) * std + mean
    assert np.allclose(got, expected, rtol=1e-5, atol=1e-5 * std) and np.abs(expected - mean).max() > 0.1 * std
    right = onnx_graph._graph
    monkeypatch.setattr(onnx_graph, "_graph", lambda *a: offset_scores(right(*a), 1e-3 * std))
    wrong, why = to_onnx(model, pre, {})
    assert wrong is None and why.startswith("ONNX Runtime's outputs differ from torch's by 1.00e-03 of the target"), why


def test_the_text_graph_cuts_a_longer_text_as_trainflow_s_tokenizer_does() -> None:
    """Ids past features.max_length (a tokenizer without tokenizer.json's truncation): ONNX Runtime scores the text as
    torch scores it through trainflow, which keeps the first max_length ids."""
    import onnxruntime

    from trainflow.artifacts.predict import ExportedModel
    from trainflow.data.preprocess import PAD_ID, train_tokenizer
    from trainflow.models import build_model

    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "tired", "cats"]
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(words, 12)) for _ in range(40)]
    max_length = 8
    tokenizer = train_tokenizer(texts, 200, max_length)
    pre = Preprocessor(target="y", task="classification", classes=["a", "b"], raw_features=[], columns=[],
                       text_column="text", max_length=max_length, tokenizer=tokenizer)  # fmt: skip
    torch.manual_seed(0)
    model = build_model({"name": "text_transformer", "vocab_size": pre.vocab_size, "out_features": 2, "d_model": 16,
                         "n_heads": 2, "n_layers": 1, "max_len": max_length + 1, "dropout": 0.0}).eval()  # fmt: skip
    graph, note = to_onnx(model, pre, {"max_len": max_length + 1})
    assert graph is not None, note
    long = pd.DataFrame({"text": [" ".join(rng.choice(words, 30)) for _ in range(3)] + ["the fox"]})
    expected = ExportedModel(model, pre).outputs(long)  # torch, through trainflow's tokenizer (it truncates)
    untruncated = pre.tokenizer.from_str(pre.tokenizer.to_str())  # type: ignore[union-attr]
    untruncated.no_truncation()
    ids = [e.ids for e in untruncated.encode_batch(long["text"].tolist())]
    width = max(len(i) for i in ids)
    assert width > 3 * max_length and min(len(i) for i in ids) < max_length
    tokens = np.array([i + [PAD_ID] * (width - len(i)) for i in ids], dtype=np.int64)
    mask = np.array([[j < len(i) for j in range(width)] for i in ids])
    session = onnxruntime.InferenceSession(graph, providers=["CPUExecutionProvider"])
    (got,) = session.run(["scores"], {"tokens": tokens, "mask": mask})
    assert np.max(np.abs(got - expected)) <= TOLERANCE


def test_the_table_graph_counts_an_infinity_as_missing_as_the_documented_rule_does() -> None:
    """+inf, -inf and NaN fed to the graph itself (not through trainflow's reader, which turns an infinity into NaN
    first): each is missing, so imputed with the column's fill value and its indicator set, by hand here; the scores
    are the torch model's on those features."""
    import onnx
    import onnxruntime

    pre = numeric_table("classification")
    model = mlp(pre)
    graph, note = to_onnx(model, pre, {})
    assert graph is not None, note
    x1 = np.array([2.0, np.inf, -np.inf, np.nan, -3.0])
    feed = {c.name: np.full(len(x1), 1.0 + i) for i, c in enumerate(pre.columns)} | {"x1": x1}
    by_hand = []
    for c in pre.columns:
        values = feed[c.name]
        missing = ~np.isfinite(values)
        by_hand.append(((np.where(missing, c.fill[0], values) - c.center[0]) / c.scale[0]).astype(np.float32))
        if c.indicator:
            by_hand.append(missing.astype(np.float32))
    features = np.stack(by_hand, axis=1)
    assert features[:, 2].tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]  # x1's indicator
    cut = onnx.utils.Extractor(onnx.load_from_string(graph)).extract_model(pre.raw_features, ["pre/features"])
    (computed,) = onnxruntime.InferenceSession(cut.SerializeToString()).run(None, feed)
    assert np.array_equal(computed, features)
    (scores,) = onnxruntime.InferenceSession(graph).run(["scores"], feed)
    with torch.no_grad():
        expected = torch.softmax(model(torch.from_numpy(features)).double(), dim=1).numpy()
    assert np.max(np.abs(scores - expected)) <= TOLERANCE
