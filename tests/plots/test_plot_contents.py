"""trainflow.plots pinned exactly (issue 24): what each figure draws, read back from its artists (line data, labels,
tick labels, legends, the image array, text sizes and colours), how big its PNG is, and the tables behind the plots
(ROC/PR points, the confusion counts, the class merging and ordering), each against values worked out by hand or by
numpy/sklearn directly."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from trainflow import plots


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every figure a plot closes, kept open to read back (plt.close is called with the figure it drew), and closed
    after the test (pyplot keeps open figures: the suite would hold dozens)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    close = plt.close
    kept: list[Any] = []
    monkeypatch.setattr(plt, "close", kept.append)
    yield kept
    for fig in kept:
        close(fig)


def png_size(path: Path) -> tuple[int, int]:
    with Image.open(path) as image:
        assert image.format == "PNG"
        assert "Software" not in image.info
        return image.size


def box(ax: Any) -> list[float]:
    return [round(float(v), 6) for v in ax.get_position().bounds]


def xy(line: Any) -> tuple[list[float], list[float]]:
    return [float(v) for v in line.get_xdata()], [float(v) for v in line.get_ydata()]


# --- small helpers and tables -----------------------------------------------------------------------------------------


def test_figure_is_pyplot_on_the_agg_backend() -> None:
    import matplotlib
    import matplotlib.pyplot as plt

    assert plots._figure() is plt
    assert matplotlib.get_backend().lower() == "agg"


def test_write_csv_writes_the_frame_without_its_index(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "t.csv"
    plots.write_csv(pd.DataFrame({"a": [1, 2], "b": ["x", "y"]}, index=[7, 9]), path)
    assert path.read_text() == "a,b\n1,x\n2,y\n"
    assert [p.name for p in path.parent.iterdir()] == ["t.csv"]  # no temp file left beside it


def test_twenty_classes_are_kept_and_twenty_one_merge_the_rarest_two() -> None:
    actual = np.arange(20)
    same = plots.top_classes(actual, actual[::-1], [f"c{i}" for i in range(20)])
    assert same[0] is actual and list(same[1]) == list(range(19, -1, -1))
    assert same[2].dtype == object and list(same[2]) == [f"c{i}" for i in range(20)]
    # 21 classes: class i has 21 - i rows except class 5 (one row) and class 20 (one row): the two rarest.
    actual = np.array([c for c in range(21) for _ in range(1 if c in (5, 20) else 30 - c)])
    predicted = np.array([20, 5, 0, 1])
    a, p, names = plots.top_classes(actual, predicted, [f"c{i}" for i in range(21)])
    kept = [c for c in range(21) if c not in (5, 20)]  # by count, most first: 0, 1, 2, ... (30 - c rows)
    assert list(names) == [f"c{c}" for c in kept] + ["(other)"] and names.dtype == object
    assert list(p) == [19, 19, 0, 1]
    index = {c: i for i, c in enumerate(kept)} | {5: 19, 20: 19}
    assert list(a) == [index[c] for c in actual.tolist()]


def test_top_classes_break_ties_by_class_index() -> None:
    actual = np.array([c for c in range(22) for _ in range(2)] + [21])  # every class 2 rows, class 21 three
    _, _, names = plots.top_classes(actual, actual, [f"k{i}" for i in range(22)])
    assert list(names) == ["k21", *(f"k{i}" for i in range(18)), "(other)"]


def test_deciles_of_one_value_are_one_bin_named_by_the_value() -> None:
    a, p = plots.decile_bins(np.array([2.5, 2.5, 2.5]), np.array([1.0, 2.5, 9.0]))
    assert list(a) == ["2.5", "2.5", "2.5"] and list(p) == ["2.5", "2.5", "2.5"]
    assert a.dtype == object


def test_deciles_of_two_values_and_the_clip_at_both_ends() -> None:
    actual = np.array([0.0, 0.0, 0.0, 1000.0])  # quantiles: 0 up to the 70th, then 0.3 * 1000 ... : edges 0, 100, ...
    edges = np.unique(np.quantile(actual, np.linspace(0, 1, 11)))
    assert list(edges) == pytest.approx([0.0, 100.0, 400.0, 700.0, 1000.0])
    a, p = plots.decile_bins(actual, np.array([-5.0, 0.0, 99.9, 101.0, 401.0, 999.0, 1000.0, 5000.0]))
    assert list(a) == ["0-100", "0-100", "0-100", "700-1e+03"]
    assert list(p) == ["0-100", "0-100", "0-100", "100-400", "400-700", "700-1e+03", "700-1e+03", "700-1e+03"]


def test_display_order_sorts_numbers_by_value_and_keeps_ties_and_text_as_given() -> None:
    assert plots.display_order(["3", "1.0", "1", "-2"]) == [3, 1, 2, 0]  # 1.0 and 1 tie: the model's order
    assert plots.display_order(["b", "10", "a"]) == [0, 1, 2]  # one text label: all in the model's order
    assert plots.display_order([plots.OTHER, "2", "1"]) == [2, 1, 0]
    assert plots.display_order([]) == []


def test_confusion_counts_by_hand_in_numeric_order() -> None:
    actual = np.array([0, 0, 1, 2, 2, 2])
    predicted = np.array([0, 2, 1, 2, 0, 2])
    counts, names = plots.confusion_counts(actual, predicted, ["10", "5", "7"])
    assert list(names) == ["5", "7", "10"]
    # rows/columns in the order 5 (class 1), 7 (class 2), 10 (class 0)
    assert counts.tolist() == [[1, 0, 0], [0, 2, 1], [0, 1, 1]]
    assert counts.dtype == np.int64


def test_row_rates_are_row_shares_and_nan_for_an_empty_row() -> None:
    rates = plots.row_rates(np.array([[1, 3], [0, 0], [2, 0], [0, 1]]))
    assert rates[0].tolist() == [0.25, 0.75] and rates[2].tolist() == [1.0, 0.0]
    assert rates[3].tolist() == [0.0, 1.0]  # a class with one test row
    assert np.isnan(rates[1]).all()


def test_history_frame_orders_the_middle_columns_by_name() -> None:
    frame = plots.history_frame(
        [{"val_z": 1.0, "lr": 0.5, "train_loss": 2.0, "epoch": 1, "update": 3, "alpha": 9.0},
         {"val_z": 1.5, "lr": 0.25, "train_loss": 1.0, "epoch": 2, "update": 6, "alpha": 8.0}]
    )  # fmt: skip
    assert list(frame.columns) == ["update", "epoch", "train_loss", "alpha", "val_z", "lr"]
    assert frame.to_dict("list") == {
        "update": [3, 6], "epoch": [1, 2], "train_loss": [2.0, 1.0], "alpha": [9.0, 8.0], "val_z": [1.0, 1.5],
        "lr": [0.5, 0.25],
    }  # fmt: skip


# --- ROC / PR tables --------------------------------------------------------------------------------------------------


def test_curve_classes_binary_needs_both_labels() -> None:
    assert plots.curve_classes(np.array([0, 1, 0]), 2) == [1]
    assert plots.curve_classes(np.array([1, 1]), 2) == []
    assert plots.curve_classes(np.array([0, 0]), 2) == []


def test_curve_classes_are_the_ten_most_frequent_with_rows() -> None:
    labels = np.array([c for c in range(12) for _ in range(c + 1)])  # class c has c + 1 rows
    assert plots.curve_classes(labels, 12) == [11, 10, 9, 8, 7, 6, 5, 4, 3, 2]
    assert plots.curve_classes(np.array([0, 2, 2]), 4) == [2, 0]  # classes 1 and 3: no rows
    assert plots.curve_classes(np.array([2, 2]), 3) == []  # one class only: no negatives, no curve
    ties = plots.curve_classes(np.array([3, 1, 1, 3, 0]), 4)
    assert ties == [1, 3, 0] and all(type(c) is int for c in ties)


def test_binary_curves_by_hand() -> None:
    labels = np.array([0, 0, 1, 1])
    proba = np.array([[0.9, 0.1], [0.6, 0.4], [0.65, 0.35], [0.2, 0.8]])
    roc, pr = plots.curves(labels, proba, ["no", "yes"])
    assert list(roc.columns) == plots.ROC_COLUMNS == ["class", "fpr", "tpr", "threshold"]
    assert list(pr.columns) == plots.PR_COLUMNS == ["class", "recall", "precision", "threshold"]
    assert roc["class"].tolist() == ["yes"] * 5
    assert roc["fpr"].tolist() == [0.0, 0.0, 0.5, 0.5, 1.0]
    assert roc["tpr"].tolist() == [0.0, 0.5, 0.5, 1.0, 1.0]
    assert roc["threshold"].tolist() == [np.inf, 0.8, 0.4, 0.35, 0.1]
    # thresholds 0.1, 0.35, 0.4, 0.8: precision 2/4, 2/3, 1/2, 1/1; recall 1, 1, 0.5, 0.5; then (0, 1)
    assert pr["class"].tolist() == ["yes"] * 5
    assert pr["recall"].tolist() == [1.0, 1.0, 0.5, 0.5, 0.0]
    assert pr["precision"].tolist() == pytest.approx([0.5, 2 / 3, 0.5, 1.0, 1.0], abs=1e-12)
    assert pr["threshold"].tolist()[:4] == [0.1, 0.35, 0.4, 0.8] and np.isnan(pr["threshold"].iloc[4])
    assert list(roc.index) == [0, 1, 2, 3, 4] and list(pr.index) == [0, 1, 2, 3, 4]


def test_one_vs_rest_curves_follow_the_classes_by_frequency_and_renumber_rows() -> None:
    from sklearn.metrics import roc_curve

    labels = np.array([2, 2, 2, 0, 0, 1])
    proba = np.array(
        [[0.1, 0.1, 0.8], [0.2, 0.2, 0.6], [0.5, 0.1, 0.4], [0.7, 0.2, 0.1], [0.3, 0.3, 0.4], [0.2, 0.7, 0.1]]
    )
    roc, pr = plots.curves(labels, proba, ["a", "b", "c"])
    expected = [roc_curve(labels == c, proba[:, c]) for c in (2, 0, 1)]
    sizes = [len(e[0]) for e in expected]
    assert roc["class"].tolist() == ["c"] * sizes[0] + ["a"] * sizes[1] + ["b"] * sizes[2]
    assert roc["fpr"].tolist() == [v for e in expected for v in e[0].tolist()]
    assert roc["tpr"].tolist() == [v for e in expected for v in e[1].tolist()]
    assert list(roc.index) == list(range(sum(sizes)))
    assert pr["class"].unique().tolist() == ["c", "a", "b"] and list(pr.index) == list(range(len(pr)))
    ends = pr.groupby("class", sort=False).tail(1)
    assert ends["recall"].tolist() == [0.0, 0.0, 0.0] and ends["precision"].tolist() == [1.0, 1.0, 1.0]
    assert ends["threshold"].isna().all() and pr["threshold"].isna().sum() == 3


def test_no_curve_gives_empty_tables_with_the_columns() -> None:
    roc, pr = plots.curves(np.array([1, 1, 1]), np.array([[0.2, 0.8]] * 3), ["no", "yes"])
    assert list(roc.columns) == ["class", "fpr", "tpr", "threshold"] and len(roc) == 0
    assert list(pr.columns) == ["class", "recall", "precision", "threshold"] and len(pr) == 0


def test_thin_keeps_a_thousand_points_evenly_spaced_with_both_ends() -> None:
    frame = pd.DataFrame({"v": np.arange(1000)})
    assert plots._thin(frame) is frame
    long = pd.DataFrame({"v": np.arange(2999)})  # 2998 / 999 = 3.001...: every third, rounded
    thinned = plots._thin(long)
    expected = sorted({int(round(i * 2998 / 999)) for i in range(1000)})
    assert len(thinned) == len(expected) == 1000
    assert thinned["v"].tolist() == expected and expected[0] == 0 and expected[-1] == 2998


def test_a_long_curve_is_thinned_in_the_tables() -> None:
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 2, 3000)
    proba1 = rng.random(3000)
    proba = np.stack([1 - proba1, proba1], axis=1)
    roc, pr = plots.curves(labels, proba, ["n", "p"])
    assert len(pr) == 1000  # 3001 points (one per distinct score, and the end point): thinned
    assert pr["recall"].iloc[-1] == 0.0 and pr["recall"].iloc[0] == 1.0 and np.isnan(pr["threshold"].iloc[-1])
    assert 1000 < 3001 and len(roc) <= 1000 and roc["threshold"].iloc[0] == np.inf


# --- the figures ------------------------------------------------------------------------------------------------------


def reference_layout(figsize: tuple[float, float], build: Any) -> Any:
    """A figure laid out by matplotlib itself (tight_layout), to compare a plot's axes positions against."""
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=figsize)
    build(fig)
    fig.tight_layout()
    fig.canvas.draw()  # as savefig does: a colour bar takes its final width when drawn
    return fig


