"""The champion gate's evidence: champion and challenger compared on the same test rows with a paired test.

Two point estimates on a few hundred test rows differ by a prediction or two on noise alone, so "the challenger's
accuracy is higher" flips the champion back and forth. Both models are scored on the same rows, so the paired
question has an answer: if neither model were better, which of the two made a row's output would not matter, and
the observed improvement would be one draw from the improvements of every way to swap the two models' outputs row by
row. `register.decide: paired` (the default) promotes only when that test rejects "the challenger is no better by
more than `register.min_improvement`" at level 1 - confidence; `register.promote_if: not_worse` promotes unless it
rejects "the challenger is no worse by more than min_improvement" (the challenger is worse, with that confidence).

The test, by metric:
- Means over rows (accuracy, log_loss, mae) and the metrics built from one (rmse and r2 from the squared errors): a
  paired sign-flip permutation test of the per-row differences d (the champion's loss minus the challenger's, so
  positive is better). Swapping the two models' outputs on a row flips the sign of its d, so under the null the
  d are symmetric about 0, and the test is exact at any number of rows: every one of the 2^n sign patterns when n is
  at most EXACT_ROWS, else RESAMPLES random ones drawn from `seed` (a Monte-Carlo p-value counts the observed
  pattern, so it is valid for any number of draws; the seed makes a rerun decide the same). A margin m is tested by
  shifting: d - m. r2's improvement is (SSE_champion - SSE_challenger) / SST with SST the test labels' own, the same
  for both, so its d is n * (champion's - challenger's squared error) / SST. rmse is monotone in the mean squared
  error: with the champion's rmse r0 taken as given, "better by more than m" is "the mean squared error lower by
  more than 2 m r0 - m^2". With 0/1 differences the sign-flip test at margin 0 is McNemar's exact test on the rows
  only one of the two gets right; accuracy keeps McNemar's record (`mcnemar`) and requires it too.
- The other metrics (f1_macro, roc_auc, pr_auc, ece) are not means over rows: the randomisation test swaps the two
  models' whole outputs on a random half of the rows, PERMUTATIONS times (exactly, every pattern, up to
  EXACT_ROWS rows), and recomputes both metrics on each (vectorised over the patterns). A margin m is compared with
  the swap distribution centred on the observed difference (a shift of location, exact at m = 0).

`low` and `high` are the inverted tests: `low` is the smallest margin the one-sided "better" test does not reject
(so promote iff low > min_improvement, the test and the bound are the same decision), `high` the largest the "worse"
test does not reject. For the means they are order statistics of the means of d over the flipped rows of each
pattern; -inf/+inf when the rows cannot reject anything at that level (2^n patterns too few).

A decision needs MIN_ROWS test rows. The test holds its level on exchangeable models at any number of rows, but at
95% one-sided it cannot reject at all with fewer than 5 rows that differ (2^-4 > 5%), and on a dozen or two it
rejects only when the challenger wins on nearly every row: a decision there would keep the champion anyway, for a
reason the user should see. Small test sets are also where a null that is not exchangeable misleads most: two
models equally good in expectation whose errors differ in shape (one many small errors, the other a few large ones)
make skewed differences, and no test of a mean (this one, a t-test, a bootstrap) holds its level on a few dozen of
those (bench/gate.py's last table): a limit of the test split's size, which only more rows lift. Below MIN_ROWS, and
when the rows hold no evidence at all (r2 of test labels that are all equal, a metric that is undefined on these
labels, outputs that are not finite), the champion stays under either `promote_if` ("not shown worse" on rows that
cannot show anything would promote every challenger) and the decision says why and how to promote by hand.
Degenerate patterns are never dropped: a pattern whose metric is not finite counts against the decision in both
directions.

bench/gate.py measures the level: the promote rate on exchangeable (null) pairs for every gate metric, at 10 to 269
rows, beside the power on a real improvement.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from trainflow.data.split import Held

MIN_ROWS = 20  # test rows below which the gate does not decide (see the module docstring)
EXACT_ROWS = 16  # up to this many rows every sign/swap pattern is enumerated (2^16 = 65536 patterns)
RESAMPLES = 9999  # Monte-Carlo sign flips (means over rows): one pass of n multiply-adds each
PERMUTATIONS = 1999  # Monte-Carlo swaps (other metrics): each recomputes two metrics over all the test rows
TIE = 1e-12  # swapped metrics (all in [0, 1]) closer than this to the observed one tie with it
CHUNK_CELLS = 4 << 20  # pattern cells (rows x patterns; x classes for swaps) held at once
MINIMIZE = frozenset({"log_loss", "ece", "rmse", "mae"})  # gate metrics where lower is better; the others higher
MEANS = ("accuracy", "log_loss", "mae", "rmse", "r2")  # the sign-flip test; every other metric is swapped whole


@dataclass
class Scored:
    """One model's outputs on the test rows: labels [n] (class index or target value) and outputs (probabilities
    [n, classes] or values [n]), in the row order of the test split."""

    labels: np.ndarray
    outputs: np.ndarray


@dataclass
class Comparison:
    """What the paired test found. `improvement` is oriented so that positive means the challenger is better (for a
    lower-is-better metric, champion minus challenger)."""

    metric: str
    challenger: float
    champion: float
    improvement: float
    low: float  # the one-sided lower confidence bound of the improvement: the test inverted (module docstring)
    high: float  # the one-sided upper confidence bound
    confidence: float
    rows: int
    resamples: int  # sign or swap patterns the test counted (2^rows when enumerated)
    seed: int
    test: str
    mcnemar: dict[str, Any] | None = None  # accuracy: rows only one of the two gets right, and the exact p-value
    slices: list[dict[str, Any]] = field(default_factory=list)  # the two on parts of the rows (`sliced`)
    p_better: float | None = None  # one-sided p-value of "the challenger is no better at all" (margin 0)
    p_worse: float | None = None  # one-sided p-value of "the challenger is no worse at all"
    no_evidence: str | None = None  # why these rows cannot decide either way (then no decision is made)

    def to_json(self) -> dict[str, Any]:
        """As reports/registration.json holds it: an infinite bound (too few rows to reject anything) as null, so
        strict JSON readers can read the file."""
        return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in asdict(self).items()}

    def tags(self) -> dict[str, str]:
        """The registry version's tags: the evidence beside the decision."""
        out = {
            "gate.improvement": repr(self.improvement),
            "gate.bounds": f"[{self.low!r}, {self.high!r}] at {self.confidence:g} one-sided",
            "gate.test": self.test,
        }
        if self.p_better is not None and self.p_worse is not None:
            out["gate.p"] = f"no better: {self.p_better:.4g}; no worse: {self.p_worse:.4g} (one-sided, margin 0)"
        if self.no_evidence is not None:
            out["gate.no_evidence"] = self.no_evidence
        if self.mcnemar is not None:
            m = self.mcnemar
            out["gate.mcnemar"] = (
                f"challenger only right on {m['challenger_only']} rows, champion only on {m['champion_only']}; "
                f"p = {m['p_value']:.4g}"
            )
        return out


