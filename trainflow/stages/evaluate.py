"""evaluate: score the exported model on the test split; write metrics.json and the confusion-matrix plot."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from trainflow import plots
from trainflow.errors import UserError
from trainflow.io import atomic_dir, write_json
from trainflow.params import PipelineParams
from trainflow.paths import Paths
from trainflow.predict import ExportedModel


def classification_metrics(labels: np.ndarray, proba: np.ndarray) -> dict[str, float]:
    from sklearn.metrics import accuracy_score, f1_score, log_loss

    predicted = proba.argmax(axis=1)
    # Macro F1 averages over the classes that occur in the labels or the predictions: a class absent from both (a
    # rare class that missed this test split) has no F1 to speak of, and counting it as 0 would punish a perfect model.
    return {
        "accuracy": float(accuracy_score(labels, predicted)),
        "f1_macro": float(f1_score(labels, predicted, average="macro", zero_division=0)),
        "log_loss": float(log_loss(labels, proba.astype(np.float64), labels=range(proba.shape[1]))),
    }


def regression_metrics(y: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

    return {
        "r2": float(r2_score(y, predicted)),
        "rmse": float(np.sqrt(mean_squared_error(y, predicted))),
        "mae": float(mean_absolute_error(y, predicted)),
    }


def score(exported: ExportedModel, test: pd.DataFrame, where: str, batch_size: int) -> tuple[dict[str, Any], Any]:
    """(the test metrics plus n_test, the model's outputs) of `exported` on the labelled table `test`.

    The register stage re-scores an older champion with this, so both are measured the same way."""
    labels = exported.pre.labels(test, where)
    outputs = exported.outputs(test, batch_size=batch_size, where=where)
    if exported.pre.task == "regression":
        return {**regression_metrics(labels, outputs), "n_test": len(test)}, outputs
    return {**classification_metrics(labels, outputs), "n_test": len(test)}, outputs


def read_test(paths: Paths, stage: str) -> pd.DataFrame:
    test_file = paths.split_file("test")
    if not test_file.is_file():
        raise UserError(f"{stage}: {test_file} is missing; run `trainflow stage split` first")
    return pd.read_parquet(test_file)


def run(params: PipelineParams, paths: Paths) -> dict[str, Any]:
    test = read_test(paths, "evaluate")
    exported = ExportedModel.load(paths.final)
    where = str(paths.split_file("test"))
    labels = exported.pre.labels(test, where)
    metrics, outputs = score(exported, test, where, params.evaluate.batch_size)
    # One folder of test plots, replaced whole, holding the same files for both tasks (so `dvc plots show` always
    # finds them): predictions.csv, every test row's actual and predicted value; confusion.csv, what DVC draws as a
    # confusion matrix (classes, the 19 most frequent and "other" beyond 20; for regression, deciles of the actual
    # values); predictions.png, the confusion matrix or the predicted-vs-actual scatter.
    with atomic_dir(paths.test_plots) as out:
        if exported.pre.task == "regression":
            plots.write_csv(pd.DataFrame({"actual": labels, "predicted": outputs}), out / "predictions.csv")
            actual_bin, predicted_bin = plots.decile_bins(labels, outputs)
            plots.write_csv(pd.DataFrame({"actual": actual_bin, "predicted": predicted_bin}), out / "confusion.csv")
            plots.predicted_vs_actual(labels, outputs, out / "predictions.png")
        else:
            predicted = outputs.argmax(axis=1)
            classes = np.asarray(exported.pre.classes)
            rows = pd.DataFrame({"actual": classes[labels], "predicted": classes[predicted]})
            plots.write_csv(rows, out / "predictions.csv")
            top_actual, top_predicted, names = plots.top_classes(labels, predicted, list(classes))
            plots.write_csv(pd.DataFrame({"actual": names[top_actual], "predicted": names[top_predicted]}),
                            out / "confusion.csv")  # fmt: skip
            plots.confusion_matrix(labels, predicted, list(classes), out / "predictions.png")
    write_json(paths.metrics, metrics)
    return metrics
