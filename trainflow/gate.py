"""The champion gate's evidence: champion and challenger compared on the same test rows with a paired test.

Two point estimates on a few hundred test rows differ by a prediction or two on noise alone, so "the challenger's
accuracy is higher" flips the champion back and forth. Both models are scored on the same rows, so the paired
question has an answer: resample the rows (the same resample for both models), recompute the gate metric of each,
and look at the distribution of the difference. `register.decide: paired` (the default) promotes only when the lower
confidence bound of the improvement exceeds `register.min_improvement`; `register.promote_if: not_worse` promotes
unless the upper bound is below -min_improvement (the challenger is worse, with that confidence).

The bootstrap is seeded (the pipeline's `seed`), so a rerun makes the same decision. For accuracy, McNemar's exact
test on the rows where exactly one of the two is right must agree too (one-sided, at 1 - confidence): the percentile
bootstrap alone is too eager when only a few rows differ. Measured (bench/gate.py): a challenger right on 3 more
rows of 269 and wrong on none has a bootstrap lower bound of +0.0037, because 95% of resamples hold one of the 3,
while the chance of 3 of 3 such rows going one way with no difference at all is 1/8. The metric of each resample is
computed from per-row values where the metric allows it (accuracy, log_loss, mae, rmse, r2: vectorised), else by
evaluate's own function per resample (f1_macro, roc_auc, pr_auc, ece: slower, linear in the test rows).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from trainflow.data.split import Held

RESAMPLES = 2000  # bootstrap resamples: the 5% quantile's own noise is about 0.5 percentage points of its level
CHUNK_CELLS = 4 << 20  # resampled row indices held at once (int64: 32 MiB)
MINIMIZE = {"log_loss", "ece", "rmse", "mae"}  # lower is better


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
    low: float  # the one-sided lower confidence bound of the improvement
    high: float  # the one-sided upper confidence bound
    confidence: float
    rows: int
    resamples: int
    seed: int
    test: str
    mcnemar: dict[str, Any] | None = None  # accuracy: rows only one of the two gets right, and the exact p-value
    slices: list[dict[str, Any]] = field(default_factory=list)  # the two on parts of the rows (`sliced`)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def tags(self) -> dict[str, str]:
        """The registry version's tags: the evidence beside the decision."""
        out = {
            "gate.improvement": repr(self.improvement),
            "gate.bounds": f"[{self.low!r}, {self.high!r}] at {self.confidence:g} one-sided",
            "gate.test": self.test,
        }
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
    """The metric on each resample: idx [resamples, n] of row indices."""
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
    from trainflow.stages.evaluate import classification_metrics, ranked_metrics

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


def compare(
    metric: str, challenger: Scored, champion: Scored, confidence: float, seed: int, resamples: int = RESAMPLES
) -> Comparison:
    """The paired bootstrap of the improvement of `challenger` over `champion` on the same rows."""
    n = len(challenger.labels)
    if n != len(champion.labels) or not np.array_equal(challenger.labels, champion.labels):
        raise ValueError("the champion and the challenger label the test rows differently (another list of classes?)")
    sign = -1.0 if metric in MINIMIZE else 1.0
    rng = np.random.default_rng(seed)
    per_chunk = max(1, CHUNK_CELLS // max(n, 1))
    diffs = []
    for start in range(0, resamples, per_chunk):
        idx = rng.integers(0, n, size=(min(per_chunk, resamples - start), n))
        diffs.append(sign * (resampled(metric, challenger, idx) - resampled(metric, champion, idx)))
    d = np.concatenate(diffs)
    d = d[np.isfinite(d)]  # r2 of a resample whose labels are all equal
    new, old = metric_value(metric, challenger), metric_value(metric, champion)
    low, high = (float(np.quantile(d, q)) for q in (1 - confidence, confidence)) if len(d) else (math.nan, math.nan)
    return Comparison(
        metric=metric,
        challenger=new,
        champion=old,
        improvement=sign * (new - old),
        low=low,
        high=high,
        confidence=confidence,
        rows=n,
        resamples=resamples,
        seed=seed,
        test=f"paired bootstrap of the {metric} difference, {resamples} resamples of the {n} test rows",
        mcnemar=mcnemar(challenger, champion) if metric == "accuracy" else None,
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


def decide(c: Comparison, promote_if: str, min_improvement: float) -> tuple[bool, str]:
    """(promote, why) by the paired rule: the bootstrap's bound, and for accuracy McNemar's one-sided test too."""
    pct, alpha = f"{c.confidence:.0%}", 1 - c.confidence
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
    values = f"{c.metric} {c.challenger:.6g} vs the champion's {c.champion:.6g} on the same {c.rows} test rows"
    return promote, f"{values}, {interval}: {rule}"
