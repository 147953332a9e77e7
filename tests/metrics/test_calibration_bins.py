"""The model card's reliability table and the ece in metrics.json (and training's val_ece) put a confidence that lies
exactly on a bin edge in the same bin: (lo, hi], the first bin also holding 0, as sklearn's calibration_curve does.
The bins are computed here one comparison at a time, in plain Python, on top-class probabilities 0.1, 0.2, ... 1.0."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainflow.engine.objective import CALIBRATION, ECE_BINS, Objective, calibration_sums
from trainflow.metrics import expected_calibration_error
from trainflow.registry import card
from trainflow.registry.gate import Scored

CLASSES = 10  # a top probability as low as 0.1 needs ten classes


EDGES = [k / 10 for k in range(1, 11)]
BETWEEN = [0.15, 0.35, 0.39, 0.55, 0.75, 0.95]


def edge_rows() -> tuple[np.ndarray, np.ndarray]:
    """(labels, proba): two right rows at each top probability 0.1 ... 1.0 and wrong ones between the edges, the rest
    of each row spread evenly over the other classes (never above the top one). A bin's calibration gap then changes
    sign with the rows an edge puts in it, so ece moves when an edge row changes bins."""
    tops = [e for e in EDGES for _ in range(2)] + BETWEEN
    rows, labels = [], []
    for i, top in enumerate(tops):
        row = np.full(CLASSES, (1 - top) / (CLASSES - 1))
        row[0] = top
        rows.append(row)
        labels.append(0 if top in EDGES else 1 + i % (CLASSES - 1))  # class 0 is the top one: right, else wrong
    proba = np.array(rows)
    assert proba.max(axis=1).tolist() == tops  # the top probability is exactly the edge, bit for bit
    return np.array(labels), proba


def bin_by_hand(confidence: float, bins: int) -> int:
    """The first bin whose upper edge b / bins is not below the confidence: (lo, hi], 0 in bin 0."""
    for b in range(bins):
        if confidence <= (b + 1) / bins:
            return b
    raise AssertionError(f"confidence {confidence} above 1")


def reliability_by_hand(labels: np.ndarray, proba: np.ndarray, bins: int) -> list[list[str]]:
    members: dict[int, list[tuple[float, bool]]] = {}
    for y, row in zip(labels.tolist(), proba.tolist(), strict=True):
        top = max(row)
        members.setdefault(bin_by_hand(top, bins), []).append((top, row.index(top) == y))
    table = []
    for b in sorted(members):
        tops, right = [t for t, _ in members[b]], [r for _, r in members[b]]
        table.append([f"{b / bins:.1f}–{(b + 1) / bins:.1f}", str(len(tops)), f"{sum(tops) / len(tops):.3f}",
                      f"{sum(right) / len(right):.3f}"])  # fmt: skip
    return table


def ece_by_hand(labels: np.ndarray, proba: np.ndarray, bins: int) -> float:
    gaps = [0.0] * bins
    for y, row in zip(labels.tolist(), proba.tolist(), strict=True):
        top = max(row)
        gaps[bin_by_hand(top, bins)] += (row.index(top) == y) - top
    return sum(abs(g) for g in gaps) / len(labels)


def test_the_cards_reliability_bins_close_on_the_right_as_ece_does_on_edges() -> None:
    labels, proba = edge_rows()
    expected = reliability_by_hand(labels, proba, card.CALIBRATION_BINS)
    # 0.1 and 0.2 are the tops of the first two bins; 1.0 the top of the last
    assert [row[:2] for row in expected[:2]] == [["0.0–0.1", "2"], ["0.1–0.2", "3"]]
    assert card.calibration(Scored(labels, proba)) == expected


@pytest.mark.parametrize("bins", [10, ECE_BINS])
def test_ece_bins_the_same_edges_the_same_way(bins: int) -> None:
    """10 bins: every edge 0.1 ... 1.0; 15 (the default): 0.2, 0.4, ... are edges too (3/15 is the float 0.2)."""
    labels, proba = edge_rows()
    expected = ece_by_hand(labels, proba, bins)
    assert expected_calibration_error(labels, proba, bins=bins) == pytest.approx(expected, abs=1e-12)
    if bins == ECE_BINS:  # training's val_ece: the same bins on the device
        confidence = torch.tensor(proba.max(axis=1))
        correct = torch.tensor(proba.argmax(axis=1) == labels)
        sums = dict(zip(CALIBRATION, calibration_sums(confidence, correct, torch.ones(len(labels), dtype=torch.bool))
                        .tolist()))  # fmt: skip
        counts = [int(sums[f"bin{b}_count"]) for b in range(bins)]
        assert counts == [sum(bin_by_hand(t, bins) == b for t in proba.max(axis=1).tolist()) for b in range(bins)]
        metrics = Objective("classification").metrics({"loss": 0.0, "count": float(len(labels)), "correct": 0.0,
                                                        **sums})  # fmt: skip
        assert metrics["val_ece"] == pytest.approx(expected, abs=1e-12)