def test_training_curves_png_layout_and_legends(tmp_path: Path, figures: list[Any]) -> None:
    history = pd.DataFrame(
        {
            "epoch": [1, 2, 3],
            "train_loss": [0.9, 0.5, 0.4],
            "val_loss": [1.0, 0.7, 0.6],
            "val_accuracy": [0.5, 0.6, 0.9],
        }
    )
    plots.training_curves(history, tmp_path / "c.png")
    assert png_size(tmp_path / "c.png") == (1000, 400)
    (fig,) = figures
    loss, metric = fig.axes
    assert [xy(line) for line in loss.get_lines()] == [([1, 2, 3], [0.9, 0.5, 0.4]), ([1, 2, 3], [1.0, 0.7, 0.6])]
    assert [t.get_text() for t in loss.get_legend().get_texts()] == ["train", "val"]
    assert (loss.get_xlabel(), loss.get_ylabel(), loss.get_title()) == ("epoch", "loss (mean per sample)", "Loss")
    assert metric.get_legend() is None
    assert xy(metric.get_lines()[0]) == ([1, 2, 3], [0.5, 0.6, 0.9])
    assert (metric.get_xlabel(), metric.get_ylabel(), metric.get_title()) == (
        "epoch",
        "accuracy",
        "Validation accuracy",
    )

    def build(ref: Any) -> None:
        a, b = ref.subplots(1, 2)
        a.plot([1, 2, 3], [0.9, 0.5, 0.4], label="train")
        a.plot([1, 2, 3], [1.0, 0.7, 0.6], label="val")
        a.set(xlabel="epoch", ylabel="loss (mean per sample)", title="Loss")
        a.legend()
        b.plot([1, 2, 3], [0.5, 0.6, 0.9])
        b.set(xlabel="epoch", ylabel="accuracy", title="Validation accuracy")

    ref = reference_layout((10, 4), build)
    assert [box(ax) for ax in fig.axes] == [box(ax) for ax in ref.axes]  # laid out tight


