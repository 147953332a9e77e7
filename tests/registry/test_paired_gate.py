"""The paired promotion gate (trainflow.registry.gate): the sign-flip test's p-values and bounds are scipy's exact
permutation test on the per-row differences (inverted at the margin), the swap test's are a hand enumeration with
sklearn's metrics, its vectorised metrics are evaluate's, McNemar's p-value is scipy's exact binomial test, and the
rule promotes on evidence: never on a few rows, never on rows without evidence, never on a worse calibration. Also
pinned on hand-made inputs: the per-row values, hand-picked resamples, McNemar's counts, the comparison's tags, the
slices and every decision line."""

from __future__ import annotations

import itertools
import math
import re
import warnings

import numpy as np
import pytest
from scipy.stats import binomtest, permutation_test
from sklearn.metrics import average_precision_score, f1_score, log_loss, r2_score, roc_auc_score

from trainflow.metrics import classification_metrics
from trainflow.registry import gate
from trainflow.registry.gate import Scored, compare, decide, mcnemar


def classifier(labels: np.ndarray, right: np.ndarray, seed: int, classes: int = 3) -> Scored:
    """Probabilities that put the most mass on the true class where `right`, else on the next class."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(classes), size=len(labels)) * 0.5
    top = np.where(right, labels, (labels + 1) % classes)
    p[np.arange(len(labels)), top] += 0.5
    return Scored(labels, p / p.sum(axis=1, keepdims=True))


def scipy_p(d: np.ndarray, margin: float, alternative: str = "greater") -> float:
    """scipy's exact paired permutation test (every pairing of the n rows swapped or not) of the mean of d - margin."""

    def statistic(x: np.ndarray, y: np.ndarray, axis: int) -> np.ndarray:
        return np.mean(x - y, axis=axis)

    shifted = d - margin
    result = permutation_test(
        (shifted, np.zeros_like(shifted)), statistic, permutation_type="samples", alternative=alternative,
        n_resamples=np.inf, vectorized=True,
    )  # fmt: skip
    return float(result.pvalue)


def regression_pair(n: int, seed: int) -> tuple[Scored, Scored]:
    rng = np.random.default_rng(seed)
    y = rng.normal(0, 2, n)
    return Scored(y, y + rng.normal(0, 0.8, n)), Scored(y, y + rng.normal(0.2, 1.0, n))


def per_row_difference(metric: str, new: Scored, old: Scored) -> np.ndarray:
    """The per-row improvement written out: the champion's loss minus the challenger's (accuracy: the other way)."""
    y = new.labels
    if metric == "accuracy":
        return (new.outputs.argmax(1) == y).astype(float) - (old.outputs.argmax(1) == y).astype(float)
    if metric == "log_loss":
        pick = np.arange(len(y)), y
        return np.log(new.outputs[pick]) - np.log(old.outputs[pick])
    if metric == "mae":
        return np.abs(old.outputs - y) - np.abs(new.outputs - y)
    squared = (old.outputs - y) ** 2 - (new.outputs - y) ** 2
    return squared if metric == "rmse" else squared * len(y) / np.sum((y - y.mean()) ** 2)


