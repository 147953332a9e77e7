"""The model card (trainflow.registry.card): its whole Markdown and HTML text pinned on hand-made inputs, section by
section (lineage, data, test metrics with bootstrap intervals, the paired comparison and its slices, calibration and
classes, plots), its numbers, and the blank line after each table. Each expected page is written out here by hand (or,
for a bootstrap, computed with numpy from the same seeded draw). (The card a pipeline writes: tests/stages/test_card.py
and test_card_browser.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from trainflow.core.paths import Paths
from trainflow.registry import card, gate
from trainflow.registry.gate import Scored


def test_a_card_number_has_four_significant_digits() -> None:
    assert card._fmt(0.123456) == "0.1235"
    assert card._fmt(1.0) == "1"
    assert card._fmt(1e-5) == "1e-05"
    assert card._fmt(12345.0) == "1.234e+04"
    assert card._fmt(7) == "7"
    assert card._fmt("x") == "x"


def _four_rows() -> gate.Scored:
    # right, right, wrong, right: accuracy 0.75
    return gate.Scored(np.array([0, 1, 1, 0]), np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.7, 0.3]]))


def test_an_interval_is_the_2_5_and_97_5_percentiles_of_2000_seeded_resamples_of_the_rows() -> None:
    """accuracy and log_loss get a bootstrap interval (numpy, from the same seeded draw), f1_macro none; n_test is
    not a metric row; rows are sorted by name and say which way is better."""
    scored = _four_rows()
    right = np.array([1.0, 1.0, 0.0, 1.0])
    loss = -np.log(np.array([0.9, 0.8, 0.4, 0.7]))

    def interval(values: np.ndarray, seed: int) -> str:
        idx = np.random.default_rng(seed).integers(0, len(values), size=(2000, len(values)))
        boot = values[idx].mean(axis=1)
        return f"[{np.quantile(boot, 0.025):.4g}, {np.quantile(boot, 0.975):.4g}]"

    metrics = {"n_test": 4, "log_loss": float(loss.mean()), "f1_macro": 0.7333, "accuracy": 0.75}
    assert card.intervals(metrics, scored, seed=5) == [
        ["accuracy", "0.75", interval(right, 5), "higher is better"],
        ["f1_macro", "0.7333", "—", "higher is better"],
        ["log_loss", f"{loss.mean():.4g}", interval(loss, 5), "lower is better"],
    ]
    y = np.arange(10.0)
    errors = np.array([0.1, 0.5, 1.3, 0.2, 2.9, 0.7, 0.05, 1.1, 0.4, 3.3])
    ten = gate.Scored(y, y + errors)
    assert interval(errors, 5) != interval(errors, 6)
    for seed in (5, 6):  # the seed is the one given
        assert card.intervals({"mae": 1.0}, ten, seed=seed) == [["mae", "1", interval(errors, seed), "lower is better"]]
    assert card.intervals({"accuracy": 1}, None, seed=5) == [["accuracy", "1", "—", "higher is better"]]
    empty = gate.Scored(np.array([], dtype=np.int64), np.zeros((0, 2)))
    assert card.intervals({"accuracy": 1.0}, empty, seed=5) == [["accuracy", "1", "—", "higher is better"]]


def test_the_bootstrap_interval_resamples_every_row_including_the_first() -> None:
    """Two test rows, absolute errors 1 (row 0) and 0 (row 1). A resample of 2 rows has mean error 0, 0.5 or 1 with
    chances 1/4, 1/2, 1/4, so out of 2000 resamples about 500 are all row 0 and 500 all row 1: the 2.5% and 97.5%
    quantiles are 0 and 1. A bootstrap that never drew row 0 would give [0, 0]."""
    scored = Scored(labels=np.array([0.0, 0.0]), outputs=np.array([1.0, 0.0]))
    assert card.intervals({"mae": 0.5, "n_test": 2}, scored, seed=0) == [["mae", "0.5", "[0, 1]", "lower is better"]]


def test_r2_gets_an_interval_from_the_resamples_whose_labels_vary_and_none_when_none_do() -> None:
    labels = np.array([1.0, 2.0, 3.0])
    scored = gate.Scored(labels, labels.copy())  # perfect: r2 is 1 on every resample with varied labels
    assert card.intervals({"r2": 1.0, "mae": 0.0}, scored, seed=0) == [
        ["mae", "0", "[0, 0]", "lower is better"],
        ["r2", "1", "[1, 1]", "higher is better"],
    ]
    one = gate.Scored(np.array([2.0]), np.array([2.5]))  # every resample has one label: r2 is never finite
    assert card.intervals({"r2": 0.0}, one, seed=0) == [["r2", "0", "—", "higher is better"]]


def test_the_card_leaves_out_intervals_when_the_resamples_would_be_too_big() -> None:
    """n * 2000 resampled indices must stay under 5e7 (400 MB): at 25,000 rows no interval is drawn."""
    n = 25_000
    big = gate.Scored(np.zeros(n, dtype=np.int64), np.tile([0.9, 0.1], (n, 1)))
    assert card.intervals({"accuracy": 1.0}, big, seed=0) == [["accuracy", "1", "—", "higher is better"]]


def test_calibration_bins_the_top_probability_by_tenths_and_a_certain_row_goes_in_the_last() -> None:
    outputs = np.array([[0.95, 0.05], [0.15, 0.85], [0.66, 0.34], [0.72, 0.28], [0.62, 0.38], [1.0, 0.0]])
    labels = np.array([0, 1, 1, 0, 0, 1])  # right, right, wrong, right, right, wrong
    assert card.calibration(gate.Scored(labels, outputs)) == [
        ["0.6–0.7", "2", "0.640", "0.500"],
        ["0.7–0.8", "1", "0.720", "1.000"],
        ["0.8–0.9", "1", "0.850", "1.000"],
        ["0.9–1.0", "2", "0.975", "0.500"],
    ]
    low = gate.Scored(np.array([2]), np.array([[0.34, 0.33, 0.33]]))
    assert card.calibration(low) == [["0.3–0.4", "1", "0.340", "0.000"]]


def _project(tmp_path: Path) -> Paths:
    paths = Paths(tmp_path)
    paths.splits.mkdir(parents=True)
    for split, ys in (("train", ["a", "b", "a"]), ("val", ["b"]), ("test", ["a", "b"])):
        pd.DataFrame({"x": range(len(ys)), "y": ys}).to_parquet(paths.split_file(split))
    return paths


FULL_REG = {
    "model_name": "digits",
    "version": 3,
    "decision": "promoted: better",
    "tags": {"git_commit": "abc", "git_dirty": "true", "data_hash": "d1.dir", "params_hash": "p1",
             "mlflow_run_id": "r|1", "model_sha256": "s1", "task": "classification", "target": "y"},
    "why": {"summary": "since champion version 2: params: seed: 1 -> 2", "params": ["seed: 1 -> 2"],
            "data": ["t.csv: +1 rows (2 -> 3)", "u.csv: removed (4 rows)"]},
    "comparison": {"challenger": 1.0, "champion": 0.5, "improvement": 0.5, "confidence": 0.95, "low": 0.0,
                   "high": 1.0, "test": "paired bootstrap",
                   "slices": [{"slice": "class a", "rows": 1, "metric": "accuracy", "challenger": 1.0,
                               "champion": 1.0, "improvement": 0.0}]},
}  # fmt: skip


FULL_CARD = """# Model card: digits v3

