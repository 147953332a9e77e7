"""ROC AUC, average precision, expected calibration error and the per-class table, on the test split (numpy/sklearn,
stages/evaluate.py) and on the val split (torch on the device, engine/objective.py and engine/ranking.py), against
sklearn and a hand-written reference, for a binary and a multiclass case; classes missing from the labels are skipped.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import average_precision_score, precision_recall_fscore_support, roc_auc_score
from sklearn.preprocessing import label_binarize

from trainflow import plots
from trainflow.engine.objective import CALIBRATION, Objective, calibration_sums
from trainflow.engine.ranking import roc_pr_auc
from trainflow.metrics import classification_metrics, expected_calibration_error, per_class


def reference_ece(labels: np.ndarray, proba: np.ndarray, bins: int = 15) -> float:
    """The textbook definition, one bin at a time: sum_b |B_b| / n * |acc(B_b) - conf(B_b)|, B_b = (lo, hi]."""
    confidence, predicted = proba.max(axis=1), proba.argmax(axis=1)
    total = 0.0
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        members = [i for i, c in enumerate(confidence) if lo < c <= hi or (b == 0 and c == 0)]
        if members:
            accuracy = np.mean([predicted[i] == labels[i] for i in members])
            mean_confidence = np.mean([confidence[i] for i in members])
            total += len(members) / len(labels) * abs(accuracy - mean_confidence)
    return total


def case(k: int, n: int = 300, seed: int = 0) -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
    """(labels, probabilities in float64, the logits): an informative model, with tied scores (rounded logits)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, n)
    logits = torch.tensor((rng.normal(size=(n, k)) + 1.5 * np.eye(k)[labels]).round(1), dtype=torch.float32)
    return labels, logits.softmax(-1).double().numpy(), logits


def sklearn_ranked(labels: np.ndarray, proba: np.ndarray) -> tuple[float, float]:
    k = proba.shape[1]
    if k == 2:
        return roc_auc_score(labels == 1, proba[:, 1]), average_precision_score(labels == 1, proba[:, 1])
    onehot = label_binarize(labels, classes=range(k))
    return (
        roc_auc_score(labels, proba, multi_class="ovr", average="macro"),
        average_precision_score(onehot, proba, average="macro"),
    )


@pytest.mark.parametrize("k", [2, 4])
def test_test_split_metrics_match_sklearn_and_the_reference(k: int) -> None:
    labels, proba, _ = case(k)
    metrics = classification_metrics(labels, proba)
    roc_auc, pr_auc = sklearn_ranked(labels, proba)
    assert metrics["roc_auc"] == pytest.approx(roc_auc, abs=1e-12)
    assert metrics["pr_auc"] == pytest.approx(pr_auc, abs=1e-12)
    assert metrics["ece"] == pytest.approx(reference_ece(labels, proba), abs=1e-12)
    assert 0.6 < metrics["roc_auc"] < 1 and 0 < metrics["ece"] < 1  # a case that is neither trivial nor perfect


def test_binary_scores_the_positive_class() -> None:
    """Class index 1 is the positive one: swapping the columns mirrors the ROC AUC, and changes AP."""
    labels, proba, _ = case(2)
    proba = np.stack([1 - proba[:, 1], proba[:, 1]], axis=1)  # exact complements: the same ties either way
    swapped = classification_metrics(1 - labels, proba[:, ::-1].copy())
    assert classification_metrics(labels, proba)["roc_auc"] == pytest.approx(swapped["roc_auc"])
    assert swapped["pr_auc"] == pytest.approx(average_precision_score(labels == 0, proba[:, 0]))


def test_ece_by_hand() -> None:
    # Confidences 0.9, 0.9 (bin (0.867, 0.933]: one right, one wrong -> |0.5 - 0.9| * 2/4) and 0.6, 0.6 (bin
    # (0.533, 0.6]: both right -> |1 - 0.6| * 2/4): ECE = 0.2 + 0.2.
    proba = np.array([[0.9, 0.1], [0.9, 0.1], [0.4, 0.6], [0.4, 0.6]])
    labels = np.array([0, 1, 1, 1])
    assert expected_calibration_error(labels, proba) == pytest.approx(0.4)
    assert reference_ece(labels, proba) == pytest.approx(0.4)