@pytest.mark.parametrize("metric", ["accuracy", "log_loss", "mae", "rmse", "r2"])
def test_the_exact_sign_flip_test_is_scipys_permutation_test_inverted_at_the_margin(metric: str) -> None:
    """12 rows: all 4096 sign patterns. p at margin 0 is scipy's; the lower bound is where scipy's test of d - m
    stops rejecting (rmse: the squared errors' drop 2 m r0 - m^2, r0 the champion's rmse), the upper bound where
    the other tail's does."""
    rng = np.random.default_rng(3)
    n = 12
    if metric in ("accuracy", "log_loss"):
        y = rng.integers(0, 3, n)
        new, old = classifier(y, rng.random(n) < 0.9, 1), classifier(y, rng.random(n) < 0.5, 2)
    else:
        new, old = regression_pair(n, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the identity pattern's 0/0 is a NaN by design, not a RuntimeWarning to users
        c = compare(metric, new, old, confidence=0.9, seed=0)
    d = per_row_difference(metric, new, old)
    assert c.resamples == 2**n and "exact, all 4096 patterns of the 12 test rows" in c.test
    assert c.p_better == pytest.approx(scipy_p(d, 0.0), abs=1e-12)
    assert c.p_worse == pytest.approx(scipy_p(d, 0.0, "less"), abs=1e-12)
    champion_rmse = math.sqrt(np.mean((old.outputs - old.labels) ** 2)) if metric == "rmse" else 0.0

    def in_d(margin: float) -> float:  # the margin in d's units
        return 2 * margin * champion_rmse - margin**2 if metric == "rmse" else margin

    assert math.isfinite(c.low) and math.isfinite(c.high)
    for eps in (1e-7, -1e-7):  # either side of each bound: the test's verdict changes there
        assert (scipy_p(d, in_d(c.low - eps)) < 0.1) is (eps > 0), (metric, eps)
        assert (scipy_p(d, in_d(c.high + eps), "less") < 0.1) is (eps > 0), (metric, eps)
    expected = (
        {"accuracy": np.mean(d), "log_loss": log_loss(y, old.outputs) - log_loss(y, new.outputs)}
        if metric in ("accuracy", "log_loss")
        else {"r2": r2_score(new.labels, new.outputs) - r2_score(old.labels, old.outputs)}
    )
    if metric in expected:
        assert c.improvement == pytest.approx(expected[metric], rel=1e-9)


def test_the_monte_carlo_p_value_is_near_the_exact_one_and_does_not_depend_on_the_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """17 rows (more than gate.EXACT_ROWS): 9999 random sign patterns against scipy's exact 131072; the patterns are
    drawn 64 rows a raw draw, so drawing them a few at a time gives the same ones."""
    new, old = regression_pair(17, 7)
    d = per_row_difference("mae", new, old)
    c = compare("mae", new, old, confidence=0.95, seed=5)
    assert c.resamples == gate.RESAMPLES + 1 and "9999 random patterns of the 17 test rows" in c.test
    exact = scipy_p(d, 0.0)
    assert abs(c.p_better - exact) < 4 * math.sqrt(exact * (1 - exact) / gate.RESAMPLES), (c.p_better, exact)
    monkeypatch.setattr(gate, "CHUNK_CELLS", 7 * 17)
    assert compare("mae", new, old, confidence=0.95, seed=5) == c
    assert compare("mae", new, old, confidence=0.95, seed=6).p_better != c.p_better  # the seed draws the patterns


def sklearn_metric(metric: str, y: np.ndarray, p: np.ndarray) -> float:
    """One metric as evaluate defines it, from sklearn's functions (ece: by hand, bin by bin)."""
    if metric == "f1_macro":
        return float(f1_score(y, p.argmax(axis=1), average="macro", zero_division=0))
    if metric == "ece":
        return calibration_error_by_hand(y, p)
    classes = [1] if p.shape[1] == 2 else range(p.shape[1])
    score = roc_auc_score if metric == "roc_auc" else average_precision_score
    return float(np.mean([score(y == c, p[:, c]) for c in classes if 0 < np.sum(y == c) < len(y)]))


@pytest.mark.parametrize(
    ("metric", "classes"), [("f1_macro", 3), ("roc_auc", 2), ("roc_auc", 3), ("pr_auc", 3), ("ece", 2)]
)
def test_the_swap_test_is_every_swap_scored_by_sklearn(metric: str, classes: int) -> None:
    """6 rows: the 64 ways to swap the two models' outputs row by row, each scored by evaluate's (sklearn's)
    metric; the p-values are the share of swaps at least as good, the bounds the observed improvement minus the
    swap distribution's tail."""
    rng = np.random.default_rng(classes)
    n = 6
    y = np.arange(n) % classes
    new, old = (Scored(y, rng.dirichlet(np.ones(classes), size=n)) for _ in range(2))
    sign = -1 if metric == "ece" else 1
    swaps = []
    for pattern in itertools.product([False, True], repeat=n):
        s = np.array(pattern)[:, None]
        a, b = np.where(s, old.outputs, new.outputs), np.where(s, new.outputs, old.outputs)
        swaps.append(sign * (sklearn_metric(metric, y, a) - sklearn_metric(metric, y, b)))
    t = np.array(swaps)
    observed = t[0]
    c = compare(metric, new, old, confidence=0.9, seed=0)
    assert c.improvement == pytest.approx(observed, abs=1e-12) and c.resamples == 64
    assert c.challenger == pytest.approx(sklearn_metric(metric, y, new.outputs), abs=1e-12)
    assert c.p_better == np.mean(t >= observed - 1e-12) and c.p_worse == np.mean(t <= observed + 1e-12)
    k = math.ceil(0.1 * 64) - 1  # the most swaps at least as extreme that a p-value below 0.1 allows
    assert c.low == pytest.approx(observed - np.sort(t)[::-1][k], abs=1e-12)
    assert c.high == pytest.approx(observed - np.sort(t)[k], abs=1e-12)


@pytest.mark.parametrize("classes", [2, 3, 5])
def test_the_vectorised_metrics_are_evaluates(classes: int) -> None:
    """f1_macro and ece per pattern, and roc_auc and pr_auc per swap, on ties, on a class missing from the labels
    and on one no model predicts, equal sklearn's (evaluate's)."""
    rng = np.random.default_rng(classes)
    n = 40
    y = rng.integers(0, classes - 1 if classes > 2 else classes, n)  # the last class is missing from the labels
    p = rng.dirichlet(np.ones(classes), size=(2, n))
    p[1] = np.round(p[1], 1) + 1e-3  # ties of scores
    p[1] /= p[1].sum(axis=1, keepdims=True)
    flips = rng.random((3, n)) < 0.5
    new, old = Scored(y, p[0]), Scored(y, p[1])
    for metric in ("f1_macro", "ece", "roc_auc", "pr_auc"):
        a, b = gate.both_sides(metric, new, old, flips)
        for i, s in enumerate(flips[:, :, None]):
            expected_a = classification_metrics(y, np.where(s, p[1], p[0]))[metric]
            expected_b = classification_metrics(y, np.where(s, p[0], p[1]))[metric]
            assert (a[i], b[i]) == pytest.approx((expected_a, expected_b), abs=1e-12), (metric, i)
    assert gate.batched("f1_macro", y[None], p[:1])[0] == pytest.approx(f1_score(y, p[0].argmax(1), average="macro"))


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


def test_the_sign_flip_test_on_right_or_wrong_rows_is_mcnemars() -> None:
    """0/1 differences: the exact sign-flip p-value at margin 0 is McNemar's one-sided p on the rows only one of the
    two gets right (the rows both get right or wrong flip to themselves)."""
    y = np.zeros(14, dtype=np.int64)
    right_new = np.array([1] * 6 + [0] * 2 + [1] * 4 + [0] * 2, dtype=bool)
    right_old = np.array([0] * 6 + [1] * 2 + [1] * 4 + [0] * 2, dtype=bool)
    c = compare("accuracy", classifier(y, right_new, 1, 2), classifier(y, right_old, 2, 2), confidence=0.95, seed=0)
    assert c.mcnemar is not None
    assert (
        c.p_better
        == pytest.approx(c.mcnemar["p_better"])
        == pytest.approx(binomtest(6, 8, alternative="greater").pvalue)
    )
    assert c.p_worse == pytest.approx(c.mcnemar["p_worse"])


def pair(n: int, extra_right: int, base: float = 0.8, seed: int = 0) -> tuple[Scored, Scored]:
    """Champion right on `base` of n rows; the challenger right on the same rows plus `extra_right` more (fewer when
    negative)."""
    y = np.random.default_rng(seed).integers(0, 3, n)
    right_old = np.arange(n) < int(base * n)
    right_new = np.arange(n) < int(base * n) + extra_right
    return classifier(y, right_new, 1), classifier(y, right_old, 2)


def test_a_few_rows_all_one_way_are_not_evidence_but_ten_are() -> None:
    """bench/gate.py found this pair: 3 rows better, none worse, of 269; the old bootstrap's lower bound was above 0.
    The chance of 3 of 3 such rows going one way with no difference at all is 1/8: the bound is 0, McNemar's p 1/8."""
    few = compare("accuracy", *pair(269, 3), confidence=0.95, seed=42)
    assert few.low == 0.0 and few.mcnemar is not None and few.mcnemar["p_better"] == 0.125
    assert few.p_better == pytest.approx(0.125, abs=4 * math.sqrt(0.125 * 0.875 / gate.RESAMPLES))
    promoted, why = decide(few, "better", 0.0)
    assert not promoted and "McNemar's one-sided p 0.125" in why
    assert decide(compare("accuracy", *pair(269, 10), confidence=0.95, seed=42), "better", 0.0)[0]
    # the same rows under not_worse, the other way round: 3 rows worse is not shown worse
    assert decide(compare("accuracy", *pair(269, -3), confidence=0.95, seed=42), "not_worse", 0.0)[0]


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
    assert same.low == same.high == 0.0  # identical predictions: every pattern's difference is 0
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


def calibration_error_by_hand(y: np.ndarray, p: np.ndarray, bins: int = 15) -> float:
    """Expected calibration error, one bin at a time: bin b holds the rows whose top probability is in
    (b / bins, (b + 1) / bins] (the first bin also 0)."""
    confidence, right = p.max(axis=1), p.argmax(axis=1) == y
    total = 0.0
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        rows = [i for i in range(len(y)) if (lo < confidence[i] <= hi) or (b == 0 and confidence[i] == 0)]
        if rows:
            total += len(rows) / len(y) * abs(np.mean(right[rows]) - np.mean(confidence[rows]))
    return total


def test_a_worse_calibrated_challenger_is_never_favoured_on_ece() -> None:
    """The same predictions (accuracy equal), the challenger overconfident: its ece, computed here bin by bin, is
    higher, so the improvement is negative, `better` keeps the champion and `not_worse` finds it worse. With ece
    counted as higher-is-better (dropped from MINIMIZE) this promotes the worse-calibrated model."""
    rng = np.random.default_rng(1)
    n = 400
    logits = rng.normal(0, 1, (n, 3))
    y = np.array([rng.choice(3, p=np.exp(z) / np.exp(z).sum()) for z in logits])  # softmax(logits) is calibrated
    calibrated = Scored(y, np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True))
    sharp = np.exp(3 * logits)
    overconfident = Scored(y, sharp / sharp.sum(axis=1, keepdims=True))
    new_ece, old_ece = (calibration_error_by_hand(y, s.outputs) for s in (overconfident, calibrated))
    assert new_ece > old_ece + 0.1
    c = compare("ece", overconfident, calibrated, confidence=0.95, seed=0)
    assert (c.challenger, c.champion) == pytest.approx((new_ece, old_ece), abs=1e-12)
    assert c.improvement == pytest.approx(old_ece - new_ece, abs=1e-12) and c.high < 0
    assert decide(c, "better", 0.0)[0] is False
    assert decide(c, "not_worse", 0.0)[0] is False
    assert decide(compare("ece", calibrated, overconfident, confidence=0.95, seed=0), "better", 0.0)[0] is True


