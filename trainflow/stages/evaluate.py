"""evaluate: score the exported model on the test split; write metrics.json and the confusion-matrix plot."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from trainflow import plots
from trainflow.errors import UserError
from trainflow.io import write_json
from trainflow.params import PipelineParams
from trainflow.paths import Paths
from trainflow.predict import ExportedModel


def classification_metrics(labels: np.ndarray, proba: np.ndarray) -> dict[str, float]:
    from sklearn.metrics import accuracy_score, f1_score, log_loss

    predicted = proba.argmax(axis=1)
    k = proba.shape[1]
    return {
        "accuracy": float(accuracy_score(labels, predicted)),
        "f1_macro": float(f1_score(labels, predicted, average="macro", labels=range(k), zero_division=0)),
        "log_loss": float(log_loss(labels, proba.astype(np.float64), labels=range(k))),
    }


def run(params: PipelineParams, paths: Paths) -> dict[str, Any]:
    if not paths.split_file("test").is_file():
        raise UserError(f"evaluate: {paths.split_file('test')} is missing; run `trainflow stage split` first")
    exported = ExportedModel.load(paths.final)
    test = pd.read_parquet(paths.split_file("test"))
    labels = exported.pre.labels_array(test, str(paths.split_file("test")))
    proba = exported.predict_proba(test, batch_size=params.evaluate.batch_size)
    metrics: dict[str, Any] = {**classification_metrics(labels, proba), "n_test": len(test)}
    predicted = proba.argmax(axis=1)
    classes = exported.pre.classes
    confusion = pd.DataFrame({"actual": np.asarray(classes)[labels], "predicted": np.asarray(classes)[predicted]})
    plots.write_csv(confusion, paths.plots / "confusion.csv")
    plots.confusion_matrix(labels, predicted, classes, paths.plots / "confusion_matrix.png")
    write_json(paths.metrics, metrics)
    return metrics