def test_a_class_missing_from_the_test_labels_is_skipped() -> None:
    """sklearn's macro average is NaN (older versions raise); ours is over the classes that occur (3 has no row)."""
    labels, proba, _ = case(4)
    present = labels != 3
    labels, proba = labels[present], proba[present]
    metrics = classification_metrics(labels, proba)
    assert metrics["roc_auc"] == pytest.approx(np.mean([roc_auc_score(labels == c, proba[:, c]) for c in range(3)]))
    assert metrics["pr_auc"] == pytest.approx(
        np.mean([average_precision_score(labels == c, proba[:, c]) for c in range(3)])
    )
    one_class = classification_metrics(np.zeros(5, dtype=int), proba[:5])  # nothing to rank against: NaN, no crash
    assert np.isnan(one_class["roc_auc"]) and one_class["pr_auc"] == pytest.approx(1.0)


@pytest.mark.parametrize("k", [2, 4])
def test_validation_metrics_on_the_device_match_sklearn(k: int) -> None:
    labels, proba, logits = case(k)
    objective = Objective("classification")
    target = torch.tensor(labels)
    got = roc_pr_auc(objective.scores(logits), target).tolist()
    assert got == pytest.approx(sklearn_ranked(labels, proba), abs=1e-12)
    # The sums of two batches give the ECE of the whole set.
    parts = [objective.eval_sums(logits[s], target[s], len(target[s])) for s in (slice(0, 100), slice(100, None))]
    flat = [torch.cat([torch.as_tensor(v, dtype=torch.float64).reshape(-1) for v in p]) for p in parts]
    sums = dict(zip(objective.sum_names, (flat[0] + flat[1]).tolist()))
    metrics = objective.metrics(sums)
    assert metrics["val_ece"] == pytest.approx(reference_ece(labels, proba), abs=1e-6)
    assert metrics["val_accuracy"] == pytest.approx(np.mean(proba.argmax(1) == labels))
    assert "val_roc_auc" not in metrics  # gathered by the trainer, only when monitored
    assert objective.metrics({**sums, "roc_auc": got[0], "pr_auc": got[1]})["val_roc_auc"] == got[0]


def test_validation_skips_missing_classes_and_ignored_tokens() -> None:
    labels, proba, logits = case(4)
    present = labels != 3
    got = roc_pr_auc(torch.tensor(proba[present]), torch.tensor(labels[present])).tolist()
    want = [
        np.mean([f(labels[present] == c, proba[present][:, c]) for c in range(3)])
        for f in (roc_auc_score, average_precision_score)
    ]
    assert got == pytest.approx(want, abs=1e-12)
    assert np.isnan(roc_pr_auc(torch.tensor(proba[:5]), torch.zeros(5, dtype=torch.long))[0].item())
    # Per token: IGNORE_INDEX positions count in no bin.
    objective = Objective("classification")
    target = torch.tensor(labels).reshape(30, 10)
    target[:, 7:] = -100
    out = logits.reshape(30, 10, 4)
    parts = [torch.as_tensor(v, dtype=torch.float64).reshape(-1) for v in objective.eval_sums(out, target, 210)]
    sums = dict(zip(objective.sum_names, torch.cat(parts).tolist()))
    keep = (target != -100).reshape(-1).numpy()
    assert objective.metrics(sums)["val_ece"] == pytest.approx(reference_ece(labels[keep], proba[keep]), abs=1e-6)


def test_per_class_table_matches_sklearn() -> None:
    labels = np.array([0, 0, 1, 1, 1, 2])
    predicted = np.array([0, 1, 1, 1, 2, 2])
    table = per_class(labels, predicted, ["a", "b", "c", "d"])  # d: known to the model, absent from the test split
    precision, recall, f1, support = precision_recall_fscore_support(
        labels, predicted, labels=[0, 1, 2, 3], zero_division=0
    )
    expected = pd.DataFrame(
        {"class": ["a", "b", "c", "d"], "precision": precision, "recall": recall, "f1": f1, "support": support}
    )
    pd.testing.assert_frame_equal(table, expected)
    assert table["precision"].tolist() == pytest.approx([1, 2 / 3, 1 / 2, 0])  # by hand, too
    assert table["support"].tolist() == [2, 3, 1, 0]