def test_the_metrics_to_minimise_are_defined_once() -> None:
    from trainflow.registry import card, registry

    assert registry.MINIMIZE is gate.MINIMIZE and card.MINIMIZE is gate.MINIMIZE
    assert {"log_loss", "ece", "rmse", "mae"} == gate.MINIMIZE


def test_the_same_seed_decides_the_same_and_rows_must_match() -> None:
    new, old = pair(200, 6)
    a, b = (compare("log_loss", new, old, 0.95, seed=3) for _ in range(2))
    assert a == b and compare("log_loss", new, old, 0.95, seed=4).low != a.low  # the seed is what draws the patterns
    shifted = Scored(old.labels[::-1].copy(), old.outputs)
    with pytest.raises(ValueError, match="label the test rows differently"):
        compare("accuracy", new, shifted, 0.95, seed=3)
    assert math.isfinite(a.low)


# --- too few rows, and rows without evidence ------------------------------------------------------------------------


def test_two_three_and_seven_rows_never_promote() -> None:
    """The audit's cases: r2 on 2 test rows (the old bootstrap's bounds were [+0.9996, +0.9996]: every resample that
    was not the two rows themselves had equal labels and was dropped), on 3, and a trial's 7. The sign-flip test
    cannot reject on 2 or 3 rows at all (1/4, 1/8 > 5%); below gate.MIN_ROWS the gate does not decide."""
    for n, y in ((2, [0.0, 1.0]), (3, [0.0, 1.0, 3.0]), (7, [0.0, 1.0, 3.0, 2.0, 5.0, 4.0, 6.0])):
        labels = np.array(y)
        champion, challenger = Scored(labels, labels + 1.0), Scored(labels, labels + 0.01)
        c = compare("r2", challenger, champion, confidence=0.95, seed=0)
        assert c.improvement > 0.1
        if n < 5:
            assert c.low == -math.inf
        for rule in ("better", "not_worse"):
            promoted, why = decide(c, rule, 0.0, "`trainflow models promote 3 --name m --reason ...`")
            assert promoted is False
            assert why == (
                f"r2 {c.challenger:.6g} vs the champion's {c.champion:.6g} on the same {n} test rows: too few test "
                f"rows to decide (n = {n} < 20); the champion stays; promote by hand with `trainflow models promote "
                "3 --name m --reason ...`"
            )
    assert gate.MIN_ROWS == 20