## Lineage

Why this run ran: since champion version 2: params: seed: 1 -> 2

|  |  |
|---|---|
| git commit | abc (uncommitted changes) |
| data (DVC hash of data/splits) | d1.dir |
| params hash | p1 |
| MLflow run | r\\|1 |
| model sha256 | s1 |

| params changed since the champion |
|---|
| seed: 1 -> 2 |

## Data

Changes to the data since the champion: t.csv: +1 rows (2 -> 3); u.csv: removed (4 rows)

| split | rows |
|---|---|
| train | 3 |
| val | 1 |
| test | 2 |

| class | train | val | test |
|---|---|---|---|
| a | 2 | 0 | 1 |
| b | 1 | 1 | 1 |

## Test metrics

On 2 test rows. Decision: promoted: better

| metric | value | 95% interval (bootstrap) |  |
|---|---|---|---|
| accuracy | 1 | [1, 1] | higher is better |
| f1_macro | 1 | — | higher is better |

## Against the champion (paired, on the same test rows)

|  |  |
|---|---|
| challenger | 1 |
| champion | 0.5 |
| improvement | 0.5 |
| 95% one-sided bounds | [0, 1] |
| test | paired bootstrap |

| slice | rows | metric | challenger | champion | improvement |
|---|---|---|---|---|---|
| class a | 1 | accuracy | 1 | 1 | 0 |

