"""Batch prediction: `trainflow predict` on the test split reproduces evaluate exactly, by registry URI or directory, in
each output format, and refuses what ingest refuses, naming the line; the model served by `mlflow models serve` (from
its checked copy) answers an HTTP request with the same numbers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from support.projects import FAST, blobs, fresh_copy, make_project, run_blobs_once
from support.servers import free_port, wait_for_http

from trainflow import cli
from trainflow.artifacts.predict import ExportedModel
from trainflow.baselines import split_metrics
from trainflow.core.io import read_json
from trainflow.core.paths import Paths
from trainflow.params import load_params
from trainflow.stages import run_stage


def run_pipeline(root: Path) -> Paths:
    paths = Paths(root)
    for stage in ("ingest", "split", "train", "evaluate", "register"):
        run_stage(stage, load_params(paths.params), paths)
    return paths


def predict(root: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    monkeypatch.chdir(root)
    return cli.main(["predict", *args])


def predict_test_split(paths: Paths, monkeypatch: pytest.MonkeyPatch, model: str, output: str) -> int:
    """`trainflow predict --model MODEL --input data/splits/test.parquet --output OUTPUT` in the project."""
    return predict(
        paths.root, monkeypatch, "--model", model, "--input", str(paths.split_file("test")), "--output", output
    )


@pytest.fixture(scope="module")
def _overlapping_run_once(tmp_path_factory: pytest.TempPathFactory, _empty_mlflow_store: Path) -> Path:
    # Overlapping blobs: the model gets some rows wrong, so every metric (macro vs micro F1, log-loss) is tested on
    # imperfect predictions.
    return run_blobs_once(tmp_path_factory.mktemp("predict-run"), _empty_mlflow_store, blobs(separation=1.2))


@pytest.fixture
def blobs_run(_overlapping_run_once: Path, _isolated_tracking: None) -> Paths:
    """The whole pipeline's outputs on overlapping blobs, a fresh copy per test (run once per module)."""
    return Paths(fresh_copy(_overlapping_run_once))


@pytest.mark.parametrize("output", ["out.parquet", "out.csv", "out.jsonl"])
def test_predict_reproduces_evaluate_exactly(blobs_run: Paths, monkeypatch: pytest.MonkeyPatch, output: str) -> None:
    root = blobs_run.root
    test_file = blobs_run.split_file("test")
    assert predict_test_split(blobs_run, monkeypatch, "models:/blobs@champion", output) == 0
    if output.endswith(".parquet"):
        out = pd.read_parquet(root / output)
    elif output.endswith(".jsonl"):
        out = pd.DataFrame([json.loads(line) for line in (root / output).read_text().splitlines()])
    else:
        out = pd.read_csv(root / output, float_precision="round_trip")
    test = pd.read_parquet(test_file)
    # The input rows come back unchanged, followed by the prediction columns.
    assert list(out.columns) == [*test.columns, "prediction", "proba_a", "proba_b", "proba_c"]
    pd.testing.assert_frame_equal(out[test.columns], test, check_dtype=False)
    # The same predictions evaluate scored, and the same probabilities to the last bit.
    confusion = pd.read_csv(blobs_run.test_plots / "predictions.csv")
    assert list(out["prediction"]) == list(confusion["predicted"])
    proba = out[["proba_a", "proba_b", "proba_c"]].to_numpy()
    expected = ExportedModel.load(blobs_run.final).outputs(test)
    np.testing.assert_array_equal(proba, expected)
    # evaluate's metrics are those of these predictions, by sklearn here (not by evaluate's own functions).
    from sklearn.metrics import accuracy_score, average_precision_score, f1_score, log_loss, roc_auc_score

    truth, predicted = test["label"].to_numpy(), out["prediction"].to_numpy()
    onehot = (truth[:, None] == np.array(["a", "b", "c"])).astype(int)
    confidence, right = proba.max(axis=1), predicted == truth
    bins = [(confidence > b / 15) & (confidence <= (b + 1) / 15) for b in range(15)]  # ECE by its definition
    assert split_metrics(read_json(blobs_run.metrics))[0] == pytest.approx(  # the network's (the baselines' aside)
        {
            "accuracy": accuracy_score(truth, predicted),
            "f1_macro": f1_score(truth, predicted, average="macro"),
            "log_loss": log_loss(truth, proba, labels=["a", "b", "c"]),
            "roc_auc": roc_auc_score(truth, proba, multi_class="ovr", labels=["a", "b", "c"]),
            "pr_auc": average_precision_score(onehot, proba),
            "ece": sum(abs(right[m].sum() - confidence[m].sum()) for m in bins) / len(truth),
            "n_test": len(test),
        }
    )
    # per_class.csv: sklearn's table of the same predictions.
    from sklearn.metrics import precision_recall_fscore_support

    table = pd.read_csv(blobs_run.per_class)
    scores = precision_recall_fscore_support(truth, predicted, labels=["a", "b", "c"], zero_division=0)
    assert list(table["class"]) == ["a", "b", "c"]
    np.testing.assert_allclose(table[["precision", "recall", "f1", "support"]].to_numpy().T, np.array(scores))
    roc = pd.read_csv(blobs_run.test_plots / "roc.csv")
    assert list(roc["class"].unique()) == sorted(["a", "b", "c"], key=lambda c: -list(truth).count(c))  # by count