def test_r2_on_test_labels_that_are_all_equal_is_no_evidence_either_way() -> None:
    """r2 is undefined where the labels do not vary: no decision under either rule (the old gate dropped every
    resample and then promoted under not_worse, nothing having shown the challenger worse)."""
    y = np.full(30, 2.0)
    rng = np.random.default_rng(0)
    challenger, champion = Scored(y, y + rng.normal(0, 0.1, 30)), Scored(y, y + rng.normal(0, 1, 30))
    c = compare("r2", challenger, champion, confidence=0.95, seed=0)
    assert c.no_evidence == "all 30 test labels are equal, so r2 is undefined on them (its total sum of squares is 0)"
    for rule in ("better", "not_worse"):
        promoted, why = decide(c, rule, 0.0)
        assert promoted is False
        assert why.endswith(
            ": no evidence either way (all 30 test labels are equal, so r2 is undefined on them (its total sum of "
            "squares is 0)); the champion stays; promote by hand with `trainflow models promote VERSION`"
        )
    assert c.tags()["gate.no_evidence"] == c.no_evidence
    # rmse on the same rows is defined: the challenger's errors are smaller
    assert decide(compare("rmse", challenger, champion, confidence=0.95, seed=0), "better", 0.0)[0]


def test_a_metric_undefined_on_the_rows_and_outputs_that_are_not_finite_are_no_evidence() -> None:
    y = np.zeros(30, dtype=np.int64)  # one class: roc_auc has no negatives to rank
    rng = np.random.default_rng(0)
    new, old = (Scored(y, rng.dirichlet(np.ones(2), size=30)) for _ in range(2))
    c = compare("roc_auc", new, old, confidence=0.95, seed=0)
    assert c.no_evidence is not None and "roc_auc is undefined on these 30 test rows" in c.no_evidence
    assert not decide(c, "better", 0.0)[0] and not decide(c, "not_worse", 0.0)[0]
    x = np.linspace(0, 1, 30)
    broken = Scored(x, np.where(np.arange(30) == 4, np.nan, x))
    c = compare("mae", broken, Scored(x, x + 1), confidence=0.95, seed=0)
    assert c.no_evidence == "1 of the 30 test rows have a non-finite mae for one of the two models"
    assert not decide(c, "not_worse", 0.0)[0]