@dataclass
class Slicing:
    """This split's test rows as the gate reads them: the class names (classification), the tags that record the
    split in a registered version (its lineage and generation), and `held`: from the champion's tags, which test rows
    its own split held and where (split.Held). None where nothing is recorded (a registration outside the register
    stage): then every test row is compared, as nothing says otherwise."""

    classes: list[str] | None
    tags: dict[str, str] = field(default_factory=dict)
    held: Callable[[dict[str, str]], Held] | None = None

    def masks(self, labels: np.ndarray, held: np.ndarray | None) -> dict[str, np.ndarray]:
        """The named subsets of the test rows: new since the champion's split (rows its split never held: their keys
        are not in its assignment) and the ones it had, where `held` (per row, the champion's split of it, -1: never
        held) is known; each class."""
        out: dict[str, np.ndarray] = {}
        if held is not None and len(held) == len(labels):
            new = held < 0
            out |= {"rows new since the champion's split": new, "rows the champion's split had": ~new}
        for k, name in enumerate(self.classes or []):
            out[f"class {name}"] = labels == k
        return out


def per_row(metric: str, scored: Scored) -> np.ndarray | None:
    """The per-row values whose mean is the metric (or, for rmse and r2, is built from), when there are any."""
    y, out = scored.labels, scored.outputs
    if metric == "accuracy":
        return (out.argmax(axis=1) == y).astype(np.float64)
    if metric == "log_loss":
        p = np.clip(out[np.arange(len(y)), y.astype(np.int64)], 1e-15, 1.0)
        return -np.log(p)
    if metric == "mae":
        return np.abs(out - y)
    if metric in ("rmse", "r2"):
        return (out - y) ** 2
    return None