def test_predicted_vs_actual_marks_and_size(tmp_path: Path, figures: list[Any]) -> None:
    plots.predicted_vs_actual(np.array([3.0, -1.0]), np.array([2.0, 7.0]), tmp_path / "p.png")
    assert png_size(tmp_path / "p.png") == (500, 500)
    (fig,) = figures
    (ax,) = fig.axes
    points = ax.collections[0]
    assert points.get_offsets().tolist() == [[3.0, 2.0], [-1.0, 7.0]]
    assert points.get_sizes().tolist() == [6.0] and points.get_alpha() == 0.5
    (diagonal,) = ax.get_lines()
    assert xy(diagonal) == ([-1.0, 7.0], [-1.0, 7.0])
    assert diagonal.get_color() == "tab:red" and diagonal.get_linewidth() == 1

    def build(ref: Any) -> None:
        a = ref.subplots()
        a.scatter([3.0, -1.0], [2.0, 7.0], s=6, alpha=0.5)
        a.plot([-1.0, 7.0], [-1.0, 7.0], color="tab:red", linewidth=1)
        a.set(xlabel="actual", ylabel="predicted", title="Predicted vs actual (test)")

    assert box(ax) == box(reference_layout((5, 5), build).axes[0])


def drawn_matrix(figures: list[Any], tmp_path: Path, actual: Any, predicted: Any, classes: list[str]) -> Any:
    png = tmp_path / f"cm{len(figures)}.png"
    plots.confusion_matrix(np.asarray(actual), np.asarray(predicted), classes, png)
    fig = figures[-1]
    side = fig.get_size_inches()
    assert png_size(png) == (round(side[0] * 100), round(side[1] * 100))
    return fig


