"""Test and validation metrics against values computed by hand on small cases (never by the code under test)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trainflow.engine.objective import Objective
from trainflow.metrics import classification_metrics, regression_metrics


def onehot(predicted: list[int], k: int) -> np.ndarray:
    return np.eye(k)[predicted] * 0.98 + 0.02 / k  # confident, rows sum to 1


def test_a_perfect_model_scores_f1_one_when_a_class_is_missing_from_the_test_split() -> None:
    labels = np.array([0, 0, 1, 1])  # class 2 exists (the model knows it) but has no test row
    metrics = classification_metrics(labels, onehot([0, 0, 1, 1], 3))
    assert metrics["accuracy"] == 1.0
    assert metrics["f1_macro"] == 1.0


def test_macro_f1_by_hand() -> None:
    # class 0: 2 true, 1 predicted right -> P 1, R 1/2, F1 2/3; class 1: perfect -> 1; class 2: predicted once,
    # never true -> P 0, F1 0. Macro: (2/3 + 1 + 0) / 3 = 5/9. (A micro average would be the accuracy, 2/3.)
    metrics = classification_metrics(np.array([0, 0, 1]), onehot([0, 2, 1], 3))
    assert metrics["f1_macro"] == pytest.approx(5 / 9)
    assert metrics["accuracy"] == pytest.approx(2 / 3)


def test_log_loss_by_hand() -> None:
    proba = np.array([[0.8, 0.1, 0.1], [0.25, 0.5, 0.25]])
    metrics = classification_metrics(np.array([0, 2]), proba)
    assert metrics["log_loss"] == pytest.approx(-(math.log(0.8) + math.log(0.25)) / 2)


def test_regression_metrics_by_hand() -> None:
    y, predicted = np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.0, 2.0, 3.0, 5.0])
    # SSE 1; SST around the mean 2.5 is 2.25 + 0.25 + 0.25 + 2.25 = 5 (uncentred it would be 30: R² 0.967).
    assert regression_metrics(y, predicted) == pytest.approx({"r2": 0.8, "rmse": 0.5, "mae": 0.25})


def test_validation_metrics_by_hand_in_the_targets_units() -> None:
    """The engine sees standardised targets; what it reports is in target units: y = 100 + 10 * z."""
    objective = Objective("regression", target_scale=10.0)
    z = torch.tensor([-1.0, 0.0, 1.0, 2.0])  # targets 90, 100, 110, 120
    out = torch.tensor([-1.0, 0.0, 1.0, 1.5])  # predictions 90, 100, 110, 115: one error of 5
    sums = dict(zip(objective.sum_names, [float(v) for v in objective.eval_sums(out, z, 4)]))
    metrics = objective.metrics(sums)
    # MSE in target units: 25 / 4; RMSE 2.5; R² = 1 - 25 / SST, SST around 105: 225 + 25 + 25 + 225 = 500.
    assert metrics == pytest.approx({"val_loss": 6.25, "val_rmse": 2.5, "val_r2": 0.95})


def test_validation_accuracy_and_loss_by_hand() -> None:
    objective = Objective("classification")
    logits = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0]])
    target = torch.tensor([0, 1, 1])
    parts = [torch.as_tensor(v, dtype=torch.float64).reshape(-1) for v in objective.eval_sums(logits, target, 3)]
    metrics = objective.metrics(dict(zip(objective.sum_names, torch.cat(parts).tolist())))
    right, wrong = math.log(1 + math.exp(-2)), math.log(1 + math.exp(2))
    # Every prediction has confidence 1 / (1 + e^-2) = 0.881 (one bin): 2 of 3 right, ECE |2/3 - 0.881|.
    confidence = 1 / (1 + math.exp(-2))
    assert metrics == pytest.approx(
        {"val_loss": (2 * right + wrong) / 3, "val_accuracy": 2 / 3, "val_ece": abs(2 / 3 - confidence)}
    )