def test_the_decision_names_the_bound_and_the_comparison_json_keeps_its_keys() -> None:
    new, old = regression_pair(60, 1)
    c = compare("mae", new, old, confidence=0.95, seed=0)
    promoted, why = decide(c, "better", 0.0)
    assert re.fullmatch(
        r"mae \S+ vs the champion's \S+ on the same 60 test rows, improvement \S+, 95% bounds \[\S+, \S+\]: "
        r"(better|not shown better) by more than 0 with 95% confidence \(the lower bound is \S+\)",
        why,
    ), why
    assert promoted is (c.low > 0)
    old_keys = {"metric", "challenger", "champion", "improvement", "low", "high", "confidence", "rows", "resamples",
                "seed", "test", "mcnemar", "slices"}  # fmt: skip
    assert old_keys <= set(c.to_json())
    assert set(c.tags()) == {"gate.improvement", "gate.bounds", "gate.test", "gate.p"}


# --- per-row values, resamples, McNemar, slices and the decision, pinned on hand-made inputs --------------------


def test_per_row_values_are_hit_or_miss_log_loss_absolute_and_squared_errors() -> None:
    clf = gate.Scored(np.array([0, 1, 1]), np.array([[0.9, 0.1], [0.2, 0.8], [1.0, 0.0]]))
    np.testing.assert_array_equal(gate.per_row("accuracy", clf), [1.0, 1.0, 0.0])
    assert gate.per_row("accuracy", clf).dtype == np.float64
    np.testing.assert_allclose(gate.per_row("log_loss", clf), [-math.log(0.9), -math.log(0.8), -math.log(1e-15)])
    # a probability rounded a hair above 1 (softmax in float32) is 1: no row's loss is negative
    over = gate.Scored(np.array([0]), np.array([[1.0 + 1e-6, -1e-6]]))
    assert gate.per_row("log_loss", over).tolist() == [0.0]
    reg = gate.Scored(np.array([1.0, 2.0, 4.0]), np.array([2.0, 2.0, 1.0]))
    np.testing.assert_array_equal(gate.per_row("mae", reg), [1.0, 0.0, 3.0])
    np.testing.assert_array_equal(gate.per_row("rmse", reg), [1.0, 0.0, 9.0])
    np.testing.assert_array_equal(gate.per_row("r2", reg), [1.0, 0.0, 9.0])
    assert gate.per_row("f1_macro", clf) is None


