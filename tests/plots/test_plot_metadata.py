"""A guarantee a mutation run found no test for (issue 24): every plot's PNG carries no "Software" text chunk
(matplotlib's version), so a matplotlib upgrade does not change the bytes of DVC-tracked plots and rerun nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from trainflow import plots


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
