"""train.class_weights on a 95/5 imbalanced table: balanced weights (sklearn's, saved with the model) raise the
minority class's test recall, read from reports/per_class.csv."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from support.projects import make_project
from support.stages import trainflow

from trainflow.core.io import read_json
from trainflow.core.paths import Paths


def imbalanced(n: int = 3000, seed: int = 0) -> pd.DataFrame:
    """Two overlapping Gaussian classes, 95% 'common' and 5% 'rare': unweighted, a model mostly says 'common'."""
    rng = np.random.default_rng(seed)
    rare = rng.random(n) < 0.05
    x = rng.normal(0, 1, (n, 2)) + np.where(rare[:, None], 1.6, 0.0)
    return pd.DataFrame({"f0": x[:, 0], "f1": x[:, 1], "label": np.where(rare, "rare", "common")})


def rare_recall(root: Path) -> float:
    table = pd.read_csv(Paths(root).per_class).set_index("class")
    return float(table.loc["rare", "recall"])


def test_balanced_class_weights_raise_the_minority_recall(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = {"data.source": "data/raw/imb.csv", "data.target": "label", "register.model_name": "imb",
                "train.epochs": 6, "train.progress": "false", "train.batch_size": 64,
                "model.hidden_sizes": "[32]"}  # fmt: skip
    root = make_project(tmp_path / "imb", settings)
    frame = imbalanced()
    frame.to_csv(root / "data" / "raw" / "imb.csv", index=False)
    for stage in ("ingest", "split", "train", "evaluate"):
        assert trainflow(root, monkeypatch, "stage", stage) == 0, stage
    unweighted = rare_recall(root)
    assert read_json(Paths(root).final / "training.json")["class_weights"] is None

    assert trainflow(root, monkeypatch, "stage", "train", "-S", "train.class_weights=balanced") == 0
    assert trainflow(root, monkeypatch, "stage", "evaluate") == 0
    weighted = rare_recall(root)
    assert weighted >= unweighted + 0.3, (unweighted, weighted)
    # The weights saved with the model are sklearn's "balanced" on the train split.
    from sklearn.utils.class_weight import compute_class_weight

    train = pd.read_parquet(Paths(root).split_file("train"))
    classes = sorted(train["label"].unique())
    expected = compute_class_weight("balanced", classes=np.array(classes), y=train["label"].to_numpy())
    saved = read_json(Paths(root).final / "training.json")["class_weights"]
    assert np.allclose(saved, expected, rtol=1e-6)