def cells(ax: Any) -> dict[tuple[int, int], tuple[str, float, str, str, str]]:
    return {
        (round(t.get_position()[1]), round(t.get_position()[0])): (
            t.get_text(), t.get_fontsize(), t.get_color(), t.get_ha(), t.get_va()
        )
        for t in ax.texts
    }  # fmt: skip


def test_a_small_matrix_cells_colours_and_image(tmp_path: Path, figures: list[Any]) -> None:
    # actual a: 1 a, 1 b (50% / 50%); b: 3 b (100%); c: 2 a, 1 b... (200 rows: 1 c of 201 is < 1%); d: no rows.
    actual = [0, 0, 1, 1, 1] + [2] * 201
    predicted = [0, 1, 1, 1, 1] + [0] * 199 + [1] + [2]
    fig = drawn_matrix(figures, tmp_path, actual, predicted, ["a", "b", "c", "d"])
    ax, bar = fig.axes
    assert list(fig.get_size_inches()) == [6.0, 5.0]  # 4 classes: the minimum side, 5 inches, + 1 for the bar
    assert cells(ax) == {
        (0, 0): ("50%\n(1)", 11.0, "black", "center", "center"),  # exactly half: black
        (0, 1): ("50%\n(1)", 11.0, "black", "center", "center"),
        (1, 1): ("100%\n(3)", 11.0, "white", "center", "center"),
        (2, 0): (f"{199 / 201:.0%}\n(199)", 11.0, "white", "center", "center"),
        (2, 1): ("<1%\n(1)", 11.0, "black", "center", "center"),
        (2, 2): ("<1%\n(1)", 11.0, "black", "center", "center"),
    }
    image = ax.get_images()[0]
    expected = np.array([[0.5, 0.5, 0, 0], [0, 1, 0, 0], [199 / 201, 1 / 201, 1 / 201, 0], [0, 0, 0, 0]])
    assert np.asarray(image.get_array()).tolist() == expected.tolist()  # the empty row d: zeros, not NaN
    assert image.get_cmap().name == "Blues" and image.get_clim() == (0.0, 1.0)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c", "d"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b", "c", "d"]
    assert list(ax.get_xticks()) == [0, 1, 2, 3] and list(ax.get_yticks()) == [0, 1, 2, 3]
    assert [(t.get_rotation(), t.get_ha()) for t in ax.get_xticklabels()] == [(45.0, "right")] * 4
    assert [(t.get_rotation(), t.get_ha()) for t in ax.get_yticklabels()] == [(0.0, "right")] * 4
    assert ax.get_title() == "Confusion matrix (test)\neach cell: % of the actual class's rows (count)"
    assert ax.title.get_fontsize() == 11
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("predicted", "actual")
    assert bar.get_ylabel() == "share of the actual class's test rows"

    def build(ref: Any) -> None:
        a = ref.subplots()
        im = a.imshow(np.nan_to_num(expected), cmap="Blues", vmin=0.0, vmax=1.0)
        ref.colorbar(im, ax=a, fraction=0.046, pad=0.04, label="share of the actual class's test rows")
        a.set(xticks=range(4), yticks=range(4), xticklabels=list("abcd"), yticklabels=list("abcd"))
        a.set(xlabel="predicted", ylabel="actual")
        a.set_title("Confusion matrix (test)\neach cell: % of the actual class's rows (count)", fontsize=11)
        for label in a.get_xticklabels():
            label.set(rotation=45, ha="right")

    ref = reference_layout((6.0, 5.0), build)
    assert [box(a) for a in fig.axes] == [box(a) for a in ref.axes]  # the colour bar's size and gap, laid out tight