def test_resampled_metrics_on_hand_picked_resamples() -> None:
    reg = gate.Scored(np.array([1.0, 2.0, 4.0]), np.array([2.0, 2.0, 1.0]))  # squared errors 1, 0, 9
    idx = np.array([[0, 1, 2], [2, 2, 1], [1, 1, 1]])
    np.testing.assert_allclose(gate.resampled("rmse", reg, idx), [math.sqrt(10 / 3), math.sqrt(6), 0.0])
    np.testing.assert_allclose(gate.resampled("mae", reg, idx), [4 / 3, 2.0, 0.0])
    # r2 = 1 - mse / variance of the resample's labels: [1,2,4] var 14/9; [4,4,2] var 8/9; [2,2,2] var 0 (0/0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a resample of equal labels is an r2 of nan or -inf, not a RuntimeWarning
        r2 = gate.resampled("r2", reg, idx)
        constant = gate.resampled("r2", reg, np.array([[2, 2, 2]]))  # squared error 9 over a variance of 0
    np.testing.assert_allclose(r2[:2], [1 - (10 / 3) / (14 / 9), 1 - 6 / (8 / 9)])
    assert math.isnan(r2[2])
    assert constant.tolist() == [-math.inf]
    assert gate.metric_value("rmse", reg) == pytest.approx(math.sqrt(10 / 3))


def test_resampled_ranked_metrics_and_f1_are_sklearn_s_on_each_resample() -> None:
    """The metrics that are not means over rows (the card's bootstrap intervals of them): each resample scored whole."""
    labels = np.array([0, 1, 1, 0, 1, 0])
    positive = np.array([0.2, 0.7, 0.6, 0.4, 0.3, 0.1])
    scored = gate.Scored(labels, np.stack([1 - positive, positive], axis=1))
    idx = np.array([[0, 1, 2, 3, 4, 5], [0, 1, 3, 4, 4, 5], [5, 2, 3, 1, 0, 0]])
    roc, pr, f1 = (gate.resampled(m, scored, idx) for m in ("roc_auc", "pr_auc", "f1_macro"))
    for i, rows in enumerate(idx):
        y, p = labels[rows], positive[rows]
        assert roc[i] == pytest.approx(roc_auc_score(y, p))
        assert pr[i] == pytest.approx(average_precision_score(y, p))
        assert f1[i] == pytest.approx(f1_score(y, (p > 0.5).astype(int), average="macro"))


def test_mcnemar_counts_the_rows_only_one_model_gets_right_and_its_exact_p_values() -> None:
    labels = np.array([0, 0, 0, 0, 0])
    right, wrong = [0.9, 0.1], [0.1, 0.9]
    new = gate.Scored(labels, np.array([right, right, right, right, wrong]))
    old = gate.Scored(labels, np.array([wrong, wrong, wrong, right, wrong]))
    # 3 rows only the challenger gets right, none only the champion: P(X <= 0) = 1/8 of Binomial(3, 1/2)
    assert gate.mcnemar(new, old) == {
        "challenger_only": 3, "champion_only": 0, "p_value": 0.25, "p_better": 0.125, "p_worse": 1.0,
    }  # fmt: skip
    # 2 and 1 of n = 3: P(X <= 1) = 4/8, two-sided 1.0; P(X <= 2) = 7/8
    mixed = gate.Scored(labels, np.array([right, right, wrong, right, wrong]))
    old2 = gate.Scored(labels, np.array([wrong, wrong, right, right, wrong]))
    assert gate.mcnemar(mixed, old2) == {
        "challenger_only": 2, "champion_only": 1, "p_value": 1.0, "p_better": 0.5, "p_worse": 0.875,
    }  # fmt: skip
    assert gate.mcnemar(new, new) == {
        "challenger_only": 0, "champion_only": 0, "p_value": 1.0, "p_better": 1.0, "p_worse": 1.0,
    }  # fmt: skip