def resampled(metric: str, scored: Scored, idx: np.ndarray) -> np.ndarray:
    """The metric on each resample: idx [resamples, n] of row indices (the card's bootstrap intervals)."""
    values = per_row(metric, scored)
    if values is not None:
        mean = values[idx].mean(axis=1)
        if metric == "rmse":
            return np.sqrt(mean)
        if metric == "r2":
            y = scored.labels[idx]
            total = ((y - y.mean(axis=1, keepdims=True)) ** 2).mean(axis=1)
            with np.errstate(divide="ignore", invalid="ignore"):
                return 1.0 - mean / total
        return mean
    metric_of = _metric_function(metric)
    return np.array([metric_of(scored.labels[i], scored.outputs[i]) for i in idx])


def _metric_function(metric: str) -> Callable[[np.ndarray, np.ndarray], float]:
    from trainflow.metrics import classification_metrics, ranked_metrics

    if metric in ("roc_auc", "pr_auc"):
        return lambda y, p: float(ranked_metrics(y, p)[metric])
    return lambda y, p: float(classification_metrics(y, p)[metric])


def metric_value(metric: str, scored: Scored) -> float:
    """The metric on all the rows (the resample that is the test split itself)."""
    return float(resampled(metric, scored, np.arange(len(scored.labels))[None, :])[0])


def mcnemar(challenger: Scored, champion: Scored) -> dict[str, Any]:
    """McNemar's exact test: of the rows exactly one model gets right, how many each gets, and the two-sided p-value
    of a split at least that uneven if neither were better (binomial, p = 1/2)."""
    right_new = challenger.outputs.argmax(axis=1) == challenger.labels
    right_old = champion.outputs.argmax(axis=1) == champion.labels
    only_new, only_old = int(np.sum(right_new & ~right_old)), int(np.sum(right_old & ~right_new))
    n = only_new + only_old

    def at_most(k: int) -> float:  # P(X <= k) for X ~ Binomial(n, 1/2)
        return sum(math.comb(n, i) for i in range(k + 1)) / 2**n if n else 1.0

    return {
        "challenger_only": only_new,
        "champion_only": only_old,
        "p_value": min(1.0, 2 * at_most(min(only_new, only_old))),  # two-sided: the distribution is symmetric
        "p_better": at_most(only_old),  # P(X >= only_new): the challenger this far ahead if neither were better
        "p_worse": at_most(only_new),  # P(X <= only_new): this far behind
    }


# --- the metrics that are not means over rows, on many patterns at once -------------------------------------------
# The value of each pattern equals trainflow.metrics' on that pattern's rows (tests/registry/test_paired_gate.py
# checks it against evaluate's functions).


def batched(metric: str, labels: np.ndarray, proba: np.ndarray) -> np.ndarray:
    """f1_macro or ece of each pattern (as evaluate computes them)."""
    if metric == "f1_macro":
        return _f1_macro(np.broadcast_to(labels, proba.shape[:2]), proba)
    if metric == "ece":
        return _ece(np.broadcast_to(labels, proba.shape[:2]), proba)
    raise ValueError(f"no per-pattern {metric!r} here: roc_auc and pr_auc are computed for swaps by _ranked_swaps")


def _f1_macro(labels: np.ndarray, proba: np.ndarray) -> np.ndarray:
    """Macro F1 over the classes that occur in the labels or the predictions (sklearn's, zero_division=0): per class
    2 TP / (predicted + actual)."""
    predicted = proba.argmax(axis=2)
    total, present = np.zeros(len(labels)), np.zeros(len(labels))
    for c in range(proba.shape[2]):
        said, truth = predicted == c, labels == c
        both = np.sum(said & truth, axis=1)
        denominator = np.sum(said, axis=1) + np.sum(truth, axis=1)
        total += np.where(denominator > 0, 2 * both / np.maximum(denominator, 1), 0.0)
        present += denominator > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        return total / present


