"""Plots stay readable (a 220-class confusion matrix is the 19 most frequent classes and "other", at most 1,200 px; a
2-class one is 500 px with nothing cut off; cells are row shares with counts, numeric labels in numeric order), and
dvc.yaml plots only files evaluate writes for both tasks (else `dvc plots show` warns on every run)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
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


def drawn_matrix(
    monkeypatch: pytest.MonkeyPatch, actual: np.ndarray, predicted: np.ndarray, classes: list[str], png: Path
) -> Any:
    """The axes of the confusion matrix `plots.confusion_matrix` draws (kept open for the test to read)."""
    import matplotlib.pyplot as plt

    figures: list[Any] = []
    monkeypatch.setattr(plt, "close", figures.append)
    plots.confusion_matrix(actual, predicted, classes, png)
    monkeypatch.undo()
    (figure,) = figures
    figure.canvas.draw()
    return figure.axes[0]


def test_a_two_class_matrix_is_big_enough_and_nothing_is_cut_off(tmp_path: Path) -> None:
    import matplotlib.image

    actual = np.array([0] * 30 + [1] * 11)
    predicted = np.array([0] * 28 + [1] * 2 + [1] * 8 + [0] * 3)
    png = tmp_path / "m.png"
    plots.confusion_matrix(actual, predicted, ["no", "yes"], png)
    pixels = matplotlib.image.imread(png)
    assert min(pixels.shape[:2]) >= 500  # was 200 x 200
    border = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])[:, :3]
    assert (border > 0.95).all()  # a white margin all round: the title was cut off at the right edge


def test_cells_are_row_shares_with_counts_in_numeric_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Numeric labels show in numeric order, whatever order the class list has; each cell is the share of its row
    (sklearn's confusion_matrix normalised by the true labels), then the count."""
    from sklearn.metrics import confusion_matrix

    classes = ["1", "10", "2"]  # as a string sort would have them
    rng = np.random.default_rng(3)
    actual = rng.choice(3, size=200, p=[0.6, 0.3, 0.1])
    predicted = np.where(rng.random(200) < 0.7, actual, rng.integers(0, 3, 200))
    values = np.array([1, 10, 2])
    order = [1, 2, 10]
    counts = confusion_matrix(values[actual], values[predicted], labels=order)
    shares = confusion_matrix(values[actual], values[predicted], labels=order, normalize="true")
    ax = drawn_matrix(monkeypatch, actual, predicted, classes, tmp_path / "m.png")
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1", "2", "10"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "10"]
    cells = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in ax.texts}
    expected = {(i, j): f"{shares[i, j]:.0%}\n({counts[i, j]})" for i in range(3) for j in range(3) if counts[i, j]}
    assert cells == expected  # was the count alone
    assert ax.get_images()[0].get_clim() == (0.0, 1.0)  # coloured by the share: a rare class reads as a common one


def test_text_labels_keep_the_model_s_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    actual, predicted = np.array([0, 1, 2, 1]), np.array([0, 2, 2, 1])
    ax = drawn_matrix(monkeypatch, actual, predicted, ["yes", "no", "maybe"], tmp_path / "m.png")
    assert [t.get_text() for t in ax.get_yticklabels()] == ["yes", "no", "maybe"]
    assert plots.display_order(["b", "a", plots.OTHER]) == [0, 1, 2]
    assert plots.display_order(["10", plots.OTHER, "2.5", "-1"]) == [3, 2, 0, 1]  # "other" stays last
