"""The paired promotion gate (trainflow.gate, issue 27): the bootstrap equals a hand-written one computed with
sklearn's metrics, McNemar's p-value is scipy's exact binomial test, and the rule promotes on evidence, not on a
difference of a prediction or two."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binomtest
from sklearn.metrics import accuracy_score, f1_score, log_loss, mean_absolute_error, mean_squared_error, r2_score

from trainflow import gate
from trainflow.gate import Scored, compare, decide, mcnemar


def classifier(labels: np.ndarray, right: np.ndarray, seed: int, classes: int = 3) -> Scored:
    """Probabilities that put the most mass on the true class where `right`, else on the next class."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(classes), size=len(labels)) * 0.5
    top = np.where(right, labels, (labels + 1) % classes)
    p[np.arange(len(labels)), top] += 0.5
    return Scored(labels, p / p.sum(axis=1, keepdims=True))


def sklearn_metric(metric: str, y: np.ndarray, out: np.ndarray) -> float:
    if metric == "accuracy":
        return float(accuracy_score(y, out.argmax(axis=1)))
    if metric == "log_loss":
        return float(log_loss(y, out, labels=list(range(out.shape[1]))))
    if metric == "f1_macro":
        return float(f1_score(y, out.argmax(axis=1), average="macro"))
    if metric == "mae":
        return float(mean_absolute_error(y, out))
    if metric == "rmse":
        return float(np.sqrt(mean_squared_error(y, out)))
    return float(r2_score(y, out))


def reference(metric: str, new: Scored, old: Scored, confidence: float, seed: int, resamples: int) -> tuple[float, ...]:
    """The bootstrap written out: one resample at a time, the metric from sklearn, the improvement's quantiles."""
    rng = np.random.default_rng(seed)
    n, sign = len(new.labels), -1.0 if metric in ("log_loss", "mae", "rmse") else 1.0
    diffs = []
    for _ in range(resamples):
        i = rng.integers(0, n, size=n)
        diffs.append(sign * (sklearn_metric(metric, new.labels[i], new.outputs[i])
                             - sklearn_metric(metric, old.labels[i], old.outputs[i])))  # fmt: skip
    d = np.array(diffs)
    return float(np.quantile(d, 1 - confidence)), float(np.quantile(d, confidence))