def test_the_comparison_tags_hold_the_evidence_with_mcnemar_only_for_accuracy() -> None:
    c = gate.Comparison(metric="mae", challenger=0.5, champion=0.75, improvement=0.25, low=0.125, high=0.5,
                        confidence=0.9, rows=4, resamples=10, seed=1, test="t")  # fmt: skip
    assert c.tags() == {"gate.improvement": "0.25", "gate.bounds": "[0.125, 0.5] at 0.9 one-sided", "gate.test": "t"}
    c.mcnemar = {"challenger_only": 3, "champion_only": 0, "p_value": 0.25, "p_better": 0.125, "p_worse": 1.0}
    assert c.tags() == {
        "gate.improvement": "0.25",
        "gate.bounds": "[0.125, 0.5] at 0.9 one-sided",
        "gate.test": "t",
        "gate.mcnemar": "challenger only right on 3 rows, champion only on 0; p = 0.25",
    }


def test_slicing_names_new_and_old_rows_and_each_class() -> None:
    """New since the champion's split: the rows its split never held (-1), whatever split it held the others in."""
    labels = np.array([0, 1, 1, 0])
    s = gate.Slicing(classes=["x", "y"])
    masks = s.masks(labels, held=np.array([2, 0, -1, 1]))
    assert list(masks) == ["rows new since the champion's split", "rows the champion's split had", "class x", "class y"]
    assert {k: v.tolist() for k, v in masks.items()} == {
        "rows new since the champion's split": [False, False, True, False],
        "rows the champion's split had": [True, True, False, True],
        "class x": [True, False, False, True],
        "class y": [False, True, True, False],
    }
    assert list(s.masks(labels, held=None)) == ["class x", "class y"]
    assert list(gate.Slicing(None).masks(labels, np.array([0, -1]))) == []  # held of other rows
    assert list(gate.Slicing(None).masks(labels, None)) == []


def test_sliced_scores_both_models_on_each_nonempty_slice() -> None:
    labels = np.array([0, 1, 1, 0])
    right, wrong = {0: [0.9, 0.1], 1: [0.1, 0.9]}, {0: [0.1, 0.9], 1: [0.9, 0.1]}
    new = gate.Scored(labels, np.array([right[0], right[1], wrong[1], right[0]]))
    old = gate.Scored(labels, np.array([wrong[0], right[1], right[1], right[0]]))
    c = gate.Comparison("f1_macro", 0.0, 0.0, 0.0, 0.0, 0.0, 0.9, 4, 10, 0, "t")  # no per-row f1: slices use accuracy
    masks = {"class 0": labels == 0, "none": np.zeros(4, dtype=bool), "class 1": labels == 1}
    gate.sliced(c, new, old, masks)
    assert c.slices == [
        {"slice": "class 0", "rows": 2, "metric": "accuracy", "challenger": 1.0, "champion": 0.5, "improvement": 0.5,
         "challenger_only": 1, "champion_only": 0},
        {"slice": "class 1", "rows": 2, "metric": "accuracy", "challenger": 0.5, "champion": 1.0,
         "improvement": -0.5, "challenger_only": 0, "champion_only": 1},
    ]  # fmt: skip
    # a per-row gate metric is kept for the slices; log_loss is lower-is-better, so improvement is champion - new
    ll = gate.Comparison("log_loss", 0.0, 0.0, 0.0, 0.0, 0.0, 0.9, 4, 10, 0, "t")
    gate.sliced(ll, new, old, {"class 0": labels == 0})
    loss_new, loss_old = -math.log(0.9), (-math.log(0.1) - math.log(0.9)) / 2
    assert ll.slices == [
        {"slice": "class 0", "rows": 2, "metric": "log_loss", "challenger": pytest.approx(loss_new),
         "champion": pytest.approx(loss_old), "improvement": pytest.approx(loss_old - loss_new),
         "challenger_only": 1, "champion_only": 0},
    ]  # fmt: skip
    y = np.array([1.0, 2.0, 3.0])
    r = gate.Comparison("mae", 0.0, 0.0, 0.0, 0.0, 0.0, 0.9, 3, 10, 0, "t")
    gate.sliced(r, gate.Scored(y, y + 1), gate.Scored(y, y + 3), {"all": np.ones(3, dtype=bool)})
    assert r.slices == [{"slice": "all", "rows": 3, "metric": "mae", "challenger": 1.0, "champion": 3.0,
                         "improvement": 2.0}]  # fmt: skip


