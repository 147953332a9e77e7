"""The data layer through the stages: text classification from a header-less TSV, regression, drift, appends."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from support.projects import make_project

from trainflow.artifacts.predict import ExportedModel
from trainflow.baselines import split_metrics
from trainflow.core.errors import DataError
from trainflow.core.io import read_json
from trainflow.core.paths import Paths
from trainflow.params import load_params
from trainflow.stages import run_stage


def run(root: Path, *stages: str) -> dict[str, dict]:
    paths = Paths(root)
    return {s: run_stage(s, load_params(paths.params), paths) for s in stages}


def messages(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    spam = ["win", "free", "prize", "claim", "urgent", "cash", "txt", "offer"]
    ham = ["see", "you", "later", "home", "dinner", "ok", "call", "tomorrow", "love", "work"]
    rows = []
    for _ in range(n):
        label = "spam" if rng.random() < 0.3 else "ham"
        words = list(rng.choice(spam if label == "spam" else ham, size=rng.integers(3, 9)))
        words += list(rng.choice(ham + spam, size=2))  # some overlap
        rows.append((label, " ".join(w.upper() if rng.random() < 0.1 else w for w in words) + "!"))
    return pd.DataFrame(rows, columns=["label", "text"])


@pytest.mark.parametrize(
    ("name", "built", "epochs", "packing"),
    [
        ("text_transformer", "text_transformer", 6, False),
        ("auto", "text_bag", 30, False),
        ("text_transformer", "text_transformer", 6, True),
    ],
)
def test_text_classification_from_a_headerless_tsv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, built: str, epochs: int, packing: bool
) -> None:
    """The Transformer when asked for, and what model.name auto builds for text on a CPU (the bag: cheaper epochs,
    more of them); and the Transformer trained on packed batches (train.packing), whose exported model pads as
    every model does when it predicts."""
    root = make_project(
        tmp_path / "p",
        {
            "data.source": "data/raw/sms.tsv",
            "data.header": "false",
            "data.columns": "[label,text]",
            "data.target": "label",
            "data.text_column": "text",
            "features.vocab_size": 200,
            "features.max_length": 32,
            "model.name": name,
            "model.d_model": 32,
            "model.n_heads": 2,
            "model.n_layers": 1,
            "train.epochs": epochs,
            "train.lr": 0.003,
            "train.progress": "false",
            "train.packing": str(packing).lower(),
            "register.model_name": "sms",
        },
    )
    messages(600).to_csv(root / "data/raw/sms.tsv", sep="\t", header=False, index=False)
    out = run(root, "ingest", "split", "train", "evaluate")
    said = "train: batches packed (rows as wide as each batch's longest sequence), validation padded"
    assert (said in capsys.readouterr().err) == packing
    assert out["ingest"]["text_column"] == "text" and out["ingest"]["classes"] == 2
    assert out["evaluate"]["accuracy"] >= 0.95
    paths = Paths(root)
    assert (paths.final / "tokenizer.json").is_file()
    assert read_json(paths.final / "model.json")["name"] == built
    test = pd.read_parquet(paths.split_file("test"))
    predicted = ExportedModel.load(paths.final).predict_frame(test)
    assert set(predicted["prediction"]) <= {"ham", "spam"} and {"proba_ham", "proba_spam"} <= set(predicted)
    assert (predicted["prediction"] == test["label"]).mean() == pytest.approx(out["evaluate"]["accuracy"])


def test_regression_on_builtin_diabetes(tmp_path: Path) -> None:
    from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

    root = make_project(
        tmp_path / "p",
        {
            "data.source": "builtin:diabetes",
            "train.epochs": 30,
            "train.progress": "false",
            "register.model_name": "diabetes",
        },
    )
    out = run(root, "ingest", "split", "train", "evaluate", "register")
    assert out["ingest"]["task"] == "regression"
    paths = Paths(root)
    exported = ExportedModel.load(paths.final)
    # Validation metrics (the engine's, on the device) are in the target's units, as the test metrics are: the
    # exported model is the best by val_loss, so its val predictions give that evaluation's numbers to sklearn.
    val = pd.read_parquet(paths.split_file("val"))
    y, predicted = val["target"].to_numpy(dtype=float), exported.outputs(val)
    history = pd.read_csv(paths.plots / "history.csv")
    best = history.loc[history["update"] == out["train"]["best_update"]].iloc[0]
    assert best["val_rmse"] == pytest.approx(mean_squared_error(y, predicted) ** 0.5, rel=1e-5)
    assert best["val_loss"] == pytest.approx(mean_squared_error(y, predicted), rel=1e-5)
    assert best["val_r2"] == pytest.approx(r2_score(y, predicted), abs=1e-5)
    # Test metrics, against sklearn on the test split.
    test = pd.read_parquet(paths.split_file("test"))
    y, predicted = test["target"].to_numpy(dtype=float), exported.outputs(test)
    metrics, _ = split_metrics(out["evaluate"])  # the network's (the baselines' aside)
    assert metrics == pytest.approx(
        {"r2": r2_score(y, predicted), "rmse": mean_squared_error(y, predicted) ** 0.5,
         "mae": mean_absolute_error(y, predicted), "n_test": len(test)}
    )  # fmt: skip
    # The preprocessing is fitted on the train split alone: its statistics, by pandas on that file, are the exported
    # ones (numpy's std: ddof 0), while the same statistics over every split would differ.
    train = pd.read_parquet(paths.split_file("train"))
    everything = pd.concat([train, val, test])
    pre = read_json(paths.final / "preprocess.json")
    assert [c["name"] for c in pre["columns"]] == [c for c in train.columns if c != "target"]
    for column in pre["columns"]:
        x = train[column["name"]]
        assert column["center"] == pytest.approx([x.mean()], rel=1e-9, abs=1e-12)
        assert column["scale"] == pytest.approx([x.std(ddof=0)], rel=1e-9)
        assert column["fill"] == pytest.approx([x.median()], rel=1e-9, abs=1e-12)
    assert pre["target_mean"] == pytest.approx(train["target"].mean(), rel=1e-12)
    assert pre["target_std"] == pytest.approx(train["target"].std(ddof=0), rel=1e-12)
    assert pre["target_mean"] != pytest.approx(everything["target"].mean(), rel=1e-4)  # the premise: splits differ
    print(f"diabetes test R² {metrics['r2']:.4f}, rmse {metrics['rmse']:.2f}")
    assert metrics["r2"] > 0.41  # what it reaches: 0.430 (least squares on train+val: 0.486)
    assert (paths.test_plots / "predictions.png").is_file()
    assert out["register"]["gate_metric"] == "r2"


def test_schema_drift_and_appended_rows(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p", {"data.source": "data/raw/t.csv", "data.target": "y"})
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"id": np.arange(400), "a": rng.normal(size=400), "c": rng.choice(["x", "y"], 400)})
    frame["y"] = (frame["a"] > 0).map({True: "pos", False: "neg"})
    frame.to_csv(root / "data/raw/t.csv", index=False)
    first = run(root, "ingest", "split")["split"]
    assert (first["train"], first["val"], first["test"]) == (280, 60, 60)  # exact: 400 * .7 / .15 / .15
    paths = Paths(root)
    before = {s: set(pd.read_parquet(paths.split_file(s))["id"]) for s in ("train", "val", "test")}
    more = frame.assign(id=frame["id"] + 400, a=frame["a"] + 10.0).head(40)
    pd.concat([frame, more]).to_csv(root / "data/raw/t.csv", index=False)  # 10% new rows
    second = run(root, "ingest", "split")["split"]
    assert second["rows_kept_in_place"] == 400
    after = {s: set(pd.read_parquet(paths.split_file(s))["id"]) for s in ("train", "val", "test")}
    assert all(before[s] <= after[s] for s in before)  # no existing row changed sides (the default whole-row keys)
    assert (second["train"], second["val"], second["test"]) == (308, 66, 66)  # still exact: 440 * .7 / .15 / .15
    frame.assign(extra=1.0).drop(columns=["c"]).to_csv(root / "data/raw/t.csv", index=False)
    with pytest.raises(DataError, match=r"'c'.*missing|'extra'.*new") as err:
        run(root, "ingest")
    assert "'c'" in str(err.value) and "'extra'" in str(err.value)


def test_a_table_model_s_saved_preprocessing_holds_no_text_length(tmp_path: Path) -> None:
    """features.max_length is about text: a table's preprocess.json (part of models/final, which register and DVC
    compare byte for byte) says 0, whatever features.max_length is, as the models exported so far do."""
    from support.projects import blobs

    from trainflow.data.preprocess import Preprocessor
    from trainflow.data.schema import Schema
    from trainflow.params import FeatureParams

    frame = blobs(40)
    features = [c for c in frame.columns if c != "label"]
    kinds = dict.fromkeys(features, "numeric")
    schema = Schema("t.csv", "label", "classification", features, kinds, sorted(set(frame["label"])), n_rows=40)
    Preprocessor.fit(frame, schema, FeatureParams(max_length=64)).save(tmp_path / "final")
    saved = read_json(tmp_path / "final" / "preprocess.json")
    assert saved["text_column"] is None and saved["max_length"] == 0
    assert not (tmp_path / "final" / "tokenizer.json").exists()
