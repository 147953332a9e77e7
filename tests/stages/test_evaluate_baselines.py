"""evaluate's baselines on a real project: metrics.json holds logistic regression's and gradient boosting's test
metrics, each equal to scikit-learn's own fit here on the train split's feature matrix (all of it, or the seeded sample
of a bigger table) scored on the test rows; a rerun writes the same bytes; the card and the run summary show them
beside the network's; text, images and streamed tables get none, with a line saying why."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, f1_score, log_loss
from support.projects import blobs

from trainflow import baselines
from trainflow.artifacts.predict import ExportedModel
from trainflow.core.io import read_json
from trainflow.core.paths import Paths
from trainflow.data.preprocess import Preprocessor
from trainflow.data.stream import Split
from trainflow.params import DataParams, load_params, write_overrides
from trainflow.registry import card
from trainflow.stages import report, run_stage
from trainflow.stages.evaluate import baseline_metrics


def by_hand(paths: Paths, rows: np.ndarray | None = None) -> dict[str, float]:
    """scikit-learn's models on the exported preprocessing's matrix of the train split (`rows` of it), scored with
    sklearn.metrics on the test split, every class of the model a column of the probabilities."""
    pre = Preprocessor.load(paths.final)
    train, test = Split.stored(paths.splits, "train").read(), Split.stored(paths.splits, "test").read()
    if rows is not None:
        train = train.iloc[rows]
    x, y = pre.features(train).astype(np.float64), pre.labels(train)
    x_test, y_test = pre.features(test).astype(np.float64), pre.labels(test)
    k = len(pre.classes)
    out = {}
    for name, model in (("linear", LogisticRegression(max_iter=1000)),
                        ("boosting", HistGradientBoostingClassifier(random_state=0))):  # fmt: skip
        model.fit(x, y)
        proba = np.zeros((len(test), k))
        proba[:, model.classes_] = model.predict_proba(x_test)
        out |= {f"baseline_{name}.accuracy": accuracy_score(y_test, proba.argmax(axis=1)),
                f"baseline_{name}.f1_macro": f1_score(y_test, proba.argmax(axis=1), average="macro"),
                f"baseline_{name}.log_loss": log_loss(y_test, proba, labels=list(range(k)))}  # fmt: skip
    return out


def test_evaluate_scores_the_baselines_on_the_same_rows_and_says_when_it_fits_none(
    csv_project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = Paths(csv_project)
    blobs(n=300, separation=1.5).to_csv(csv_project / "data/raw/blobs.csv", index=False)
    write_overrides(paths.params, ["train.epochs=1"])
    for stage in ("ingest", "split", "train", "evaluate"):
        run_stage(stage, load_params(paths.params), paths)
    metrics = read_json(paths.metrics)
    fitted = {k: v for k, v in metrics.items() if k.startswith("baseline_")}
    assert fitted == pytest.approx(by_hand(paths), rel=1e-9)
    assert len(fitted) == 6 and 0.5 < fitted["baseline_linear.accuracy"] < 1  # overlapping blobs: some mistakes

    # Beside the network's: one line in the run summary, a row of the card's test metrics table.
    line = (f"accuracy {metrics['accuracy']:.4g} (logistic regression {metrics['baseline_linear.accuracy']:.4g}, "
            f"gradient boosting {metrics['baseline_boosting.accuracy']:.4g})")  # fmt: skip
    assert f"  baseline: {line} on the same test rows" in report.summary(paths, {}).splitlines()
    test = card.sections(paths, {}, metrics, None, seed=0)[2]
    assert test.tables[0][1][-1] == ["the network vs the baselines", line, "—",
                                     "fitted on the same train split, scored on the same test rows"]  # fmt: skip
    assert [row[0] for row in test.tables[0][1][:-1]] == sorted(k for k in metrics if "." not in k and k != "n_test")

    written = paths.metrics.read_bytes()  # a rerun: the same bytes, so DVC sees nothing to do
    run_stage("evaluate", load_params(paths.params), paths)
    assert paths.metrics.read_bytes() == written

    # A table over SAMPLE_ROWS train rows: fitted on a seeded sample of them, the same rows every run.
    monkeypatch.setattr(baselines, "SAMPLE_ROWS", 100)
    n = len(Split.stored(paths.splits, "train"))
    rows = np.sort(np.random.default_rng(0).choice(n, 100, replace=False))
    exported = ExportedModel.load(paths.final)
    sampled = baseline_metrics(exported, paths, DataParams())
    assert sampled == pytest.approx(by_hand(paths, rows), rel=1e-9) and sampled != pytest.approx(fitted)

    capsys.readouterr()
    assert baseline_metrics(exported, paths, DataParams(memory_budget_mb=1e-6)) == {}
    said = "evaluate: no baselines: the table is streamed from disk (data.memory_budget_mb); they are fitted on "
    assert capsys.readouterr().err == said + "tables held in memory\n"
    for column, what in (("text_column", "text"), ("image_column", "images")):
        model = SimpleNamespace(pre=SimpleNamespace(**{"text_column": None, "image_column": None, column: "c"}))
        assert baseline_metrics(model, paths, DataParams()) == {}  # type: ignore[arg-type]
        assert capsys.readouterr().err == (f"evaluate: no baselines: the model reads {what}; they are fitted on "
                                           "tables held in memory\n")  # fmt: skip