def _ece(labels: np.ndarray, proba: np.ndarray) -> np.ndarray:
    """metrics.expected_calibration_error per pattern: one bincount over (pattern, bin)."""
    from trainflow.metrics import ECE_BINS

    confidence = proba.max(axis=2).astype(np.float64)
    correct = (proba.argmax(axis=2) == labels).astype(np.float64)
    edges = np.arange(ECE_BINS + 1) / ECE_BINS
    which = np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, ECE_BINS - 1)
    p, n = confidence.shape
    cell = (np.arange(p)[:, None] * ECE_BINS + which).ravel()
    gaps = np.bincount(cell, weights=(correct - confidence).ravel(), minlength=p * ECE_BINS).reshape(p, ECE_BINS)
    return np.abs(gaps).sum(axis=1) / max(n, 1)


def _ranked_swaps(
    metric: str, labels: np.ndarray, new: np.ndarray, old: np.ndarray, flips: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """roc_auc or pr_auc of both sides of each swap pattern (flips [p, n]), as metrics.ranked_metrics: binary, of
    class 1; multiclass, the mean over the classes that can be scored. Row i's score on a side is one of its two
    models' scores, so the 2n scores are sorted once and a pattern only picks one of each row's two places in that
    order: ranks and precisions come from cumulative counts of the picked entries, linear in the rows per pattern."""
    k = new.shape[1]
    n = len(labels)
    rows = np.concatenate([np.arange(n), np.arange(n)])
    champion_side = np.concatenate([np.zeros(n, dtype=bool), np.ones(n, dtype=bool)])  # which model's score
    sums = [np.zeros(len(flips)), np.zeros(len(flips))]
    scored = 0
    for c in [1] if k == 2 else range(k):
        hit = labels == c
        positives = int(hit.sum())
        if positives == 0 or (metric == "roc_auc" and positives == n):
            continue  # evaluate skips a class it cannot score
        scored += 1
        values = np.concatenate([new[:, c], old[:, c]]).astype(np.float64)
        order = np.argsort(values if metric == "roc_auc" else -values, kind="stable")
        v, r, side = values[order], rows[order], champion_side[order]
        starts = np.concatenate([[True], v[1:] != v[:-1]])  # tie groups are runs of equal scores
        first = np.maximum.accumulate(np.where(starts, np.arange(2 * n), 0))
        last = np.concatenate([np.flatnonzero(starts)[1:] - 1, [2 * n - 1]])[np.cumsum(starts) - 1]
        positive = hit[r][:, None]
        # [2n, p]: the cumulative counts run down the sorted entries, every pattern at once (contiguous rows)
        chosen = flips.T[r]
        for s, picked in enumerate((side[:, None] == chosen, side[:, None] != chosen)):  # the challenger's slot
            count = np.cumsum(picked, axis=0, dtype=np.int32)
            if metric == "roc_auc":  # Mann-Whitney: the average rank of each picked positive among the picked
                before = np.where((first > 0)[:, None], count[first - 1], 0)
                rank = before + (count[last] - before + 1) / 2
                u = np.sum(np.where(picked & positive, rank, 0.0), axis=0) - positives * (positives + 1) / 2
                sums[s] += u / (positives * (n - positives))
            else:  # average precision: each picked positive weighs the precision at the end of its tie group
                true_positives = np.cumsum(picked & positive, axis=0, dtype=np.int32)
                with np.errstate(invalid="ignore", divide="ignore"):  # 0 / 0 where nothing is picked yet
                    precision = true_positives[last] / count[last]
                sums[s] += np.sum(np.where(picked & positive, precision, 0.0), axis=0) / positives
    if scored == 0:
        return np.full(len(flips), np.nan), np.full(len(flips), np.nan)
    return sums[0] / scored, sums[1] / scored


# --- the paired tests ----------------------------------------------------------------------------------------------


def differences(metric: str, challenger: Scored, champion: Scored) -> tuple[np.ndarray, str | None]:
    """(d, why not) for a metric that is a mean over rows or built from one: the per-row improvement, positive where
    the challenger is better, in the units the sign-flip test shifts by (the metric's own; rmse: squared error), and
    why the rows hold no evidence (None when they do)."""
    new, old = per_row(metric, challenger), per_row(metric, champion)
    assert new is not None and old is not None
    d = new - old if metric == "accuracy" else old - new
    if metric == "r2":
        y = challenger.labels.astype(np.float64)
        total = float(np.sum((y - y.mean()) ** 2))
        if not total > 0:
            return d, f"all {len(y)} test labels are equal, so r2 is undefined on them (its total sum of squares is 0)"
        d = d * (len(y) / total)
    bad = int(np.sum(~np.isfinite(d)))
    if bad:
        return d, f"{bad} of the {len(d)} test rows have a non-finite {metric} for one of the two models"
    return d, None


def patterns(n: int, count: int, seed: int) -> Iterator[np.ndarray]:
    """Chunks of patterns [p, n] (True: that row's outputs swapped between the two models): every one of the 2^n
    when n <= EXACT_ROWS, else `count` drawn from `seed`, 64 rows a raw 64-bit draw, so the patterns do not depend on
    the chunk size. The first pattern of the enumeration is the identity."""
    per_chunk = max(1, CHUNK_CELLS // max(n, 1))
    if n <= EXACT_ROWS:
        codes = np.arange(2**n, dtype=np.int64)
        for start in range(0, len(codes), per_chunk):
            yield (codes[start : start + per_chunk, None] >> np.arange(n)) & 1 == 1
        return
    words = -(-n // 64)
    generator = np.random.default_rng(seed).bit_generator
    for start in range(0, count, per_chunk):
        raw = generator.random_raw((min(per_chunk, count - start), words)).astype("<u8")
        yield np.unpackbits(raw.view(np.uint8), axis=1, bitorder="little")[:, :n] == 1


def _kth(alpha: Fraction, total: int) -> int:
    """How many patterns at least as extreme as the observed one a rejection allows: p = that count / total must be
    below alpha, so the count is at most ceil(alpha * total) - 1."""
    return -(-alpha.numerator * total // alpha.denominator) - 1


def sign_flip(d: np.ndarray, confidence: float, seed: int, count: int) -> tuple[float, float, float, float, int]:
    """(low, high, p_better, p_worse, patterns) of the sign-flip test of the mean of d. Flipping the rows S shifts
    mean(d - m) by -2 |S| (mean of d over S - m) / n, so a pattern is at least as extreme as the observed one under
    the margin m exactly when the mean of d over its flipped rows is <= m: the p-value at margin m is the share of
    patterns whose flipped mean is <= m (the identity always), and `low` the order statistic where it reaches alpha."""
    n = len(d)
    means = []
    for flips in patterns(n, count, seed):
        flipped = flips.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            means.append((flips.astype(np.float64) @ d) / flipped)  # NaN for the identity (no row flipped)
    tau = np.concatenate(means)
    if n > EXACT_ROWS:
        tau = np.concatenate([[np.nan], tau])  # the observed pattern counts among the Monte-Carlo ones
    total, k = len(tau), _kth(_alpha(confidence), len(tau))
    below = np.sort(np.where(np.isnan(tau), -np.inf, tau))  # the identity: as extreme as itself in both tails
    above = np.sort(np.where(np.isnan(tau), np.inf, tau))[::-1]
    low = float(below[k]) if k >= 0 else -math.inf
    high = float(above[k]) if k >= 0 else math.inf
    return low, high, float(np.sum(below <= 0) / total), float(np.sum(above >= 0) / total), total


def both_sides(metric: str, challenger: Scored, champion: Scored, flips: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The metric of the challenger's slot and of the champion's under each swap pattern (flips [p, n]: True, that
    row's outputs swapped): f1_macro, roc_auc, pr_auc or ece. The identity pattern gives the two models' own."""
    labels, new, old = challenger.labels, challenger.outputs, champion.outputs
    if metric in ("roc_auc", "pr_auc"):
        return _ranked_swaps(metric, labels, new, old, flips)
    swap = flips[:, :, None]  # [p, n, classes] twice: the caller's chunks bound it
    return batched(metric, labels, np.where(swap, old, new)), batched(metric, labels, np.where(swap, new, old))


def swapped(
    metric: str, challenger: Scored, champion: Scored, confidence: float, seed: int, count: int
) -> tuple[float, float, float, float, int, str | None]:
    """(low, high, p_better, p_worse, patterns, why not) of the randomisation test that swaps whole outputs per row:
    the improvement t_b of each pattern; the p-value at margin m is the share of patterns with t_b >= t - m (t the
    observed improvement, the identity's). A pattern whose metric is not finite is as extreme as any."""
    sign = -1.0 if metric in MINIMIZE else 1.0
    n = len(challenger.labels)

    def improvement(flips: np.ndarray) -> np.ndarray:
        a, b = both_sides(metric, challenger, champion, flips)
        return sign * (a - b)

    t = float(improvement(np.zeros((1, n), dtype=bool))[0])
    if not math.isfinite(t):
        return -math.inf, math.inf, 1.0, 1.0, 0, f"{metric} is undefined on these {n} test rows (one class only?)"
    per_chunk = max(1, CHUNK_CELLS // max(challenger.outputs.size, 1))
    improvements = [np.array([t])] if n > EXACT_ROWS else []
    for flips in patterns(n, count, seed):
        improvements += [improvement(flips[i : i + per_chunk]) for i in range(0, len(flips), per_chunk)]
    tb = np.concatenate(improvements)
    total, k = len(tb), _kth(_alpha(confidence), len(tb))
    worst = np.sort(np.where(np.isfinite(tb), tb, np.inf))[::-1]  # largest first: a NaN pattern counts as extreme
    best = np.sort(np.where(np.isfinite(tb), tb, -np.inf))
    # A pattern that ties with the observed one (f1 from the same counts, an ece summed in another order) may differ
    # from it in the last bits: it counts as a tie, and a bound that is 0 but for those bits is 0.
    low = _snap(t - float(worst[k])) if k >= 0 else -math.inf
    high = _snap(t - float(best[k])) if k >= 0 else math.inf
    p_better, p_worse = np.sum(worst >= t - TIE) / total, np.sum(best <= t + TIE) / total
    return low, high, float(p_better), float(p_worse), total, None


def _snap(bound: float) -> float:
    return 0.0 if abs(bound) <= TIE else bound


def _alpha(confidence: float) -> Fraction:
    """1 - confidence as an exact fraction of the decimal the user wrote (0.95 -> 1/20), so that a p-value of
    exactly alpha is not decided by the rounding of 1 - 0.95."""
    return 1 - Fraction(repr(confidence))


def compare(
    metric: str,
    challenger: Scored,
    champion: Scored,
    confidence: float,
    seed: int,
    resamples: int | None = None,
) -> Comparison:
    """The paired test of the improvement of `challenger` over `champion` on the same rows (the module docstring):
    `resamples` random patterns when there are more than EXACT_ROWS rows (default RESAMPLES sign flips for the
    means, PERMUTATIONS swaps for the others)."""
    n = len(challenger.labels)
    if n != len(champion.labels) or not np.array_equal(challenger.labels, champion.labels):
        raise ValueError("the champion and the challenger label the test rows differently (another list of classes?)")
    sign = -1.0 if metric in MINIMIZE else 1.0
    if metric in MEANS:
        new, old = metric_value(metric, challenger), metric_value(metric, champion)
    else:  # evaluate's values, without sklearn's per-call checks
        new, old = (float(v[0]) for v in both_sides(metric, challenger, champion, np.zeros((1, n), dtype=bool)))
    where = f"the {n} test rows"
    if metric in MEANS:
        count = RESAMPLES if resamples is None else resamples
        d, why_not = differences(metric, challenger, champion)
        unit = {"rmse": " (squared error; rmse through the champion's)",
                "r2": " (squared error over the test labels' total sum of squares)"}.get(metric, "")  # fmt: skip
        test = f"paired sign-flip test of the per-row {metric} difference{unit}"
        if why_not is not None:
            low, high, p_better, p_worse, total = -math.inf, math.inf, 1.0, 1.0, 0
        else:
            low, high, p_better, p_worse, total = sign_flip(d, confidence, seed, count)
            if metric == "rmse":  # the bounds of the mean squared error's drop, in rmse: sqrt(mse0 - drop)
                mse = float(np.mean((champion.outputs - champion.labels) ** 2))
                low, high = (old - math.sqrt(max(mse - b, 0.0)) for b in (low, high))
    else:
        count = PERMUTATIONS if resamples is None else resamples
        test = f"paired randomisation test of the {metric} difference, the two models' outputs swapped per row"
        low, high, p_better, p_worse, total, why_not = swapped(metric, challenger, champion, confidence, seed, count)
    if n <= EXACT_ROWS:
        test += f": exact, all {2**n} patterns of {where}"
    else:
        test += f": {count} random patterns of {where}"
    return Comparison(
        metric=metric,
        challenger=new,
        champion=old,
        improvement=sign * (new - old),
        low=low,
        high=high,
        confidence=confidence,
        rows=n,
        resamples=total,
        seed=seed,
        test=test,
        mcnemar=mcnemar(challenger, champion) if metric == "accuracy" else None,
        p_better=p_better,
        p_worse=p_worse,
        no_evidence=why_not,
    )


def sliced(c: Comparison, challenger: Scored, champion: Scored, masks: dict[str, np.ndarray]) -> None:
    """Fill `c.slices`: the gate metric of both models on each named subset of the test rows (new rows and old, each
    class), with how many rows only one of the two gets right (classification). No test per slice: a slice is for
    reading (where did the challenger win or lose?), the decision is on all the rows."""
    metric = c.metric if per_row(c.metric, challenger) is not None or c.metric == "r2" else "accuracy"
    if challenger.outputs.ndim == 1 and metric == "accuracy":
        metric = c.metric  # regression: only the gate metric makes sense
    sign = -1.0 if metric in MINIMIZE else 1.0
    for name, mask in masks.items():
        rows = int(mask.sum())
        if rows == 0:
            continue
        new, old = (Scored(s.labels[mask], s.outputs[mask]) for s in (challenger, champion))
        a, b = metric_value(metric, new), metric_value(metric, old)
        entry: dict[str, Any] = {"slice": name, "rows": rows, "metric": metric, "challenger": a, "champion": b,
                                 "improvement": sign * (a - b)}  # fmt: skip
        if challenger.outputs.ndim == 2:
            m = mcnemar(new, old)
            entry |= {"challenger_only": m["challenger_only"], "champion_only": m["champion_only"]}
        c.slices.append(entry)


def decide(
    c: Comparison, promote_if: str, min_improvement: float, by_hand: str = "`trainflow models promote VERSION`"
) -> tuple[bool, str]:
    """(promote, why) by the paired rule: the inverted test's bound against the margin, and for accuracy McNemar's
    one-sided test too. Too few rows, or rows without evidence, keep the champion under either rule: "not shown
    worse" on rows that cannot show anything would promote every challenger. `by_hand`: the command that promotes
    this version anyway."""
    values = f"{c.metric} {c.challenger:.6g} vs the champion's {c.champion:.6g} on the same {c.rows} test rows"
    if c.rows < MIN_ROWS:
        return False, (
            f"{values}: too few test rows to decide (n = {c.rows} < {MIN_ROWS}); the champion stays; promote by hand "
            f"with {by_hand}"
        )
    if c.no_evidence is not None:
        return (
            False,
            f"{values}: no evidence either way ({c.no_evidence}); the champion stays; promote by hand with {by_hand}",
        )
    alpha = float(_alpha(c.confidence))
    pct = f"{c.confidence:.0%}"
    interval = f"improvement {c.improvement:+.4g}, {pct} bounds [{c.low:+.4g}, {c.high:+.4g}]"
    m = c.mcnemar
    if promote_if == "not_worse":
        worse = c.high < -min_improvement and (m is None or m["p_worse"] < alpha)
        promote = not worse
        rule = f"{'worse' if worse else 'not shown worse'} by more than {min_improvement:g} with {pct} confidence"
        evidence = (c.high, m["p_worse"] if m else None)
    else:
        promote = c.low > min_improvement and (m is None or m["p_better"] < alpha)
        rule = f"{'better' if promote else 'not shown better'} by more than {min_improvement:g} with {pct} confidence"
        evidence = (c.low, m["p_better"] if m else None)
    bound, p = evidence
    rule += f" (the {'upper' if promote_if == 'not_worse' else 'lower'} bound is {bound:+.4g}"
    rule += f", McNemar's one-sided p {p:.3g})" if p is not None else ")"
    return promote, f"{values}, {interval}: {rule}"