def test_a_row_at_exactly_half_a_percent_shows_its_rounded_share(tmp_path: Path, figures: list[Any]) -> None:
    actual, predicted = [0] * 200 + [1], [1] + [0] * 199 + [1]  # 1 of 200 rows: 0.005, shown as "0%"
    ax = drawn_matrix(figures, tmp_path, actual, predicted, ["x", "y"]).axes[0]
    assert cells(ax)[(0, 1)][0] == f"{1 / 200:.0%}\n(1)" == "0%\n(1)"


@pytest.mark.parametrize(
    ("k", "size", "fontsize"),
    [(5, (6.0, 5.0), 11), (6, (6.0, 5.0), 9), (9, (6.5, 5.5), 9), (10, (7.0, 6.0), 9), (11, (7.5, 6.5), 7),
     (20, (12.0, 11.0), 7)],
)  # fmt: skip
def test_the_matrix_grows_with_the_classes_and_its_text_shrinks(
    tmp_path: Path, figures: list[Any], k: int, size: tuple[float, float], fontsize: int
) -> None:
    labels = list(range(k))
    fig = drawn_matrix(figures, tmp_path, labels, labels, [f"c{i}" for i in range(k)])
    assert tuple(fig.get_size_inches()) == size  # side min(11, max(5, 1 + k / 2)) + 1 inch for the bar
    assert {t.get_fontsize() for t in fig.axes[0].texts} == {fontsize}
    assert len(fig.axes[0].texts) == k
    assert fig.axes[0].get_title().startswith("Confusion matrix (test)\n")


def test_many_classes_name_the_top_ones_in_the_title(tmp_path: Path, figures: list[Any]) -> None:
    labels = [c for c in range(25) for _ in range(25 - c)]  # class c: 25 - c rows
    fig = drawn_matrix(figures, tmp_path, labels, labels, [f"c{i}" for i in range(25)])
    ax = fig.axes[0]
    assert ax.get_title() == "Confusion matrix (test): top 19 of 25\neach cell: % of the actual class's rows (count)"
    assert tuple(fig.get_size_inches()) == (12.0, 11.0)
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"c{i}" for i in range(19)] + ["(other)"]
    assert cells(ax)[(19, 19)][:3] == ("100%\n(21)", 7, "white")  # 6 + 5 + 4 + 3 + 2 + 1 rows of the rarest six


