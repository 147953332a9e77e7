"""Guarantees a mutation run found no test for (issue 24), each checked against a value computed here:

- every plot's PNG carries no "Software" text chunk (matplotlib's version), so a matplotlib upgrade does not change
  the bytes of DVC-tracked plots and rerun nothing;
- the calibration sums put a confidence in (0, 1/ECE_BINS] into the first bin (many-class models reach it);
- a boolean feature's missing values are filled with the majority value, False as well as True.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from trainflow import plots
from trainflow.data.preprocess import _fit_column
from trainflow.engine.objective import ECE_BINS, calibration_sums
from trainflow.params import FeatureParams


def test_every_plot_png_leaves_out_matplotlibs_version(tmp_path: Path) -> None:
    history = pd.DataFrame({"epoch": [1, 2, 3], "train_loss": [1.0, 0.6, 0.4], "val_loss": [1.1, 0.7, 0.5],
                            "val_accuracy": [0.5, 0.7, 0.8]})  # fmt: skip
    plots.training_curves(history, tmp_path / "curves.png")
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 60)
    proba = rng.dirichlet(np.ones(3), 60)
    plots.roc_pr_curves(labels, proba, ["a", "b", "c"], tmp_path / "roc.png")
    plots.confusion_matrix(labels, proba.argmax(1), ["a", "b", "c"], tmp_path / "cm.png")
    plots.predicted_vs_actual(rng.normal(size=60), rng.normal(size=60), tmp_path / "pva.png")
    for png in sorted(tmp_path.glob("*.png")):
        info = Image.open(png).info
        assert "Software" not in info, (png.name, info)


def test_the_calibration_sums_bin_every_confidence_as_computed_by_hand() -> None:
    confidence = torch.tensor([0.0, 0.03, 1 / ECE_BINS, 0.5, 0.95, 1.0], dtype=torch.float64)
    correct = torch.tensor([0, 1, 1, 0, 1, 1], dtype=torch.float64)
    labelled = torch.tensor([1, 1, 1, 1, 1, 0], dtype=torch.float64)
    got = calibration_sums(confidence, correct, labelled).reshape(3, ECE_BINS).numpy()
    # bin b holds (b/B, (b+1)/B], the first also 0: ceil(c * B) - 1, at least 0
    conf = confidence.numpy()
    bins = np.maximum(np.ceil(conf * ECE_BINS - 1e-12).astype(int) - 1, 0)
    expected = np.zeros((3, ECE_BINS))
    for b, c, ok, lab in zip(bins, conf, correct.numpy(), labelled.numpy(), strict=True):
        expected[:, b] += [lab, c * lab, ok]
    assert bins[:3].tolist() == [0, 0, 0]  # 0, 0.03 and 1/B are the first bin's
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("values", "fill"), [([True, True, False, None], 1.0), ([False, False, True, None], 0.0)])
def test_a_boolean_features_missing_values_take_the_majority_value(values: list[bool | None], fill: float) -> None:
    column = _fit_column(pd.Series(values, dtype="boolean"), "flag", "boolean", FeatureParams(), "train")
    assert column.fill == [fill]
