"""evaluate: score the exported model on the test split; write metrics.json, per_class.csv and the test plots."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pandas as pd

from trainflow import baselines, plots
from trainflow.artifacts.predict import ExportedModel
from trainflow.core.errors import UserError
from trainflow.core.io import atomic_dir, write_json
from trainflow.core.paths import Paths
from trainflow.data import stream
from trainflow.data.stream import Split
from trainflow.metrics import PER_CLASS_COLUMNS, classification_metrics, per_class, regression_metrics
from trainflow.params import DataParams, EvaluateParams

# dvc.yaml lists what the stage reads (tests/contracts/test_stage_params.py). data.memory_budget_mb: a test split over
# it is scored a block at a time (the same outputs), and the baselines are left out (metrics.json changes).
PARAMS = ("evaluate", "data.memory_budget_mb")
READS_UNLISTED: dict[str, str] = {}


def score(exported: ExportedModel, test: pd.DataFrame, where: str, batch_size: int) -> tuple[dict[str, Any], Any]:
    """(the test metrics plus n_test, the model's outputs) of `exported` on the labelled table `test`."""
    labels = exported.pre.labels(test, where)
    outputs = exported.outputs(test, batch_size=batch_size, where=where)
    return test_metrics(exported, labels, outputs), outputs


def test_metrics(exported: ExportedModel, labels: np.ndarray, outputs: np.ndarray) -> dict[str, Any]:
    if exported.pre.task == "regression":
        return {**regression_metrics(labels, outputs), "n_test": len(labels)}
    return {**classification_metrics(labels, outputs), "n_test": len(labels)}


def score_split(
    exported: ExportedModel, paths: Paths, stage: str, batch_size: int, d: DataParams
) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """(metrics, outputs, labels) of `exported` on the test split: read whole, or, when it is bigger than
    data.memory_budget_mb and the model takes a table, a block of whole batches at a time (the same batches, so the
    same outputs bit for bit). Evaluate scores with this, and register re-scores an older champion with it, so both
    are measured the same way."""
    split = Split.stored(paths.splits, "test")
    where, pre = str(split), exported.pre
    if not split.exists():
        raise UserError(f"{stage}: {split} is missing; run `trainflow stage split` first")
    held = stream.choose([split], d, text=pre.text_column is not None)
    if not held.streamed:
        test = read_test(paths, stage)
        metrics, outputs = score(exported, test, where, batch_size)
        return metrics, outputs, pre.labels(test, where)
    print(f"{stage}: test data {held.why}", file=sys.stderr)
    labels, outputs = [], []
    # A block holds about stream.BLOCK_BYTES of model inputs: float32 features, or an image's pixels (the encoded
    # bytes read with them are smaller).
    width = pre.width if pre.image_column is None else pre.image_channels * pre.image_size[0] * pre.image_size[1]
    for frame in stream.blocks(split, stream.block_rows(width, batch_size), stream.input_columns(pre, split)):
        labels.append(pre.labels(frame, where))
        outputs.append(exported.outputs(frame, batch_size=batch_size, where=where))
    y, out = np.concatenate(labels), np.concatenate(outputs)
    return test_metrics(exported, y, out), out, y


def baseline_metrics(exported: ExportedModel, paths: Paths, d: DataParams) -> dict[str, float]:
    """trainflow.baselines fitted on the train split and scored on the test split, both read whole: {} (and a line
    on stderr saying why) for text and images, and for tables streamed from disk (read whole, they would not fit)."""
    pre = exported.pre
    files = [Split.stored(paths.splits, "train"), Split.stored(paths.splits, "test")]
    why = None
    if pre.text_column is not None or pre.image_column is not None:
        why = f"the model reads {'text' if pre.text_column is not None else 'images'}"
    elif stream.choose([*files], d).streamed:
        why = "the table is streamed from disk (data.memory_budget_mb)"
    if why is not None:
        print(f"evaluate: no baselines: {why}; they are fitted on tables held in memory", file=sys.stderr)
        return {}
    train, test = (f.read() for f in files)
    fit = train.iloc[baselines.sample(len(train))]
    where = [str(f) for f in files]
    out = baselines.fit_and_score(
        pre.task,
        pre.features(fit, where[0]),
        pre.labels(fit, where[0]),
        pre.features(test, where[1]),
        pre.labels(test, where[1]),
        len(pre.classes),
        regression_metrics if pre.task == "regression" else classification_metrics,
    )
    if not out:
        print("evaluate: no baselines: the train split holds a single class", file=sys.stderr)
    return out


def read_test(paths: Paths, stage: str) -> pd.DataFrame:
    test = Split.stored(paths.splits, "test")
    if not test.exists():
        raise UserError(f"{stage}: {test} is missing; run `trainflow stage split` first")
    return test.read()


def run(paths: Paths, *, evaluate: EvaluateParams, data: DataParams) -> dict[str, Any]:
    exported = ExportedModel.load(paths.final)
    metrics, outputs, labels = score_split(exported, paths, "evaluate", evaluate.batch_size, data)
    metrics |= baseline_metrics(exported, paths, data)  # beside the network's: does it earn its keep?
    # One folder of test plots, replaced whole, holding the same files for both tasks (so `dvc plots show` always
    # finds them): predictions.csv, every test row's actual and predicted value; confusion.csv, what DVC draws as a
    # confusion matrix (classes, the 19 most frequent and "other" beyond 20; for regression, deciles of the actual
    # values); predictions.png, the confusion matrix or the predicted-vs-actual scatter; roc.csv and pr.csv, the ROC
    # and precision-recall curves (binary: of the positive class; else one-vs-rest for the 10 most frequent classes;
    # regression: the header only), also drawn in roc_pr.png (classification only).
    with atomic_dir(paths.test_plots) as out:
        if exported.pre.task == "regression":
            plots.write_csv(pd.DataFrame({"actual": labels, "predicted": outputs}), out / "predictions.csv")
            actual_bin, predicted_bin = plots.decile_bins(labels, outputs)
            plots.write_csv(pd.DataFrame({"actual": actual_bin, "predicted": predicted_bin}), out / "confusion.csv")
            plots.predicted_vs_actual(labels, outputs, out / "predictions.png")
            plots.write_csv(pd.DataFrame(columns=plots.ROC_COLUMNS), out / "roc.csv")
            plots.write_csv(pd.DataFrame(columns=plots.PR_COLUMNS), out / "pr.csv")
            table = pd.DataFrame(columns=PER_CLASS_COLUMNS)
        else:
            predicted = outputs.argmax(axis=1)
            classes = np.asarray(exported.pre.classes)
            rows = pd.DataFrame({"actual": classes[labels], "predicted": classes[predicted]})
            plots.write_csv(rows, out / "predictions.csv")
            top_actual, top_predicted, names = plots.top_classes(labels, predicted, list(classes))
            plots.write_csv(pd.DataFrame({"actual": names[top_actual], "predicted": names[top_predicted]}),
                            out / "confusion.csv")  # fmt: skip
            plots.confusion_matrix(labels, predicted, list(classes), out / "predictions.png")
            roc, pr = plots.curves(labels, outputs, list(classes))
            plots.write_csv(roc, out / "roc.csv")
            plots.write_csv(pr, out / "pr.csv")
            plots.roc_pr_curves(labels, outputs, list(classes), out / "roc_pr.png")
            table = per_class(labels, predicted, list(classes))
    plots.write_csv(table, paths.per_class)  # the header only for regression (DVC wants every output to exist)
    write_json(paths.metrics, metrics)
    return metrics