def test_predict_from_a_csv_file_and_a_model_directory(blobs_run: Paths, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a user does: a CSV of new rows (no label column), the exported model directory."""
    root = blobs_run.root
    test = pd.read_parquet(blobs_run.split_file("test"))
    test.drop(columns=["label"]).to_csv(root / "new.csv", index=False)
    assert predict(root, monkeypatch, "--model", "models/final", "--input", "new.csv", "--output", "p.csv") == 0
    out = pd.read_csv(root / "p.csv", float_precision="round_trip")
    assert "label" not in out.columns and len(out) == len(test)
    confusion = pd.read_csv(blobs_run.test_plots / "predictions.csv")
    assert list(out["prediction"]) == list(confusion["predicted"])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--input", "missing.csv", "--output", "p.csv"], "missing.csv: no such file"),
        (["--input", "data/raw/blobs.csv", "--output", "p.xlsx"], "unknown extension '.xlsx'"),
        (["--input", "cut.csv", "--output", "p.csv"], "f3"),
        (["--input", "data/raw/blobs.csv", "--output", "p.csv", "--model", "models:/nope@champion"], "nope"),
        (["--input", "data/raw/blobs.csv", "--output", "p.csv", "--model", "no/such/dir"], "no/such/dir"),
    ],
)
def test_predict_errors_name_what_to_fix(
    blobs_run: Paths,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    needle: str,
) -> None:
    root = blobs_run.root
    pd.read_csv(root / "data/raw/blobs.csv").drop(columns=["f3"]).to_csv(root / "cut.csv", index=False)
    (root / "p.csv").write_text("earlier output\n")
    model = [] if "--model" in args else ["--model", "models:/blobs@champion"]
    assert predict(root, monkeypatch, *model, *args) == 2
    assert needle in capsys.readouterr().err
    assert (root / "p.csv").read_text() == "earlier output\n"  # nothing half-written over it


def test_predict_regression_matches_evaluate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_project(
        tmp_path / "reg", {"data.source": "builtin:diabetes", "register.model_name": "diabetes", **FAST}
    )
    paths = run_pipeline(root)
    assert predict_test_split(paths, monkeypatch, "models:/diabetes@champion", "p.parquet") == 0
    out = pd.read_parquet(root / "p.parquet")
    evaluated = pd.read_csv(paths.test_plots / "predictions.csv")
    np.testing.assert_array_equal(out["prediction"].to_numpy(), evaluated["predicted"].to_numpy())
    from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

    truth, predicted = pd.read_parquet(paths.split_file("test"))["target"].to_numpy(), out["prediction"].to_numpy()
    assert split_metrics(read_json(paths.metrics))[0] == pytest.approx(
        {
            "r2": r2_score(truth, predicted),
            "rmse": mean_squared_error(truth, predicted) ** 0.5,
            "mae": mean_absolute_error(truth, predicted),
            "n_test": len(out),
        }
    )


@pytest.mark.slow
def test_mlflow_models_serve_answers_with_the_same_numbers(blobs_run: Paths, monkeypatch: pytest.MonkeyPatch) -> None:
    root = blobs_run.root
    test = pd.read_parquet(blobs_run.split_file("test"))
    assert predict_test_split(blobs_run, monkeypatch, "models:/blobs@champion", "p.parquet") == 0
    expected = pd.read_parquet(root / "p.parquet")
    from trainflow import serving

    served = serving.download("models:/blobs@champion", root / "served")  # the README's way: a checked copy

    port = free_port()
    mlflow = Path(sys.executable).parent / "mlflow"
    server = subprocess.Popen(
        [
            str(mlflow),
            "models",
            "serve",
            "-m",
            str(served),
            "--env-manager",
            "local",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
        ],
        cwd=root,
        env={**os.environ, "MLFLOW_TRACKING_URI": os.environ["MLFLOW_TRACKING_URI"]},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for_http(
            f"{base}/ping",
            lambda: None if server.poll() is None else (server.stdout.read().decode() if server.stdout else "exited"),
            180,
            interval=0.5,
        )
        rows = test.drop(columns=["label"])
        body = json.dumps({"dataframe_split": {"columns": list(rows.columns), "data": rows.to_numpy().tolist()}})
        request = urllib.request.Request(
            f"{base}/invocations", data=body.encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as r:
            answer = pd.DataFrame(json.loads(r.read())["predictions"])
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    assert list(answer["prediction"]) == list(expected["prediction"])
    columns = ["proba_a", "proba_b", "proba_c"]
    np.testing.assert_array_equal(answer[columns].to_numpy(), expected[columns].to_numpy())


def test_predict_refuses_what_ingest_refuses_and_names_the_file_s_line_as_ingest_does(
    csv_project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An infinity in a feature is refused (ingest refuses it for training; preprocessing would score it as a missing
    value), and so is a value that is not a number; each is named by its line of the file, header counted, as ingest
    names a line. The lines here are known by construction: a quoted line break in a text column puts data row 2 on
    line 5."""
    paths = Paths(csv_project)
    for stage in ("ingest", "split", "train"):
        run_stage(stage, load_params(paths.params), paths)
    rows = ["f0,f1,f2,f3,note", '0.1,0.2,0.3,0.4,"two', 'lines"', "0.5,0.6,0.7,0.8,x", "0.5,{bad},0.1,0.2,y",
            "0.9,0.8,0.7,0.6,z"]  # fmt: skip
    (csv_project / "p.csv").write_text("earlier output\n")
    for bad, said in (
        ("inf", "--input: new.csv, line 5, column 'f1': inf is not a finite number; fix the value or drop the row"),
        ("-inf", "--input: new.csv, line 5, column 'f1': -inf is not a finite number"),
        ("abc", "--input: new.csv, line 5: column 'f1' should hold numbers but has ['abc'] in 1 row(s), the first"),
    ):
        (csv_project / "new.csv").write_text("\n".join(rows).format(bad=bad) + "\n")
        capsys.readouterr()
        assert predict(csv_project, monkeypatch, "--model", "models/final", "--input", "new.csv", "--output",
                       "p.csv") == 2  # fmt: skip
        err = capsys.readouterr().err
        assert said in err, err
        assert (csv_project / "p.csv").read_text() == "earlier output\n"
    # The fix the message names: with the value fixed, the file scores.
    (csv_project / "new.csv").write_text("\n".join(rows).format(bad="0.3") + "\n")
    assert predict(csv_project, monkeypatch, "--model", "models/final", "--input", "new.csv", "--output", "p.csv") == 0
    assert len(pd.read_csv(csv_project / "p.csv")) == 4
    # A Parquet file streamed a block at a time names its row as ingest does (counted from 1), in a later block too.
    table = pd.DataFrame(np.random.default_rng(0).normal(size=(3000, 4)), columns=["f0", "f1", "f2", "f3"])
    table.loc[2500, "f2"] = -np.inf
    table.to_parquet(csv_project / "big.parquet", index=False)
    from trainflow.data import stream

    monkeypatch.setattr(stream, "BLOCK_BYTES", 256 * 4 * 4)  # blocks of 256 rows: row 2500 is in the tenth
    capsys.readouterr()
    assert predict(csv_project, monkeypatch, "--model", "models/final", "--input", "big.parquet", "--output",
                   "p.csv", "--memory-budget-mb", "0.01", "--batch-size", "256") == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "streamed a block at a time" in err and "big.parquet, row 2501, column 'f2': -inf is not a finite" in err