def test_curves_binary_one_multiclass_the_most_frequent(tmp_path: Path) -> None:
    labels, proba, _ = case(2)
    roc, pr = plots.curves(labels, proba, ["no", "yes"])
    assert set(roc["class"]) == set(pr["class"]) == {"yes"}
    assert np.trapezoid(roc["tpr"], roc["fpr"]) == pytest.approx(roc_auc_score(labels == 1, proba[:, 1]))
    k = 14
    rng = np.random.default_rng(1)
    labels = np.minimum(rng.zipf(1.5, 2000) - 1, k - 2)  # class k - 1 never occurs
    proba = rng.dirichlet(np.ones(k), 2000)
    roc, pr = plots.curves(labels, proba, [f"c{i}" for i in range(k)])
    support = np.bincount(labels, minlength=k)
    assert list(roc["class"].unique()) == [f"c{i}" for i in np.argsort(-support, kind="stable")[:10]]
    assert len(pr) <= 10 * plots.MAX_POINTS  # thinned
    png = tmp_path / "roc_pr.png"
    plots.roc_pr_curves(labels, proba, [f"c{i}" for i in range(k)], png)
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_monitor_and_gate_directions() -> None:
    from trainflow.params import RegisterParams, TrainParams
    from trainflow.registry.registry import MINIMIZE

    assert TrainParams(monitor="val_ece").minimize and not TrainParams(monitor="val_roc_auc").minimize
    assert not TrainParams(monitor="val_pr_auc").minimize and not TrainParams(monitor="val_ece", mode="max").minimize
    assert {RegisterParams(gate_metric=m).gate_metric for m in ("roc_auc", "pr_auc", "ece")} & MINIMIZE == {"ece"}


def test_ece_bins_are_open_below_closed_above() -> None:
    """A confidence on an edge (0.6 = 9/15) belongs to the bin below it: (8/15, 9/15], not [9/15, 10/15).
    Bins: 0.9, 0.9 (one right) -> |1 - 1.8|; 0.6 (right) -> |1 - 0.6|; 0.62 (wrong) -> |0 - 0.62|. Sum / 4."""
    proba = np.array([[0.9, 0.1], [0.9, 0.1], [0.4, 0.6], [0.38, 0.62]])
    labels = np.array([0, 1, 1, 0])
    assert expected_calibration_error(labels, proba) == pytest.approx((0.8 + 0.4 + 0.62) / 4)
    assert reference_ece(labels, proba) == pytest.approx((0.8 + 0.4 + 0.62) / 4)
    objective = Objective("classification")
    confidence = torch.tensor(proba.max(axis=1))
    correct = torch.tensor(proba.argmax(axis=1) == labels)
    sums = dict(zip(CALIBRATION, calibration_sums(confidence, correct, torch.ones(4, dtype=torch.bool)).tolist()))
    assert objective.metrics({"loss": 0.0, "count": 4.0, "correct": 2.0, **sums})["val_ece"] == pytest.approx(0.455)


def test_ece_keeps_the_lowest_confidences_in_the_first_bin() -> None:
    """20 classes: a top probability can be as low as 1/20, in the first bin (0, 1/15]. A right guess at 0.05 (bin 0)
    and a wrong one at 0.1 (bin 1) are two bins, (|1 - 0.05| + |0 - 0.1|) / 2, in training's val_ece as in
    evaluate's; a confidence of 0 is the first bin's too."""
    proba = np.full((2, 20), 0.9 / 19)
    proba[0] = 0.05
    proba[1, 1] = 0.1
    labels = np.array([0, 0])
    expected = (0.95 + 0.1) / 2
    assert reference_ece(labels, proba) == pytest.approx(expected)
    assert expected_calibration_error(labels, proba) == pytest.approx(expected)
    labelled = torch.ones(2, dtype=torch.bool)
    got = calibration_sums(torch.tensor([0.05, 0.1]), torch.tensor([True, False]), labelled)
    sums = dict(zip(CALIBRATION, got.tolist()))
    assert (sums["bin0_count"], sums["bin1_count"]) == (1.0, 1.0)
    val = Objective("classification").metrics({"loss": 0.0, "count": 2.0, "correct": 1.0, **sums})
    assert val["val_ece"] == pytest.approx(expected)
    zero = dict(zip(CALIBRATION, calibration_sums(torch.tensor([0.0]), torch.tensor([False]), labelled[:1]).tolist()))
    assert zero["bin0_count"] == 1.0 and sum(zero[f"bin{b}_count"] for b in range(15)) == 1.0
