"""Images end to end: a folder of class folders of PNGs through ingest → split → train → evaluate → register;
`trainflow predict` on a table of the test images' paths (and on the folder itself) and the registered pyfunc
reproduce evaluate's predictions exactly. Slow tier: digits as images with the cnn through `trainflow run`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from support.images import shapes
from support.projects import make_project

from trainflow import cli
from trainflow.artifacts.predict import ExportedModel
from trainflow.core.io import read_json
from trainflow.core.paths import Paths
from trainflow.params import load_params
from trainflow.stages import run_stage


@pytest.fixture
def image_run(tmp_path: Path) -> Paths:
    settings = {"data.source": "data/raw/shapes", "register.model_name": "shapes", "train.progress": "false",
                "train.epochs": 4, "train.batch_size": 8, "train.optimizer": "sgd", "train.lr": 0.05,
                "model.cnn_channels": "[8]", "features.augment.shift": 1}  # fmt: skip
    root = make_project(tmp_path / "proj", settings)
    shapes(root / "data/raw/shapes")
    paths = Paths(root)
    for stage in ("ingest", "split", "train", "evaluate", "register"):
        run_stage(stage, load_params(paths.params), paths)
    return paths


def test_image_folder_runs_end_to_end_and_predict_reproduces_evaluate(
    image_run: Paths, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = image_run.root
    assert read_json(root / "models/final/model.json")["name"] == "cnn"  # model.name auto, for images
    test = pd.read_parquet(image_run.split_file("test"))
    evaluated = pd.read_csv(image_run.test_plots / "predictions.csv")
    metrics = read_json(image_run.metrics)
    # A table of the test images' paths, relative to the table's own folder.
    inputs = root / "inputs"
    inputs.mkdir()
    relative = [os.path.relpath(root / p, inputs) for p in test["image_path"]]
    pd.DataFrame({"image": relative}).to_csv(inputs / "test.csv", index=False)
    monkeypatch.chdir(root)
    assert (
        cli.main(["predict", "--model", "models/final", "--input", "inputs/test.csv", "--output", "out.parquet"]) == 0
    )
    out = pd.read_parquet(root / "out.parquet")
    assert out["image"].tolist() == relative
    assert out["prediction"].astype(str).tolist() == evaluated["predicted"].astype(str).tolist()
    accuracy = float((out["prediction"].astype(str).to_numpy() == test["target"].astype(str).to_numpy()).mean())
    assert accuracy == metrics["accuracy"]
    # Bit for bit: the probabilities evaluate computed from the test split's stored bytes.
    exported = ExportedModel.load(root / "models/final")
    proba = exported.outputs(test)
    assert np.array_equal(out[[f"proba_{c}" for c in exported.pre.classes]].to_numpy(), proba)
    # The folder form: every image, with its class and path; the test images score as above.
    assert cli.main(["predict", "--model", "models/final", "--input", "data/raw/shapes", "--output", "all.csv"]) == 0
    every = pd.read_csv(root / "all.csv").set_index("image_path")
    assert len(every) == 3 * 20 and "image" not in every.columns
    assert (
        every.loc[test["image_path"], "prediction"].astype(str).tolist() == evaluated["predicted"].astype(str).tolist()
    )
    # The registered pyfunc (what `mlflow models serve` runs) takes paths too (relative to the working directory).
    import mlflow.pyfunc

    served = mlflow.pyfunc.load_model("models:/shapes@champion").predict(pd.DataFrame({"image": test["image_path"]}))
    assert np.array_equal(served[[f"proba_{c}" for c in exported.pre.classes]].to_numpy(), proba)


def test_a_missing_image_path_at_prediction_names_it(
    image_run: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = image_run.root
    pd.DataFrame({"image": ["shapes/red/00.png", "nowhere/x.png"]}).to_csv(root / "data/raw/in.csv", index=False)
    monkeypatch.chdir(root)
    args = ["predict", "--model", "models/final", "--input", "data/raw/in.csv", "--output", "o.csv"]
    assert cli.main(args) == 2
    assert (
        f"image nowhere/x.png: no such file (looked for {root / 'data/raw/nowhere/x.png'})" in capsys.readouterr().err
    )
    assert not (root / "o.csv").exists()


@pytest.mark.slow
def test_digits_as_images_reach_test_accuracy_0985_through_trainflow_run(tmp_path: Path) -> None:
    """The recipe for CNNs: SGD with momentum, a small weight decay, shift and rotation augmentation, label smoothing
    (~1 min of training on 2 CPU cores)."""
    recipe = {"data.source": "builtin:digits_images", "model.name": "cnn", "model.cnn_channels": "[32,64,128]",
              "model.cnn_blocks": 2, "train.optimizer": "sgd", "train.lr": 0.05, "train.momentum": 0.9,
              "train.weight_decay": 0.0005,
              "train.epochs": 40, "train.patience": 40, "train.label_smoothing": 0.1, "train.progress": "false",
              "features.augment.shift": 1, "features.augment.rotate": 10}  # fmt: skip
    root = make_project(tmp_path / "proj")
    trainflow = Path(sys.executable).parent / "trainflow"
    start = time.perf_counter()
    overrides = [arg for k, v in recipe.items() for arg in ("-S", f"{k}={v}")]
    done = subprocess.run([str(trainflow), "run", *overrides], cwd=root, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - start
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((root / "reports/metrics.json").read_text())
    print(f"digits_images cnn: test accuracy {metrics['accuracy']:.4f} in {seconds:.0f} s (trainflow run)")
    assert metrics["accuracy"] >= 0.985
    assert read_json(root / "models/final/model.json")["name"] == "cnn"
