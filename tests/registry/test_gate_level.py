"""The paired gate's level on small test sets: on exchangeable (null) pairs, where neither model is better, the gate
promotes, and its test rejects "no better", at most 1 - confidence of the time (plus the Monte-Carlo error of the
simulation). bench/gate.py runs the whole table (every metric, 300 simulations a cell, up to 269 rows); these are the
cells where the old percentile bootstrap was furthest above the level (r2 12% at 10 rows, rmse with heavy-tailed
errors, log_loss at 10 rows)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from trainflow.registry import gate
from trainflow.registry.gate import Scored

SIMULATIONS = 200
LEVEL = 0.05
BOUND = LEVEL + 2 * math.sqrt(LEVEL * (1 - LEVEL) / SIMULATIONS)  # 8.1%: the level plus 2 Monte-Carlo errors


def gaussian_errors(rng: np.random.Generator, n: int) -> tuple[Scored, Scored]:
    y = rng.normal(0, 1, n)
    return Scored(y, y + rng.normal(0, 1, n)), Scored(y, y + rng.normal(0, 1, n))


def heavy_tailed_errors(rng: np.random.Generator, n: int) -> tuple[Scored, Scored]:
    """Student t errors with 2 degrees of freedom: infinite variance, the squared errors' mean ruled by a few rows."""
    y = rng.normal(0, 1, n)
    return Scored(y, y + rng.standard_t(2, n)), Scored(y, y + rng.standard_t(2, n))


def three_classes(rng: np.random.Generator, n: int) -> tuple[Scored, Scored]:
    """Each model sees its own noisy logits of the label and outputs their calibrated posterior."""
    y = rng.integers(0, 3, n)

    def model() -> Scored:
        z = 1.5 * (1.5 * np.eye(3)[y] + rng.normal(0, 1, (n, 3)))
        p = np.exp(z - z.max(axis=1, keepdims=True))
        return Scored(y, p / p.sum(axis=1, keepdims=True))

    return model(), model()


CELLS: list[tuple[str, Callable[[np.random.Generator, int], tuple[Scored, Scored]], int]] = [
    ("r2", gaussian_errors, 10),
    ("rmse", heavy_tailed_errors, 10),
    ("log_loss", three_classes, 10),
    ("r2", gaussian_errors, 20),
    ("rmse", heavy_tailed_errors, 20),
]


@pytest.mark.parametrize(("metric", "draw", "n"), CELLS, ids=[f"{m}-{d.__name__}-{n}" for m, d, n in CELLS])
def test_null_pairs_are_promoted_at_most_at_the_level(
    metric: str, draw: Callable[[np.random.Generator, int], tuple[Scored, Scored]], n: int
) -> None:
    rng = np.random.default_rng([n, *map(ord, metric)])
    promoted = rejected = 0
    for sim in range(SIMULATIONS):
        challenger, champion = draw(rng, n)
        c = gate.compare(metric, challenger, champion, confidence=1 - LEVEL, seed=sim)
        promoted += gate.decide(c, "better", 0.0)[0]
        rejected += c.low > 0  # the test itself, the minimum number of rows aside
    assert promoted / SIMULATIONS <= BOUND, f"promoted {promoted} of {SIMULATIONS}"
    assert rejected / SIMULATIONS <= BOUND, f"the test rejected 'no better' {rejected} of {SIMULATIONS} times"
