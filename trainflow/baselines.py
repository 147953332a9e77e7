"""Simple scikit-learn models beside the network's test metrics: does the network earn its keep?

Two baselines are fitted on the train split and scored on the test rows the network is scored on: `linear` (ridge for
regression, logistic regression for classification) and `boosting` (HistGradientBoosting). They read the feature
matrix the network reads (`Preprocessor.features`: fitted on the train split, numbers standardised and imputed,
categories one-hot, missing indicators), so a difference is the model's, not the preprocessing's, and the linear
models' penalty weighs every standardised feature alike.

metrics.json holds them as flat keys, `baseline_<name>.<metric>` (DVC reads them as metrics; the registry tags them
`metric.baseline_<name>.<metric>`), for the metrics the promotion gate can decide on. What reads metrics.json for the
network's own metrics splits them off with `split_metrics`.

Cost: at most SAMPLE_ROWS train rows (a seeded sample of a bigger table) and one thread, so the numbers are the same on
any machine (gradient boosting's parallel sums depend on the number of threads) and `dvc repro` stays a no-op. Text
and image models (hf: ones take text) and tables streamed from disk get none: evaluate says so in one line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

PREFIX = "baseline_"
NAMES = ("linear", "boosting")
# The metrics the promotion gate can decide on (register.gate_metric): the baselines' are kept for these alone.
METRICS = {"classification": ("accuracy", "f1_macro", "log_loss"), "regression": ("r2", "rmse", "mae")}
SAMPLE_ROWS = 20_000  # train rows the baselines fit on, at most: a seeded sample of a bigger table
SEED = 0  # the sample's and gradient boosting's random_state: fixed, so a rerun writes the same numbers
MAX_ITER = 1000  # logistic regression's lbfgs iterations: sklearn's 100 leave many tables unconverged


def label(name: str, task: str) -> str:
    """How people call a baseline: ridge or logistic regression, gradient boosting."""
    if name == "linear":
        return "ridge" if task == "regression" else "logistic regression"
    return "gradient boosting"


def key(name: str, metric: str) -> str:
    return f"{PREFIX}{name}.{metric}"


def split_metrics(metrics: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
    """(the network's own metrics, {baseline name: {metric: value}}) from metrics.json's flat keys."""
    own: dict[str, Any] = {}
    baselines: dict[str, dict[str, float]] = {}
    for k, v in metrics.items():
        name, dot, metric = k.removeprefix(PREFIX).partition(".")
        if k.startswith(PREFIX) and dot:
            baselines.setdefault(name, {})[metric] = float(v)
        else:
            own[k] = v
    return own, baselines


def versus(metrics: dict[str, Any], metric: str | None = None) -> str | None:
    """One line, the network's test metric beside the baselines': "r2 0.8412 (ridge 0.9803, gradient boosting
    0.9521)". `metric`: the one to show (the gate's), else accuracy or r2. None without baselines for it."""
    own, fitted = split_metrics(metrics)
    if metric is None or not all(metric in m for m in fitted.values()):
        metric = "accuracy" if "accuracy" in own else "r2"
    if metric not in own or not fitted or not all(metric in m for m in fitted.values()):
        return None
    task = "classification" if metric in METRICS["classification"] else "regression"
    shown = ", ".join(f"{label(name, task)} {fitted[name][metric]:.4g}" for name in NAMES if name in fitted)
    return f"{metric} {float(own[metric]):.4g} ({shown})"


def sample(n: int) -> np.ndarray:
    """The train rows the baselines fit on: all of them, or SAMPLE_ROWS drawn with SEED, in order."""
    if n <= SAMPLE_ROWS:
        return np.arange(n)
    return np.sort(np.random.default_rng(SEED).choice(n, SAMPLE_ROWS, replace=False))


def fit_and_score(
    task: str,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    n_classes: int,
    score: Callable[[np.ndarray, np.ndarray], dict[str, float]],
) -> dict[str, float]:
    """Both baselines fitted on (x_train, y_train), in float64, and scored on the test rows with `score` (evaluate's
    own metric functions: labels, outputs -> metrics), as metrics.json keys. Classification outputs are probabilities
    over all `n_classes` (a class the fitted rows lack gets 0). Empty when the train rows hold a single class
    (logistic regression cannot fit one)."""
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
    from sklearn.linear_model import LogisticRegression, Ridge
    from threadpoolctl import threadpool_limits

    regression = task == "regression"
    if not regression and len(np.unique(y_train)) < 2:
        return {}
    # float64: sklearn fits float32 in float32, whose probabilities miss summing to 1 by more than log_loss allows
    x_train, x_test = x_train.astype(np.float64), x_test.astype(np.float64)
    models: dict[str, Any] = {"linear": Ridge(), "boosting": HistGradientBoostingRegressor(random_state=SEED)}
    if not regression:
        models = {"linear": LogisticRegression(max_iter=MAX_ITER),
                  "boosting": HistGradientBoostingClassifier(random_state=SEED)}  # fmt: skip
    out: dict[str, float] = {}
    with threadpool_limits(limits=1):  # BLAS and OpenMP: the same sums in the same order on any machine
        for name, model in models.items():
            model.fit(x_train, y_train)
            if regression:
                outputs = model.predict(x_test).astype(np.float64)
            else:
                outputs = np.zeros((len(x_test), n_classes))
                outputs[:, model.classes_] = model.predict_proba(x_test)
            metrics = score(y_test, outputs)
            out |= {key(name, m): float(metrics[m]) for m in METRICS[task]}
    return out