def _c(
    low: float, high: float, metric: str = "mae", mcnemar: dict[str, float] | None = None, confidence: float = 0.95
) -> gate.Comparison:
    return gate.Comparison(metric=metric, challenger=0.5, champion=1.0, improvement=0.5, low=low, high=high,
                           confidence=confidence, rows=40, resamples=10, seed=0, test="t", mcnemar=mcnemar)  # fmt: skip


HEAD = "mae 0.5 vs the champion's 1 on the same 40 test rows"


def test_decide_better_promotes_only_when_the_lower_bound_clears_the_margin() -> None:
    assert gate.decide(_c(0.2, 0.8), "better", 0.1) == (
        True,
        f"{HEAD}, improvement +0.5, 95% bounds [+0.2, +0.8]: better by more than 0.1 with 95% confidence "
        "(the lower bound is +0.2)",
    )
    assert gate.decide(_c(0.2, 0.8), "better", 0.2) == (
        False,
        f"{HEAD}, improvement +0.5, 95% bounds [+0.2, +0.8]: not shown better by more than 0.2 with 95% confidence "
        "(the lower bound is +0.2)",
    )


def test_decide_better_on_accuracy_needs_mcnemar_below_one_minus_the_confidence_too() -> None:
    head = "accuracy 0.5 vs the champion's 1 on the same 40 test rows, improvement +0.5, 95% bounds [+0.2, +0.8]"
    m = {"p_better": 0.04, "p_worse": 0.9}
    assert gate.decide(_c(0.2, 0.8, "accuracy", m), "better", 0.0) == (
        True,
        f"{head}: better by more than 0 with 95% confidence (the lower bound is +0.2, McNemar's one-sided p 0.04)",
    )
    m = {"p_better": 0.25, "p_worse": 0.9}  # alpha = 1 - 0.75 = 0.25: McNemar's p must be below it, not at it
    assert gate.decide(_c(0.2, 0.8, "accuracy", m, confidence=0.75), "better", 0.0) == (
        False,
        "accuracy 0.5 vs the champion's 1 on the same 40 test rows, improvement +0.5, 75% bounds [+0.2, +0.8]: "
        "not shown better by more than 0 with 75% confidence (the lower bound is +0.2, McNemar's one-sided p 0.25)",
    )


def test_decide_not_worse_keeps_the_challenger_unless_the_upper_bound_is_below_minus_the_margin() -> None:
    assert gate.decide(_c(-0.5, -0.3), "not_worse", 0.1) == (
        False,
        f"{HEAD}, improvement +0.5, 95% bounds [-0.5, -0.3]: worse by more than 0.1 with 95% confidence "
        "(the upper bound is -0.3)",
    )
    assert gate.decide(_c(-0.5, -0.1), "not_worse", 0.1) == (
        True,
        f"{HEAD}, improvement +0.5, 95% bounds [-0.5, -0.1]: not shown worse by more than 0.1 with 95% confidence "
        "(the upper bound is -0.1)",
    )
    unsure = {"p_better": 1.0, "p_worse": 0.2}  # the bound is below, McNemar does not agree
    assert gate.decide(_c(-0.5, -0.3, "accuracy", unsure), "not_worse", 0.1) == (
        True,
        "accuracy 0.5 vs the champion's 1 on the same 40 test rows, improvement +0.5, 95% bounds [-0.5, -0.3]: "
        "not shown worse by more than 0.1 with 95% confidence (the upper bound is -0.3, McNemar's one-sided p 0.2)",
    )
    sure = {"p_better": 1.0, "p_worse": 0.01}
    assert gate.decide(_c(-0.5, -0.3, "accuracy", sure), "not_worse", 0.1)[0] is False
    at_alpha = {"p_better": 1.0, "p_worse": 0.25}  # alpha = 1 - 0.75: at it is not below it
    assert gate.decide(_c(-0.5, -0.3, "accuracy", at_alpha, confidence=0.75), "not_worse", 0.1)[0] is True