## Calibration and classes

| confidence | rows | mean confidence | accuracy |
|---|---|---|---|
| 0.7–0.8 | 1 | 0.750 | 1.000 |
| 0.9–1.0 | 1 | 0.950 | 1.000 |

| class | precision | recall | support |
|---|---|---|---|
| a | 1 | 0.5 | 2 |
| b | 0.6667 | 1 | 1 |

## Plots

![training curves](training_curves.png)

![ROC and precision-recall](roc_pr.png)
"""


def test_the_card_of_a_classifier_against_a_champion_is_every_section_in_order(tmp_path: Path) -> None:
    """Lineage (dirty commit, why, params changed), data (rows, classes per split, data changes), test metrics,
    the paired comparison with slices, calibration and per-class, and the plots that exist."""
    paths = _project(tmp_path)
    paths.reports.mkdir(parents=True)
    paths.per_class.write_text("class,precision,recall,support\na,1.0,0.5,2\nb,0.66666,1.0,1\n", encoding="utf-8")
    paths.test_plots.mkdir(parents=True)
    (paths.reports / "plots" / "training_curves.png").write_bytes(b"PNG")
    (paths.test_plots / "roc_pr.png").write_bytes(b"PNG")
    scored = gate.Scored(np.array([0, 1]), np.array([[0.95, 0.05], [0.25, 0.75]]))
    parts = card.sections(paths, FULL_REG, {"accuracy": 1.0, "f1_macro": 1.0, "n_test": 2}, scored, seed=0)
    assert card.markdown("Model card: digits v3", parts) == FULL_CARD


MINIMAL_CARD = """# Model card: house v1

## Lineage

|  |  |
|---|---|
| git commit | — |
| data (DVC hash of data/splits) | — |
| params hash | — |
| MLflow run | — |
| model sha256 | — |

## Data

| split | rows |
|---|---|
| train | 0 |
| val | 0 |
| test | 0 |

## Test metrics

On ? test rows. Decision: —

| metric | value | 95% interval (bootstrap) |  |
|---|---|---|---|
| rmse | 0.5 | — | lower is better |

