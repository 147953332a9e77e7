"""The baselines beside the network's test metrics: each number is scikit-learn's own model fitted here, scored with
sklearn.metrics here; the flat metrics.json keys split back into the network's and the baselines'; the one line the
card and the run summary show."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.metrics import accuracy_score, f1_score, log_loss, mean_absolute_error, mean_squared_error, r2_score

from trainflow import baselines
from trainflow.metrics import classification_metrics, regression_metrics


def table(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 5)).astype(np.float32)  # as Preprocessor.features makes it


def f64(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64)  # the baselines fit in float64 (float32 probabilities do not sum to 1 closely enough)


def test_classification_baselines_are_sklearns_fits_scored_over_every_class() -> None:
    """Four classes, class 1 absent from the train rows: its probability is 0 in both baselines' outputs, and the
    others' stay in their columns, so log_loss runs over the four classes the network scores."""
    x, x_test = table(120, 0), table(40, 1)
    y = np.where(x[:, 1] > 0.8, 3, np.where(x[:, 0] > 0, 2, 0))  # classes 0, 2, 3 (1 never in train)
    y_test = np.array([0, 1, 2, 3] * 10)
    got = baselines.fit_and_score("classification", x, y, x_test, y_test, 4, classification_metrics)
    expected = {}
    for name, model in (("linear", LogisticRegression(max_iter=1000)),
                        ("boosting", HistGradientBoostingClassifier(random_state=0))):  # fmt: skip
        model.fit(f64(x), y)
        proba = np.zeros((40, 4))
        proba[:, [0, 2, 3]] = model.predict_proba(f64(x_test))
        predicted = proba.argmax(axis=1)
        expected |= {
            f"baseline_{name}.accuracy": accuracy_score(y_test, predicted),
            f"baseline_{name}.f1_macro": f1_score(y_test, predicted, average="macro", zero_division=0),
            f"baseline_{name}.log_loss": log_loss(y_test, proba, labels=[0, 1, 2, 3]),
        }
    assert got == pytest.approx(expected, rel=1e-9)
    assert list(got) == list(expected)  # the keys, in metrics.json's order
    assert baselines.fit_and_score("classification", x, np.zeros(120, dtype=np.int64), x_test, y_test, 4,
                                   classification_metrics) == {}  # fmt: skip  # one class: nothing to fit


def test_regression_baselines_are_ridge_and_gradient_boosting_fitted_here() -> None:
    x, x_test = table(200, 2), table(50, 3)
    w = np.array([1.0, -2.0, 0.5, 0.0, 3.0])
    y, y_test = (x @ w + 100).astype(np.float32), (x_test @ w + 100).astype(np.float32)
    got = baselines.fit_and_score("regression", x, y, x_test, y_test, 0, regression_metrics)
    expected = {}
    for name, model in (("linear", Ridge()), ("boosting", HistGradientBoostingRegressor(random_state=0))):
        predicted = model.fit(f64(x), y).predict(f64(x_test))
        expected |= {
            f"baseline_{name}.r2": r2_score(y_test, predicted),
            f"baseline_{name}.rmse": np.sqrt(mean_squared_error(y_test, predicted)),
            f"baseline_{name}.mae": mean_absolute_error(y_test, predicted),
        }
    assert got == pytest.approx(expected, rel=1e-9)
    assert got["baseline_linear.r2"] > 0.99  # a linear target: ridge fits it


def test_a_big_table_is_fitted_on_a_seeded_sample_in_row_order(monkeypatch: pytest.MonkeyPatch) -> None:
    assert baselines.sample(5).tolist() == [0, 1, 2, 3, 4]
    monkeypatch.setattr(baselines, "SAMPLE_ROWS", 4)
    rows = baselines.sample(10)
    assert rows.tolist() == sorted(np.random.default_rng(0).choice(10, 4, replace=False).tolist())
    assert rows.tolist() == baselines.sample(10).tolist()  # the same rows every run


def test_the_flat_keys_split_back_and_one_line_shows_the_network_beside_the_baselines() -> None:
    metrics = {"accuracy": 0.9, "log_loss": 0.3, "n_test": 40, "baseline_linear.accuracy": 0.85,
               "baseline_linear.log_loss": 0.4, "baseline_boosting.accuracy": 0.95,
               "baseline_boosting.log_loss": 0.2}  # fmt: skip
    own, fitted = baselines.split_metrics(metrics)
    assert own == {"accuracy": 0.9, "log_loss": 0.3, "n_test": 40}
    assert fitted == {"linear": {"accuracy": 0.85, "log_loss": 0.4}, "boosting": {"accuracy": 0.95, "log_loss": 0.2}}
    assert baselines.versus(metrics) == "accuracy 0.9 (logistic regression 0.85, gradient boosting 0.95)"
    assert baselines.versus(metrics, "log_loss") == "log_loss 0.3 (logistic regression 0.4, gradient boosting 0.2)"
    assert baselines.versus(metrics, "ece") == baselines.versus(metrics)  # no baseline for it: the task's headline
    regression = {"r2": 0.84, "rmse": 1.5, "baseline_linear.r2": 0.98, "baseline_boosting.r2": 0.95}
    assert baselines.versus(regression) == "r2 0.84 (ridge 0.98, gradient boosting 0.95)"
    assert baselines.versus({"r2": 0.84, "n_test": 5}) is None  # text, images, streamed: none fitted