# f1_macro's reference recomputes sklearn's f1 per resample (about 10 s a case): in the slow tier, for README line 2's
# 10 minutes
@pytest.mark.parametrize(
    "metric", ["accuracy", "log_loss", pytest.param("f1_macro", marks=pytest.mark.slow), "mae", "rmse", "r2"]
)
@pytest.mark.parametrize("chunked", [False, True])
def test_the_bootstrap_is_the_hand_written_one(metric: str, chunked: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    n = 120
    if metric in ("mae", "rmse", "r2"):
        y = rng.normal(0, 2, n)
        new, old = Scored(y, y + rng.normal(0, 0.8, n)), Scored(y, y + rng.normal(0.2, 1.0, n))
    else:
        y = rng.integers(0, 3, n)
        new, old = classifier(y, rng.random(n) < 0.85, 1), classifier(y, rng.random(n) < 0.75, 2)
    if chunked:  # resamples drawn a few at a time: the same random stream, so the same resamples
        monkeypatch.setattr(gate, "CHUNK_CELLS", 7 * n)
    got = compare(metric, new, old, confidence=0.9, seed=11, resamples=300)
    low, high = reference(metric, new, old, 0.9, 11, 300)
    assert got.low == pytest.approx(low, rel=1e-9, abs=1e-12)
    assert got.high == pytest.approx(high, rel=1e-9, abs=1e-12)
    sign = -1 if metric in ("log_loss", "mae", "rmse") else 1
    expected = sign * (sklearn_metric(metric, y, new.outputs) - sklearn_metric(metric, y, old.outputs))
    assert got.improvement == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert got.challenger == pytest.approx(sklearn_metric(metric, y, new.outputs), rel=1e-9)
    assert got.rows == n and got.resamples == 300 and (got.mcnemar is not None) == (metric == "accuracy")


@pytest.mark.parametrize(("only_new", "only_old"), [(0, 0), (7, 2), (2, 7), (15, 15), (30, 12), (1, 0)])
def test_mcnemar_is_the_exact_binomial_test(only_new: int, only_old: int) -> None:
    n = 200
    y = np.zeros(n, dtype=np.int64)
    both = n - only_new - only_old - 20  # 20 rows both get wrong
    right_new = np.array([True] * both + [True] * only_new + [False] * only_old + [False] * 20)
    right_old = np.array([True] * both + [False] * only_new + [True] * only_old + [False] * 20)
    got = mcnemar(classifier(y, right_new, 1, 2), classifier(y, right_old, 2, 2))
    assert (got["challenger_only"], got["champion_only"]) == (only_new, only_old)
    n = only_new + only_old
    for key, alternative in (("p_value", "two-sided"), ("p_better", "greater"), ("p_worse", "less")):
        expected = binomtest(only_new, n, 0.5, alternative=alternative).pvalue if n else 1.0
        assert got[key] == pytest.approx(expected, rel=1e-12), key


def test_a_few_rows_all_one_way_are_not_evidence_for_mcnemar_though_the_bootstrap_bound_is_above_0() -> None:
    """bench/gate.py found this pair: 3 rows better, none worse, of 269. 95% of resamples hold one of the 3, so the
    bootstrap's lower bound is above 0; McNemar's one-sided p is 1/8, and the champion stays. 10 of 10 is evidence."""
    few = compare("accuracy", *pair(269, 3), confidence=0.95, seed=42)
    assert few.low > 0 and few.mcnemar is not None and few.mcnemar["p_better"] == 0.125
    promoted, why = decide(few, "better", 0.0)
    assert not promoted and "McNemar's one-sided p 0.125" in why
    many = compare("accuracy", *pair(269, 10), confidence=0.95, seed=42)
    assert decide(many, "better", 0.0)[0]
    # the same rows under not_worse, the other way round: 3 rows worse is not shown worse
    assert decide(compare("accuracy", *pair(269, -3), confidence=0.95, seed=42), "not_worse", 0.0)[0]


def pair(n: int, extra_right: int, base: float = 0.8, seed: int = 0) -> tuple[Scored, Scored]:
    """Champion right on `base` of n rows; the challenger right on the same rows plus `extra_right` more (fewer when
    negative)."""
    y = np.random.default_rng(seed).integers(0, 3, n)
    right_old = np.arange(n) < int(base * n)
    right_new = np.arange(n) < int(base * n) + extra_right
    return classifier(y, right_new, 1), classifier(y, right_old, 2)


def test_one_more_right_prediction_is_not_evidence_but_many_are() -> None:
    noise = compare("accuracy", *pair(300, 1), confidence=0.95, seed=0)
    assert noise.improvement == pytest.approx(1 / 300)
    promoted, why = decide(noise, "better", 0.0)
    assert not promoted and "not shown better" in why  # the point rule would have promoted it
    real = compare("accuracy", *pair(300, 30), confidence=0.95, seed=0)
    assert decide(real, "better", 0.0)[0]
    # a margin the evidence does not clear: the lower bound (about 0.1 - 1.645 * sqrt(30) / 300 = 0.07) is below it
    assert 0.05 < real.low < 0.1 and not decide(real, "better", 0.08)[0]


def test_not_worse_promotes_unless_shown_worse() -> None:
    same = compare("accuracy", *pair(300, 0), confidence=0.95, seed=0)
    assert same.low == same.high == 0.0  # identical predictions: every resample's difference is 0
    assert not decide(same, "better", 0.0)[0] and decide(same, "not_worse", 0.0)[0]
    slightly = compare("accuracy", *pair(300, -2), confidence=0.95, seed=0)
    assert decide(slightly, "not_worse", 0.0)[0]  # two rows worse is within noise
    worse = compare("accuracy", *pair(300, -30), confidence=0.95, seed=0)
    promoted, why = decide(worse, "not_worse", 0.0)
    assert not promoted and ": worse by more than 0 with 95% confidence" in why
    assert decide(worse, "not_worse", 0.2)[0]  # ... unless the tolerance covers it


def test_lower_is_better_metrics_count_a_drop_as_an_improvement() -> None:
    y = np.random.default_rng(0).normal(0, 1, 400)
    good, bad = Scored(y, y + 0.1), Scored(y, y + 1.0)
    for metric in ("mae", "rmse"):
        c = compare(metric, good, bad, confidence=0.95, seed=0)
        assert c.improvement > 0 and c.low > 0 and decide(c, "better", 0.0)[0]
        assert compare(metric, bad, good, confidence=0.95, seed=0).high < 0


def test_the_same_seed_decides_the_same_and_rows_must_match() -> None:
    new, old = pair(200, 6)
    a, b = (compare("log_loss", new, old, 0.95, seed=3) for _ in range(2))
    assert a == b and compare("log_loss", new, old, 0.95, seed=4).low != a.low  # the seed is what draws the rows
    shifted = Scored(old.labels[::-1].copy(), old.outputs)
    with pytest.raises(ValueError, match="label the test rows differently"):
        compare("accuracy", new, shifted, 0.95, seed=3)
    assert math.isfinite(a.low)
