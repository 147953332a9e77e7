"""evaluate: score the exported model on the test split; write metrics.json, per_class.csv and the test plots."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pandas as pd

from trainflow import baselines, plots
from trainflow.data import stream
from trainflow.errors import UserError
from trainflow.io import atomic_dir, write_json
from trainflow.params import DataParams, PipelineParams
from trainflow.paths import Paths
from trainflow.predict import ExportedModel

ECE_BINS = 15  # as val_ece (trainflow/engine/objective.py): equal-width bins of the top-class confidence


def classification_metrics(labels: np.ndarray, proba: np.ndarray) -> dict[str, float]:
    from sklearn.metrics import accuracy_score, f1_score, log_loss

    predicted = proba.argmax(axis=1)
    # Macro F1 averages over the classes that occur in the labels or the predictions: a class absent from both (a
    # rare class that missed this test split) has no F1 to speak of, and counting it as 0 would punish a perfect model.
    return {
        "accuracy": float(accuracy_score(labels, predicted)),
        "f1_macro": float(f1_score(labels, predicted, average="macro", zero_division=0)),
        "log_loss": float(log_loss(labels, proba.astype(np.float64), labels=range(proba.shape[1]))),
        **ranked_metrics(labels, proba),
        "ece": expected_calibration_error(labels, proba),
    }


def ranked_metrics(labels: np.ndarray, proba: np.ndarray) -> dict[str, float]:
    """roc_auc and pr_auc (average precision). Binary: of the positive class (index 1). Multiclass: the macro average
    one-vs-rest over the classes that can be scored (ROC: the class and another one occur in `labels`; AP: the class
    occurs), so a class that missed the test split is skipped, not a crash (sklearn raises) nor a 0 that would punish
    a perfect model. NaN when no class can be scored (a test split of one class)."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    k = proba.shape[1]
    roc, ap = [], []
    for c in [1] if k == 2 else range(k):
        hit, score = labels == c, proba[:, c].astype(np.float64)
        if hit.any():
            ap.append(average_precision_score(hit, score))
            if not hit.all():
                roc.append(roc_auc_score(hit, score))
    return {"roc_auc": float(np.mean(roc)) if roc else np.nan, "pr_auc": float(np.mean(ap)) if ap else np.nan}


def expected_calibration_error(labels: np.ndarray, proba: np.ndarray, bins: int = ECE_BINS) -> float:
    """sum over bins b of |B_b| / n * |accuracy(B_b) - mean confidence(B_b)|, B_b the samples whose top-class
    probability lies in (b / bins, (b + 1) / bins]."""
    confidence = proba.max(axis=1).astype(np.float64)
    correct = (proba.argmax(axis=1) == labels).astype(np.float64)
    edges = np.arange(bins + 1) / bins
    which = np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, bins - 1)
    gaps = np.bincount(which, weights=correct - confidence, minlength=bins)  # per bin: |B| * (accuracy - confidence)
    return float(np.abs(gaps).sum() / max(len(labels), 1))


PER_CLASS_COLUMNS = ["class", "precision", "recall", "f1", "support"]


def per_class(labels: np.ndarray, predicted: np.ndarray, classes: list[str]) -> pd.DataFrame:
    """Precision, recall, F1 and support (test rows) of every class the model knows; 0 where undefined."""
    from sklearn.metrics import precision_recall_fscore_support

    precision, recall, f1, support = precision_recall_fscore_support(
        labels, predicted, labels=range(len(classes)), zero_division=0
    )
    return pd.DataFrame({"class": classes, "precision": precision, "recall": recall, "f1": f1, "support": support})


def regression_metrics(y: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

    return {
        "r2": float(r2_score(y, predicted)),
        "rmse": float(np.sqrt(mean_squared_error(y, predicted))),
        "mae": float(mean_absolute_error(y, predicted)),
    }


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
    split = paths.split("test")
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
    files = [paths.split("train"), paths.split("test")]
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
    test = paths.split("test")
    if not test.exists():
        raise UserError(f"{stage}: {test} is missing; run `trainflow stage split` first")
    return test.read()


def run(params: PipelineParams, paths: Paths) -> dict[str, Any]:
    exported = ExportedModel.load(paths.final)
    metrics, outputs, labels = score_split(exported, paths, "evaluate", params.evaluate.batch_size, params.data)
    metrics |= baseline_metrics(exported, paths, params.data)  # beside the network's: does it earn its keep?
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
