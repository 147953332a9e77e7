"""Plots stay readable (a 220-class confusion matrix is the 19 most frequent classes and "other", at most 1,200 px),
and dvc.yaml plots only files evaluate writes for both tasks (else `dvc plots show` warns on every run)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import yaml

from trainflow import plots

REPO = Path(__file__).resolve().parents[2]


def test_many_classes_become_the_most_frequent_and_other(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    k = 220
    actual = rng.zipf(1.3, size=3000) % k
    predicted = np.where(rng.random(3000) < 0.7, actual, rng.integers(0, k, 3000))
    classes = [f"fare {i}" for i in range(k)]
    top_actual, top_predicted, names = plots.top_classes(actual, predicted, classes)
    most = [classes[c] for c, _ in Counter(actual.tolist()).most_common(19)]
    assert list(names) == [*most, "(other)"]  # the 19 with most test rows, by count; then everything else
    others = sum(n for c, n in Counter(actual.tolist()).items() if classes[c] not in most)
    assert Counter(names[top_actual].tolist())["(other)"] == others
    kept = np.isin(predicted, [classes.index(m) for m in most])
    assert (names[top_predicted] == np.where(kept, np.asarray(classes, dtype=object)[predicted], "(other)")).all()
    png = tmp_path / "m.png"
    plots.confusion_matrix(actual, predicted, classes, png)
    import matplotlib.image

    height, width = matplotlib.image.imread(png).shape[:2]
    assert height <= 1200 and width <= 1200  # was 11,100 x 11,100 for 220 classes


def test_few_classes_are_kept_as_they_are() -> None:
    actual, predicted = np.array([0, 1, 2, 1]), np.array([0, 2, 2, 1])
    top_actual, top_predicted, names = plots.top_classes(actual, predicted, ["a", "b", "c"])
    assert list(names) == ["a", "b", "c"] and (top_actual == actual).all() and (top_predicted == predicted).all()


def test_regression_deciles_by_hand() -> None:
    actual = np.arange(1.0, 11.0)  # 1..10: deciles at 1, 1.9, 2.8, ..., 10
    binned_actual, binned_predicted = plots.decile_bins(actual, np.array([0.0, 1.0, 5.5, 10.0, 99.0]))
    assert len(set(binned_actual)) == 10  # one actual value per decile
    assert binned_actual[0] == "1-1.9" and binned_actual[-1] == "9.1-10"
    # Below the range: the first bin; above: the last; 5.5 falls in 5.5-6.4.
    assert list(binned_predicted) == ["1-1.9", "1-1.9", "5.5-6.4", "9.1-10", "9.1-10"]


def dvc_plot_files() -> list[str]:
    entries = yaml.safe_load((REPO / "dvc.yaml").read_text())["plots"]
    return [next(iter(e)) if isinstance(e, dict) else e for e in entries]


def test_dvc_plots_only_names_files_both_tasks_write() -> None:
    """The test plots evaluate writes are the same files for classification and regression."""
    import inspect

    from trainflow.stages import evaluate

    source = inspect.getsource(evaluate.run)
    for path in dvc_plot_files():
        if path.startswith("reports/plots/test/"):
            name = Path(path).name
            regression, classification = source.split("else:", 1)
            assert f'"{name}"' in regression and f'"{name}"' in classification, name