def roc_figure(figures: list[Any], tmp_path: Path, labels: Any, proba: Any, classes: list[str]) -> Any:
    png = tmp_path / f"roc{len(figures)}.png"
    plots.roc_pr_curves(np.asarray(labels), np.asarray(proba), classes, png)
    assert png_size(png) == (1000, 450)
    return figures[-1]


def test_roc_and_pr_axes_by_hand(tmp_path: Path, figures: list[Any]) -> None:
    proba = [[0.9, 0.1], [0.6, 0.4], [0.65, 0.35], [0.2, 0.8]]
    fig = roc_figure(figures, tmp_path, [0, 0, 1, 1], proba, ["no", "yes"])
    roc, pr = fig.axes
    diagonal, curve = roc.get_lines()
    assert xy(diagonal) == ([0, 1], [0, 1])
    assert (diagonal.get_color(), diagonal.get_linestyle(), diagonal.get_linewidth()) == ("grey", "--", 1.0)
    assert xy(curve) == ([0.0, 0.0, 0.5, 0.5, 1.0], [0.0, 0.5, 0.5, 1.0, 1.0])
    (steps,) = pr.get_lines()
    assert xy(steps)[0] == [1.0, 1.0, 0.5, 0.5, 0.0]
    assert xy(steps)[1] == pytest.approx([0.5, 2 / 3, 0.5, 1.0, 1.0], abs=1e-12)
    assert steps.get_drawstyle() == "steps-post" and steps.get_label() == "yes (AP 0.833)"
    roc_legend, pr_legend = roc.get_legend(), pr.get_legend()
    assert [t.get_text() for t in roc_legend.get_texts()] == ["yes (AUC 0.750)"]
    assert [t.get_text() for t in pr_legend.get_texts()] == ["yes (AP 0.833)"]
    assert [t.get_fontsize() for t in [*roc_legend.get_texts(), *pr_legend.get_texts()]] == [8.0, 8.0]
    assert (roc_legend._loc, pr_legend._loc) == (4, 3)  # lower right, lower left
    assert pr.get_ylim() == (0.0, 1.02)

    def build(ref: Any) -> None:
        a, b = ref.subplots(1, 2)
        a.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1)
        a.plot([0.0, 0.0, 0.5, 0.5, 1.0], [0.0, 0.5, 0.5, 1.0, 1.0], label="yes (AUC 0.750)")
        b.plot([1.0, 1.0, 0.5, 0.5, 0.0], [0.5, 2 / 3, 0.5, 1.0, 1.0], drawstyle="steps-post", label="yes (AP 0.833)")
        a.set(xlabel="false positive rate", ylabel="true positive rate", title="ROC (test, positive class)")
        b.set(xlabel="recall", ylabel="precision", title="Precision-recall (test, positive class)", ylim=(0, 1.02))
        a.legend(fontsize=8, loc="lower right")
        b.legend(fontsize=8, loc="lower left")

    assert [box(a) for a in fig.axes] == [box(a) for a in reference_layout((10, 4.5), build).axes]


def test_roc_without_any_curve_has_titles_and_no_legend(tmp_path: Path, figures: list[Any]) -> None:
    fig = roc_figure(figures, tmp_path, [1, 1, 1], [[0.3, 0.7]] * 3, ["no", "yes"])
    roc, pr = fig.axes
    assert roc.get_legend() is None and pr.get_legend() is None
    assert len(roc.get_lines()) == 1 and len(pr.get_lines()) == 0
    assert roc.get_title() == "ROC (test, positive class)"
    assert pr.get_title() == "Precision-recall (test, positive class)"


@pytest.mark.parametrize(
    ("k", "which", "drawn"),
    [(3, "one vs rest", 3), (10, "one vs rest", 10), (11, "top 10 of 11 classes", 10)],
)
def test_roc_titles_by_the_number_of_classes(
    tmp_path: Path, figures: list[Any], k: int, which: str, drawn: int
) -> None:
    labels = np.array([c for c in range(k) for _ in range(c + 2)])  # class c: c + 2 rows
    proba = np.random.default_rng(k).dirichlet(np.ones(k), len(labels))
    fig = roc_figure(figures, tmp_path, labels, proba, [f"c{i}" for i in range(k)])
    roc, pr = fig.axes
    assert roc.get_title() == f"ROC (test, {which})"
    assert pr.get_title() == f"Precision-recall (test, {which})"
    order = list(range(k - 1, k - 1 - drawn, -1))  # the most frequent first
    from sklearn.metrics import average_precision_score, roc_auc_score

    assert [t.get_text() for t in roc.get_legend().get_texts()] == [
        f"c{c} (AUC {roc_auc_score(labels == c, proba[:, c]):.3f})" for c in order
    ]
    assert [t.get_text() for t in pr.get_legend().get_texts()] == [
        f"c{c} (AP {average_precision_score(labels == c, proba[:, c]):.3f})" for c in order
    ]