## Plots
"""


def test_the_card_of_a_regressor_with_no_lineage_or_splits_has_dashes_and_zeros(tmp_path: Path) -> None:
    """Tags, why, a comparison and the splits all missing; no scored outputs: no calibration section. write()
    puts the same Markdown in reports/card.md, and the HTML page beside it."""
    paths = Paths(tmp_path)
    reg = {"model_name": "house", "version": 1, "tags": {"git_dirty": "false", "task": "regression", "target": "y"},
           "why": {}}  # fmt: skip
    written = card.write(paths, reg, {"rmse": 0.5}, None, seed=0)
    assert written == [paths.reports / "card.md", paths.reports / "card.html"]
    assert written[0].read_text(encoding="utf-8") == MINIMAL_CARD
    html = written[1].read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html><html><head><meta charset='utf-8'><title>Model card: house v1</title>")
    assert html.endswith("<h2>Plots</h2></body></html>\n")
    regression = gate.Scored(np.array([1.0, 2.0]), np.array([1.5, 2.5]))  # outputs [n]: no calibration either
    titles = [s.title for s in card.sections(paths, reg, {"rmse": 0.5}, regression, seed=0)]
    assert titles == ["Lineage", "Data", "Test metrics", "Plots"]


@pytest.mark.parametrize(
    ("tags", "said"),
    [
        ({"git_dirty": "true", "code_dirty": "false"}, "abc (the commit's code; params.yaml or data changed since)"),
        ({"git_dirty": "true", "code_dirty": "true"}, "abc (uncommitted code changes)"),
        ({"git_dirty": "true"}, "abc (uncommitted changes)"),  # registered before code_dirty was recorded
        ({"git_dirty": "false", "code_dirty": "false"}, "abc"),
    ],
)
def test_the_cards_commit_row_says_whether_the_code_was_the_commits(
    tmp_path: Path, tags: dict[str, str], said: str
) -> None:
    """A version trained by `trainflow run -S` (params.yaml rewritten, code committed) is not called uncommitted."""
    reg = {"model_name": "m", "version": 1, "tags": {"git_commit": "abc", **tags}, "why": {}}
    [lineage, *_] = card.sections(Paths(tmp_path), reg, {"accuracy": 1.0}, None, seed=0)
    assert lineage.tables[0][1][0] == ["git commit", said]


def _comparison_with_a_slice() -> dict[str, Any]:
    return {
        "challenger": 0.9, "champion": 0.8, "improvement": 0.1, "confidence": 0.95, "low": 0.05, "high": 0.15,
        "test": "paired bootstrap",
        "slices": [{"slice": "new rows", "rows": 12, "metric": "accuracy", "challenger": 0.75, "champion": 0.5,
                    "improvement": 0.25}],
    }  # fmt: skip


def test_the_cards_slice_table_has_its_header_and_one_row_per_slice(tmp_path: Path) -> None:
    reg = {"decision": "champion", "comparison": _comparison_with_a_slice()}
    parts = card.sections(Paths(tmp_path), reg, {"accuracy": 0.9, "n_test": 40}, None, seed=0)
    text = card.markdown("Model card: m v2", parts)
    header = "| slice | rows | metric | challenger | champion | improvement |"
    lines = text.splitlines()
    assert header in lines
    at = lines.index(header)
    row = "| new rows | 12 | accuracy | 0.75 | 0.5 | 0.25 |"
    assert lines[at + 1 : at + 4] == ["|---|---|---|---|---|---|", row, ""]


def test_markdown_ends_each_table_with_a_blank_line_so_the_next_block_renders() -> None:
    parts = [
        card.Section("First", tables=[(["a", "b"], [["1", "2"]]), (["c"], [["x|y"]])]),
        card.Section("Second", text=["Some words."]),
    ]
    expected = (
        "# T\n\n## First\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n| c |\n|---|\n| x\\|y |\n\n## Second\n\nSome words.\n"
    )
    assert card.markdown("T", parts) == expected


STYLE = (
    "body{font-family:sans-serif;max-width:960px;margin:2em auto;color:#222}"
    "table{border-collapse:collapse;margin:0.5em 0 1em}td,th{border:1px solid #ccc;padding:2px 8px;"
    "text-align:left}img{max-width:100%}"
)


def test_the_html_page_escapes_text_and_embeds_the_plots(tmp_path: Path) -> None:
    png = tmp_path / "p.png"
    png.write_bytes(b"PNG")  # base64: UE5H
    parts = [
        card.Section("A<b>", text=["x & y"], tables=[(["h", "i"], [["<c>", "d"]])], images=[('c"ap', png)]),
        card.Section("Empty"),
    ]
    assert card.page("T&C", parts) == (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>T&amp;C</title><style>{STYLE}</style></head><body>"
        "<h1>T&amp;C</h1><h2>A&lt;b&gt;</h2><p>x &amp; y</p>"
        "<table><tr><th>h</th><th>i</th></tr><tr><td>&lt;c&gt;</td><td>d</td></tr></table>"
        '<figure><img alt="c&quot;ap" src="data:image/png;base64,UE5H"><figcaption>c&quot;ap</figcaption></figure>'
        "<h2>Empty</h2></body></html>\n"
    )
    assert card.markdown("T", parts) == (
        '# T\n\n## A<b>\n\nx & y\n\n| h | i |\n|---|---|\n| <c> | d |\n\n![c"ap](p.png)\n\n## Empty\n'
    )