@pytest.mark.parametrize("draw", ["confusion_matrix", "predicted_vs_actual", "roc_pr_curves", "training_curves"])
def test_each_png_has_its_pixel_size_whatever_matplotlibrc_sets(tmp_path: Path, draw: str) -> None:
    """Every plot saves at dpi 100 itself: a user's matplotlibrc (figure.dpi, savefig.dpi) changes no PNG."""
    import matplotlib

    sizes = {}
    for dpi in (100, 37):
        with matplotlib.rc_context({"figure.dpi": dpi, "savefig.dpi": dpi}):
            png = tmp_path / f"{draw}{dpi}.png"
            if draw == "confusion_matrix":
                plots.confusion_matrix(np.array([0, 1, 1]), np.array([0, 1, 0]), ["a", "b"], png)
            elif draw == "predicted_vs_actual":
                plots.predicted_vs_actual(np.array([0.0, 1.0, 2.0]), np.array([0.5, 1.0, 1.5]), png)
            elif draw == "roc_pr_curves":
                proba = np.array([[0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
                plots.roc_pr_curves(np.array([0, 1, 1]), proba, ["a", "b"], png)
            else:
                history = pd.DataFrame(
                    {"step": [1, 2], "epoch": [0, 1], "train_loss": [1.0, 0.5], "val_loss": [1.1, 0.6]}
                )
                plots.training_curves(history, png)
            sizes[dpi] = png_size(png)
    assert sizes[37] == sizes[100]


# --- what each figure draws: titles, labels and the points of each line --------------------------------------


def _lines(ax: Any) -> list[tuple[list[float], list[float], str]]:
    return [
        (list(map(float, line.get_xdata())), list(map(float, line.get_ydata())), line.get_label())
        for line in ax.get_lines()
    ]


def test_training_curves_draw_both_losses_and_the_validation_metric(tmp_path: Path, figures: list[Any]) -> None:
    from trainflow.plots import training_curves

    history = pd.DataFrame({"epoch": [1, 2], "train_loss": [0.9, 0.5], "val_loss": [1.0, 0.7], "val_r2": [0.1, 0.4]})
    training_curves(history, tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    (fig,) = figures
    loss, metric = fig.axes
    assert _lines(loss) == [([1, 2], [0.9, 0.5], "train"), ([1, 2], [1.0, 0.7], "val")]
    assert (loss.get_xlabel(), loss.get_ylabel(), loss.get_title()) == ("epoch", "loss (mean per sample)", "Loss")
    assert [t.get_text() for t in loss.get_legend().get_texts()] == ["train", "val"]
    assert _lines(metric) == [([1, 2], [0.1, 0.4], "_child0")]
    assert (metric.get_xlabel(), metric.get_ylabel(), metric.get_title()) == ("epoch", "R²", "Validation R²")
    assert metric.get_lines()[0].get_color() == "tab:green"
    assert list(fig.get_size_inches()) == [10, 4]


def test_training_curves_prefer_accuracy_and_fall_back_to_the_loss(tmp_path: Path, figures: list[Any]) -> None:
    from trainflow.plots import training_curves

    base = {"epoch": [1], "train_loss": [0.9], "val_loss": [1.0]}
    training_curves(pd.DataFrame({**base, "val_r2": [0.3], "val_accuracy": [0.5]}), tmp_path / "a.png")
    training_curves(pd.DataFrame(base), tmp_path / "b.png")
    titles = [(f.axes[1].get_title(), f.axes[1].get_ylabel(), _lines(f.axes[1])[0][1]) for f in figures]
    assert titles == [("Validation accuracy", "accuracy", [0.5]), ("Validation loss", "loss", [1.0])]


def test_predicted_vs_actual_scatters_the_points_over_the_diagonal(tmp_path: Path, figures: list[Any]) -> None:
    from trainflow.plots import predicted_vs_actual

    predicted_vs_actual(np.array([1.0, 2.0, 5.0]), np.array([0.5, 2.5, 4.0]), tmp_path / "p.png")
    (fig,) = figures
    (ax,) = fig.axes
    assert ax.collections[0].get_offsets().tolist() == [[1.0, 0.5], [2.0, 2.5], [5.0, 4.0]]
    assert _lines(ax) == [([0.5, 5.0], [0.5, 5.0], "_child1")]
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == ("actual", "predicted", "Predicted vs actual (test)")
    assert list(fig.get_size_inches()) == [5, 5]


def test_roc_and_pr_curves_are_labelled_with_their_areas(tmp_path: Path, figures: list[Any]) -> None:
    from trainflow.plots import roc_pr_curves

    labels = np.array([0, 0, 1, 1])
    proba = np.array([[0.9, 0.1], [0.6, 0.4], [0.65, 0.35], [0.2, 0.8]])
    roc_pr_curves(labels, proba, ["no", "yes"], tmp_path / "r.png")
    (fig,) = figures
    roc, pr = fig.axes
    # scores of "yes": 0.1, 0.4 (negatives), 0.35, 0.8 (positives): 3 of 4 pairs ordered, AUC 0.75;
    # AP: at 0.8 precision 1 (recall 0.5), at 0.35 precision 2/3 (recall 1): 0.5 * 1 + 0.5 * 2/3
    assert [line.get_label() for line in roc.get_lines()] == ["_child0", "yes (AUC 0.750)"]
    assert [line.get_label() for line in pr.get_lines()] == ["yes (AP 0.833)"]
    assert _lines(roc)[0][:2] == ([0, 1], [0, 1])
    assert _lines(roc)[1][:2] == ([0.0, 0.0, 0.5, 0.5, 1.0], [0.0, 0.5, 0.5, 1.0, 1.0])
    assert (roc.get_xlabel(), roc.get_ylabel(), roc.get_title()) == (
        "false positive rate",
        "true positive rate",
        "ROC (test, positive class)",
    )
    assert (pr.get_xlabel(), pr.get_ylabel(), pr.get_title()) == (
        "recall",
        "precision",
        "Precision-recall (test, positive class)",
    )
    assert pr.get_ylim() == (0, 1.02)
    assert pr.get_lines()[0].get_drawstyle() == "steps-post"
    assert roc.get_legend() is not None and pr.get_legend() is not None


def test_roc_titles_say_one_vs_rest_or_the_top_classes(tmp_path: Path, figures: list[Any]) -> None:
    from trainflow.plots import roc_pr_curves

    rng = np.random.default_rng(0)
    for k in (3, 12):
        labels = np.arange(60) % k
        proba = rng.dirichlet(np.ones(k), 60)
        roc_pr_curves(labels, proba, [f"c{i}" for i in range(k)], tmp_path / f"{k}.png")
    assert [f.axes[0].get_title() for f in figures] == ["ROC (test, one vs rest)", "ROC (test, top 10 of 12 classes)"]
    assert [len(f.axes[0].get_lines()) for f in figures] == [4, 11]


def test_the_confusion_matrix_names_its_axes_and_cells(figures: list[Any], tmp_path: Path) -> None:
    """Rows are the actual class, columns the predicted one; each cell its row share over its count."""
    from trainflow import plots

    plots.confusion_matrix(np.array([0, 0, 1, 1]), np.array([0, 1, 1, 1]), ["a", "b"], tmp_path / "cm.png")
    (fig,) = figures
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("predicted", "actual")
    assert ax.get_title() == "Confusion matrix (test)\neach cell: % of the actual class's rows (count)"
    assert [t.get_text() for t in ax.texts] == ["50%\n(1)", "50%\n(1)", "100%\n(2)"]
    assert fig.axes[1].get_ylabel() == "share of the actual class's test rows"


def test_the_history_table_puts_update_epoch_loss_first_and_lr_last() -> None:
    from trainflow.plots import history_frame

    frame = history_frame([{"lr": 0.1, "val_b": 1.0, "epoch": 1, "val_a": 2.0, "update": 5, "train_loss": 0.5}])
    assert list(frame.columns) == ["update", "epoch", "train_loss", "val_a", "val_b", "lr"]
    assert list(history_frame([{"val_x": 1.0, "epoch": 2}]).columns) == ["epoch", "val_x"]


def test_a_binary_curve_needs_both_classes_among_the_test_labels() -> None:
    """ROC/PR curves of a binary task are drawn for the positive class only when the test rows hold both classes."""
    from trainflow.plots import curve_classes

    assert curve_classes(np.array([0, 1, 0]), 2) == [1]
    assert curve_classes(np.array([0, 0, 0]), 2) == []  # no positive row: no curve
    assert curve_classes(np.array([1, 1]), 2) == []  # no negative row: no curve
    assert curve_classes(np.array([2, 0, 2, 1]), 3) == [2, 0, 1]  # one-vs-rest, most frequent first
