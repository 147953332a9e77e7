"""Exact behaviour of preprocessing, the split and the streamed readers, on tables small enough to work by hand: the
complete fitted state and saved JSON, every message in full, both sides of each branch (missing values, unseen
categories, text, images, regression, groups and time), checked against hand computation and scikit-learn."""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.splits import splitmix64_by_hand as splitmix_by_hand

from trainflow.core.errors import DataError
from trainflow.core.paths import SPLITS
from trainflow.data import spill, stream
from trainflow.data import split as sp
from trainflow.data.preprocess import Column, Preprocessor
from trainflow.data.schema import ROW_KEY, Kind, Schema
from trainflow.params import DataParams, FeatureParams, SplitParams

approx = pytest.approx


def schema(
    kinds: dict[str, Kind],
    task: str = "classification",
    classes: list[str] | None = None,
    text_column: str | None = None,
    image_column: str | None = None,
) -> Schema:
    features = [c for c in kinds if c not in (text_column, image_column)]
    return Schema(
        source="test",
        target="y",
        task=task,  # type: ignore[arg-type]
        features=features,
        kinds=kinds,
        classes=classes if classes is not None else (["a", "b"] if task == "classification" else []),
        n_rows=0,
        text_column=text_column,
        image_column=image_column,
    )


def fit(frame: pd.DataFrame, s: Schema, **params: object) -> Preprocessor:
    return Preprocessor.fit(frame, s, FeatureParams(**params))  # type: ignore[arg-type]


def message(exc: pytest.ExceptionInfo[BaseException]) -> str:
    return str(exc.value)


# --- preprocessing: the fitted state, whole ----------------------------------------------------------------------

EMPTY_EXTRAS = {
    "text_column": None,
    "max_length": 0,
    "pad_id": 0,
    "image_column": None,
    "image_size": [],
    "image_resize": False,
    "image_channels": 0,
    "image_mean": [],
    "image_std": [],
}


def tabular_train() -> pd.DataFrame:
    """Five rows, one feature of each tabular kind, each with a missing value."""
    return pd.DataFrame(
        {
            "num": [1.0, np.nan, 3.0, 4.0, np.inf],  # present 1, 3, 4: median 3; inf is missing
            "flag": pd.array([True, False, True, None, True], dtype="boolean"),  # 3 of 4 true: mode true
            "cat": pd.Series(["b", "a", "b", None, "c"], dtype="string"),  # b twice, a and c once: a wins the tie
            "y": ["a", "b", "a", "b", "a"],
        }
    )


TABULAR: dict[str, Kind] = {"num": "numeric", "flag": "boolean", "cat": "categorical"}


def test_the_saved_json_of_a_tabular_fit_is_its_whole_state_computed_by_hand(tmp_path: Path) -> None:
    """num imputed with the median 3 -> [1, 3, 3, 4, 3]: mean 2.8, population std sqrt(0.96); the boolean's mode is
    true and it is not standardised; the categorical keeps the 2 most frequent values (ties by value)."""
    pre = fit(tabular_train(), schema(TABULAR), max_categories=2)
    expected = {
        "format": 1,
        "target": "y",
        "task": "classification",
        "classes": ["a", "b"],
        "raw_features": ["num", "flag", "cat"],
        "columns": [
            {
                "name": "num",
                "kind": "numeric",
                "fill": [3.0],
                "center": approx([2.8], rel=1e-12),
                "scale": approx([math.sqrt(0.96)], rel=1e-12),
                "categories": [],
                "indicator": True,
            },
            {
                "name": "flag",
                "kind": "boolean",
                "fill": [1.0],
                "center": [0.0],
                "scale": [1.0],
                "categories": [],
                "indicator": True,
            },
            {
                "name": "cat",
                "kind": "categorical",
                "fill": [],
                "center": [],
                "scale": [],
                "categories": ["b", "a"],
                "indicator": False,
            },
        ],
        "target_mean": 0.0,
        "target_std": 1.0,
        **EMPTY_EXTRAS,
    }
    assert pre.to_json() == expected
    pre.save(tmp_path / "model")
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["preprocess.json"]
    assert json.loads((tmp_path / "model" / "preprocess.json").read_text()) == expected
    back = Preprocessor.load(tmp_path / "model")
    assert back == pre and back.tokenizer is None and back.vocab_size == 0
    assert all(isinstance(c, Column) for c in back.columns)

    assert pre.output_names == ["num", "num:missing", "flag", "flag:missing", "cat=b", "cat=a", "cat:unknown"]
    assert pre.width == 7 and [c.width for c in pre.columns] == [2, 2, 3]


def test_the_features_of_unseen_rows_use_the_train_statistics_exactly() -> None:
    """A missing number takes the median, a missing boolean the mode (each flagged); an unseen, a rare and a missing
    category all go to the unknown column."""
    pre = fit(tabular_train(), schema(TABULAR), max_categories=2)
    rows = pd.DataFrame(
        {
            "num": [np.nan, 10.0, -np.inf, 2.8],
            "flag": pd.array([None, False, True, False], dtype="boolean"),
            "cat": pd.Series(["a", "zzz", None, "c"], dtype="string"),
        }
    )
    sd = math.sqrt(0.96)
    expected = np.array(
        [
            [(3 - 2.8) / sd, 1, 1, 1, 0, 1, 0],
            [(10 - 2.8) / sd, 0, 0, 0, 0, 0, 1],
            [(3 - 2.8) / sd, 1, 1, 0, 0, 0, 1],
            [0.0, 0, 0, 0, 0, 0, 1],
        ],
        dtype=np.float32,
    )
    x = pre.features(rows, "val")
    assert x.dtype == np.float32 and x.shape == (4, 7)
    np.testing.assert_allclose(x, expected, rtol=1e-6, atol=1e-7)


def test_without_missing_indicators_or_missing_values_no_indicator_column_is_added() -> None:
    off = fit(tabular_train(), schema(TABULAR), max_categories=5, missing_indicators=False)
    assert [c.indicator for c in off.columns] == [False, False, False]
    assert off.output_names == ["num", "flag", "cat=b", "cat=a", "cat=c", "cat:unknown"]
    assert off.features(tabular_train()).shape == (5, 6)
    full = pd.DataFrame({"num": [1.0, 2.0], "flag": pd.array([True, False], dtype="boolean"), "y": ["a", "b"]})
    on = fit(full, schema({"num": "numeric", "flag": "boolean"}))
    assert [c.indicator for c in on.columns] == [False, False]
    assert on.columns[1].fill == [0.0]  # a tie (1 of 2) is not a majority: false


def test_a_datetime_fit_is_each_parts_mean_and_std_with_the_median_timestamp_filled_in() -> None:
    """Present: Wed 2020-01-01 10:00, Fri 2020-01-03 00:00, Thu 2020-01-02 12:00 (the median); 2020-01-01 is day
    18262 since 1970-01-01."""
    t = pd.to_datetime(["2020-01-01 10:00", "2020-01-03 00:00", None, "2020-01-02 12:00"])
    pre = fit(pd.DataFrame({"t": t, "y": ["a"] * 4}), schema({"t": "datetime"}))
    (col,) = pre.columns
    median = [2020.0, 1.0, 3.0, 2.0, 12.0, 18263.5]
    rows = np.array([[2020, 1, 2, 1, 10, 18262 + 10 / 24], [2020, 1, 4, 3, 0, 18264], median, median])
    assert col.fill == median
    assert col.center == approx(rows.mean(axis=0).tolist(), rel=1e-12)
    assert col.center[:5] == [2020.0, 1.0, 3.0, 2.0, 8.5]
    assert col.scale == approx([1.0, 1.0, math.sqrt(0.5), math.sqrt(0.5), math.sqrt(24.75), rows[:, 5].std()])
    assert col.indicator and col.categories == []
    assert pre.output_names == [f"t.{p}" for p in ("year", "month", "dayofweek", "day", "hour", "days")] + ["t:missing"]
    assert pre.width == 7
    x = pre.features(pd.DataFrame({"t": pd.to_datetime([None, "2020-01-03 00:00"])}))
    want = (np.array([median, rows[1]]) - np.array(col.center)) / np.array(col.scale)
    np.testing.assert_allclose(x[:, :6], want, rtol=1e-5, atol=1e-6)
    assert x[:, 6].tolist() == [1.0, 0.0]


def test_an_all_missing_datetime_fills_the_epoch_and_a_seconds_column_reads_as_nanoseconds() -> None:
    frame = pd.DataFrame({"t": pd.Series([pd.NaT, pd.NaT], dtype="datetime64[ns]"), "y": ["a", "b"]})
    (col,) = fit(frame, schema({"t": "datetime"})).columns
    assert col.fill == [1970.0, 1.0, 3.0, 1.0, 0.0, 0.0]  # 1970-01-01 was a Thursday
    assert col.scale == [1.0] * 6
    seconds = pd.DataFrame({"t": pd.Series(pd.to_datetime(["2020-01-01", "2021-01-01"])).astype("datetime64[s]")})
    nanos = pd.DataFrame({"t": pd.to_datetime(["2020-01-01", "2021-01-01"])})
    pre = fit(nanos.assign(y=["a", "b"]), schema({"t": "datetime"}))
    np.testing.assert_array_equal(pre.features(seconds), pre.features(nanos))


def test_a_constant_regression_target_scales_by_one_and_a_varied_one_by_its_std() -> None:
    frame = pd.DataFrame({"x": [1.0, 2.0, 3.0], "y": [5.0, 5.0, 5.0]})
    flat = fit(frame, schema({"x": "numeric"}, task="regression"))
    assert (flat.target_mean, flat.target_std) == (5.0, 1.0)
    varied = fit(frame.assign(y=[1.0, 2.0, 6.0]), schema({"x": "numeric"}, task="regression"))
    assert varied.target_mean == 3.0 and varied.target_std == approx(math.sqrt(14 / 3), rel=1e-12)
    assert varied.to_json()["classes"] == [] and varied.to_json()["task"] == "regression"
    np.testing.assert_allclose(varied.scale_target(np.array([3.0, 6.0])), [0.0, 3 / math.sqrt(14 / 3)], rtol=1e-6)
    np.testing.assert_allclose(varied.unscale_target(np.array([1.0])), [3.0 + math.sqrt(14 / 3)], rtol=1e-12)


# --- preprocessing: messages -----------------------------------------------------------------------------------------


def test_fitting_on_no_rows_or_on_a_text_feature_says_what_to_do() -> None:
    with pytest.raises(DataError) as empty:
        fit(tabular_train().iloc[:0], schema(TABULAR))
    assert message(empty) == "train: the train split has no rows; nothing to fit the preprocessing on"
    with pytest.raises(DataError) as text:
        fit(pd.DataFrame({"note": ["hi"], "y": ["a"]}), schema({"note": "text"}))
    assert message(text) == "train: feature 'note' is text; only data.text_column can hold text"
    with pytest.raises(DataError) as gone:
        fit(pd.DataFrame({"y": ["a"]}), schema(TABULAR))
    assert message(gone) == "train: required column(s) ['num', 'flag', 'cat'] are missing (it has ['y'])"
    with pytest.raises(DataError) as gone:
        fit(pd.DataFrame({"y": ["a"]}), schema({"img": "image"}, image_column="img"))
    assert message(gone) == "train: required column(s) ['img'] are missing (it has ['y'])"
    with pytest.raises(DataError) as unknown:
        fit(pd.DataFrame({"x": [1.0, 2.0], "y": ["a", "c"]}), schema({"x": "numeric"}))
    assert message(unknown) == (
        "train: target column 'y' has labels ['c'] in 1 row(s) that the schema does not know (known labels: ['a', 'b'])"
    )


def test_a_missing_column_message_lists_at_most_twenty_of_the_columns_there_are() -> None:
    pre = fit(tabular_train(), schema(TABULAR))
    frame = pd.DataFrame({f"c{i}": [0] for i in range(25)})
    with pytest.raises(DataError) as exc:
        pre.features(frame, "predict.csv")
    shown = [f"c{i}" for i in range(20)]
    assert message(exc) == f"predict.csv: required column(s) ['num', 'flag', 'cat'] are missing (it has {shown})"


def test_values_that_do_not_convert_are_named_with_their_count_and_first_row() -> None:
    pre = fit(tabular_train(), schema(TABULAR))
    bad_numbers = pd.DataFrame(
        {"num": ["1", "oops", "NA", "bad", "oops", "?", " "], "flag": [True] * 7, "cat": ["a"] * 7}, dtype=object
    )
    with pytest.raises(DataError) as exc:
        pre.features(bad_numbers, "predict.csv")
    assert message(exc) == (
        "predict.csv: column 'num' should hold numbers but has ['oops', 'bad'] in 3 row(s) (first at row 1)"
    )
    bad_flags = pd.DataFrame({"num": [1.0] * 3, "flag": ["yes", "maybe", "N/A"], "cat": ["a"] * 3})
    with pytest.raises(DataError) as exc:
        pre.features(bad_flags)
    assert message(exc) == (
        "input: column 'flag' should hold booleans (true/false, yes/no, 1/0) but has ['maybe'] in 1 row(s) "
        "(first at row 1)"
    )
    coded = pd.DataFrame({"num": [1.0] * 4, "flag": [0, 1, 2, 1], "cat": ["a"] * 4})
    with pytest.raises(DataError) as exc:
        pre.features(coded)
    assert message(exc) == "input: column 'flag' should hold booleans (0/1) but has ['2'] in 1 row(s) (first at row 2)"
    np.testing.assert_array_equal(pre.features(coded.iloc[[0, 1]])[:, 2:4], [[0, 0], [1, 0]])
    t = fit(pd.DataFrame({"t": pd.to_datetime(["2020-01-01"]), "y": ["a"]}), schema({"t": "datetime"}))
    with pytest.raises(DataError) as exc:
        t.features(pd.DataFrame({"t": ["2020-01-01", "someday", ""]}), "val")
    assert message(exc) == "val: column 't' should hold dates/times but has ['someday'] in 1 row(s) (first at row 1)"


def test_boolean_words_of_any_case_and_spacing_read_as_true_and_false() -> None:
    pre = fit(pd.DataFrame({"b": pd.array([True, False], dtype="boolean"), "y": ["a", "b"]}), schema({"b": "boolean"}))
    words = ["true", " T ", "YES", "y", "1", "1.0", "false", "F", "No", "n", "0", "0.0"]
    x = pre.features(pd.DataFrame({"b": pd.Series(words, dtype=object)}))
    assert x[:, 0].tolist() == [1.0] * 6 + [0.0] * 6
    floats = pre.features(pd.DataFrame({"b": [1.0, 0.0, 1.0]}))
    assert floats.tolist() == [[1.0], [0.0], [1.0]]  # no indicator: nothing was missing in train


def test_categories_are_matched_as_text_whatever_the_dtype() -> None:
    """3, 3.0 and "3" are one category in a column of whole numbers; a float column with fractions is written as floats
    (3.0 is "3.0", not "3"); booleans read as their words."""
    pre = fit(pd.DataFrame({"c": ["3", "4", "2.5", "True"], "y": ["a"] * 4}), schema({"c": "categorical"}))
    assert pre.columns[0].categories == ["2.5", "3", "4", "True"]  # all once: by value
    rows = [
        pd.Series([3.0, 4.0, np.nan]),
        pd.Series([3, 4, 5]),
        pd.Series([2.5, 3.0, np.inf]),
        pd.Series([True, False, True]),
        pd.Series(pd.array([3, None, 4], dtype="Int64")),
        pd.Series([3, "4", None, 2.5], dtype=object),
    ]
    got = [pre.features(pd.DataFrame({"c": s})).argmax(axis=1).tolist() for s in rows]
    assert got == [[1, 2, 4], [1, 2, 4], [0, 4, 4], [3, 4, 3], [1, 4, 2], [1, 2, 4, 0]]


def test_classification_label_errors_list_at_most_ten_unknown_labels_sorted() -> None:
    pre = fit(pd.DataFrame({"x": [1.0], "y": ["a"]}), schema({"x": "numeric"}))
    with pytest.raises(DataError) as exc:
        pre.labels(pd.DataFrame({"y": ["a", None, "d", "d", "b"]}), "val")
    assert message(exc) == (
        "val: target column 'y' has labels ['<missing>', 'd'] in 3 row(s) that the schema does not know (known "
        "labels: ['a', 'b'])"
    )
    many = [f"z{i:02d}" for i in range(13)]
    with pytest.raises(DataError) as exc:
        pre.labels(pd.DataFrame({"y": many[::-1]}), "test")
    assert message(exc) == (
        f"test: target column 'y' has labels {many[:10]} and 3 more in 13 row(s) that the schema does not know "
        "(known labels: ['a', 'b'])"
    )
    with pytest.raises(DataError) as exc:
        pre.labels(pd.DataFrame({"x": [1.0]}))
    assert message(exc) == "input: required column(s) ['y'] are missing (it has ['x'])"


def test_a_regression_target_that_is_missing_or_infinite_is_counted() -> None:
    pre = fit(pd.DataFrame({"x": [1.0, 2.0], "y": [1.0, 2.0]}), schema({"x": "numeric"}, task="regression"))
    with pytest.raises(DataError) as exc:
        pre.labels(pd.DataFrame({"y": [1.0, np.inf, 2.0, np.nan]}), "test")
    assert message(exc) == (
        "test: target column 'y' is missing or not finite in 2 row(s) (first at row 1); drop or fix those rows"
    )
    with pytest.raises(DataError) as exc:
        fit(pd.DataFrame({"x": [1.0, 2.0], "y": [1.0, np.nan]}), schema({"x": "numeric"}, task="regression"))
    assert message(exc) == (
        "train: target column 'y' is missing or not finite in 1 row(s) (first at row 1); drop or fix those rows"
    )
    labels = pre.labels(pd.DataFrame({"y": ["1.5", "2"]}, dtype=object))
    assert labels.dtype == np.float32 and labels.tolist() == [1.5, 2.0]


def test_loading_names_the_missing_or_incompatible_file(tmp_path: Path) -> None:
    with pytest.raises(DataError) as exc:
        Preprocessor.load(tmp_path)
    assert message(exc) == f"{tmp_path}: preprocess.json is missing; train the model first"
    pre = fit(tabular_train(), schema(TABULAR))
    pre.save(tmp_path)
    state = json.loads((tmp_path / "preprocess.json").read_text())
    (tmp_path / "preprocess.json").write_text(json.dumps({**state, "format": 2}))
    with pytest.raises(DataError) as exc:
        Preprocessor.load(tmp_path)
    assert message(exc) == (
        f"{tmp_path / 'preprocess.json'}: written by an incompatible version of trainflow; train the model again"
    )
    (tmp_path / "preprocess.json").write_text(json.dumps({**state, "text_column": "note"}))
    with pytest.raises(DataError) as exc:
        Preprocessor.load(tmp_path)
    assert message(exc) == f"{tmp_path}: tokenizer.json is missing; train the model again"
    with pytest.raises(ValueError, match="^this preprocessor has no text column$"):
        pre.tokens(pd.DataFrame({"note": ["x"]}))
    with pytest.raises(ValueError, match="^this preprocessor has no image column$"):
        pre.image_source(pd.DataFrame({"img": [b""]}))


# --- split: settings, the saved assignment, notes ------------------------------------------------------------------


def split_schema(features: list[str], task: str = "classification") -> Schema:
    return Schema(
        source="test",
        target="y",
        task=task,  # type: ignore[arg-type]
        features=features,
        kinds=dict.fromkeys(features, "numeric"),
        classes=["a", "b"] if task == "classification" else [],
        n_rows=0,
    )


def ids(n: int, labels: str = "ab") -> pd.DataFrame:
    return pd.DataFrame({"id": np.arange(n), "x": np.arange(n) * 0.5, "y": [labels[i % len(labels)] for i in range(n)]})


def test_the_settings_a_saved_assignment_must_match_are_complete_for_each_keying() -> None:
    frame = ids(10).assign(user=np.arange(10) // 2)
    s = split_schema(["x"])
    base = {"format": 2, "seed": 7, "val_fraction": 0.15, "test_fraction": 0.15, "stratify_by": "y"}
    assert sp.settings(frame, s, SplitParams(group_by="user", key=["id"], seed=7)) == {
        **base,
        "mode": "group_by",
        "columns": ["user"],
    }
    assert sp.settings(frame, s, SplitParams(key=["id", "x"], seed=7)) == {
        **base,
        "mode": "key",
        "columns": ["id", "x"],
    }
    assert sp.settings(frame, s, SplitParams(seed=7)) == {**base, "mode": "row", "columns": ["x", "y"]}
    keyed = frame.assign(**{ROW_KEY: np.arange(10, dtype=np.uint64)})
    assert sp.settings(keyed, s, SplitParams(val_fraction=0.2, test_fraction=0.1, seed=7)) == {
        **base,
        "val_fraction": 0.2,
        "test_fraction": 0.1,
        "mode": "row",
        "columns": [ROW_KEY],
    }
    assert sp.settings(frame, s, SplitParams(stratify=False, seed=7))["stratify_by"] is None
    texts = Schema("t", "y", "classification", ["x"], {"x": "numeric", "note": "text"}, ["a", "b"], 10, "note")
    assert sp.settings(frame.assign(note="hi"), texts, SplitParams(seed=7))["columns"] == ["x", "note", "y"]
    assert sp.settings(frame, split_schema(["x"], "regression"), SplitParams(seed=7))["stratify_by"] is None


def test_a_fresh_split_reports_its_generation_kept_rows_and_exactness() -> None:
    frame = ids(20)
    result = sp.assign(frame, split_schema(["x"]), SplitParams(key=["id"], seed=3))
    assert (result.kept, result.exact, result.notes) == (0, True, [])
    assert result.since is not None and result.since.tolist() == [1] * 20 and result.since.dtype == np.int32
    a = result.assignment
    assert a is not None and a.generation == 1 and len(a.keys) == 20 and a.keys.dtype == np.uint64
    assert (np.diff(a.keys.astype(np.float64)) > 0).all()  # sorted and unique
    assert np.bincount(result.split, minlength=3).tolist() == [14, 3, 3]
    # 10 rows of each class at .7/.15/.15: 7, 1.5, 1.5 each; the totals 14, 3, 3 need one class to give val the
    # rounding up and the other test.
    for label in "ab":
        assert sorted(np.bincount(result.split[frame["y"] == label], minlength=3).tolist()) == [1, 2, 7]


def test_the_saved_assignment_file_holds_typed_columns_and_its_settings_as_metadata(tmp_path: Path) -> None:
    settings = {"seed": 1, "mode": "key", "columns": ["id"], "format": 2}
    a = sp.Assignment(
        np.array([3, 9], dtype=np.uint64), np.array([2, 0], dtype=np.int8), settings, np.array([1, 2], np.int32), 2
    )
    a.save(tmp_path / "a.parquet")
    table = pq.read_table(tmp_path / "a.parquet")
    assert table.schema.metadata == {
        b"trainflow": b'{"columns": ["id"], "format": 2, "mode": "key", "seed": 1}',
        b"generation": b"2",
    }
    assert [(f.name, str(f.type)) for f in table.schema] == [("key", "uint64"), ("split", "int8"), ("since", "int32")]
    assert table.to_pydict() == {"key": [3, 9], "split": [2, 0], "since": [1, 2]}
    back = sp.Assignment.load(tmp_path / "a.parquet")
    assert back is not None and back.settings == settings and back.generation == 2
    assert back.keys.tolist() == [3, 9] and back.split.tolist() == [2, 0] and back.since.tolist() == [1, 2]
    assert back.generation_of(np.array([9, 4, 3], dtype=np.uint64)).tolist() == [2, -1, 1]
    assert sp.Assignment.load(tmp_path / "none.parquet") is None


def test_an_unreadable_assignment_is_named_with_its_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "a.parquet"
    path.write_bytes(b"not parquet")
    try:
        pq.ParquetFile(path)  # the reader Assignment.load opens it with, a column at a time
    except Exception as exc:  # noqa: BLE001 - the reader's own words, for the expected message
        why = f"{type(exc).__name__}: {exc}"
    assert sp.Assignment.load(path) is None
    assert capsys.readouterr().err == f"split: cannot read {path} ({why}); assigning every row afresh\n"
    pq.write_table(pa.table({"key": pa.array([1], pa.uint64())}), path)  # no settings in its metadata
    assert sp.Assignment.load(path) is None
    assert (
        capsys.readouterr().err == f"split: cannot read {path} (KeyError: b'trainflow'); assigning every row afresh\n"
    )


def test_other_settings_or_an_older_format_reassign_every_row_with_one_note(capsys: pytest.CaptureFixture[str]) -> None:
    frame = ids(20)
    s = split_schema(["x"])
    first = sp.assign(frame, s, SplitParams(key=["id"], seed=3))
    assert first.assignment is not None
    capsys.readouterr()
    again = sp.assign(frame, s, SplitParams(key=["id"], val_fraction=0.2, seed=4), previous=first.assignment)
    note = "split: the saved assignment was made with other settings (seed, val_fraction); every row is assigned afresh"
    assert again.notes == [note] and again.kept == 0
    assert again.assignment is not None and again.assignment.generation == 2
    assert capsys.readouterr().err == note + "\n"
    old = sp.Assignment(first.assignment.keys, first.assignment.split, {**first.assignment.settings, "format": 1})
    older = sp.assign(frame, s, SplitParams(key=["id"], seed=3), previous=old)
    assert older.notes == [
        "split: the saved assignment was made by an older trainflow, whose row keys did not depend on the seed; every "
        "row is assigned afresh"
    ]
    np.testing.assert_array_equal(older.split, first.split)  # afresh, with the same settings: the same split
    same = sp.assign(frame, s, SplitParams(key=["id"], seed=3), previous=first.assignment)
    assert same.notes == [] and same.kept == 20 and same.assignment is not None and same.assignment.generation == 1


def test_the_small_class_note_lists_ten_classes_and_counts_the_rest(capsys: pytest.CaptureFixture[str]) -> None:
    labels = [f"r{i:02d}" for i in range(12)]
    frame = pd.DataFrame({"id": np.arange(112), "x": 0.0, "y": ["big"] * 100 + labels})
    s = Schema("t", "y", "classification", ["x"], {"x": "numeric"}, sorted({*labels, "big"}), 112)
    result = sp.assign(frame, s, SplitParams(key=["id"], seed=0))
    listed = ", ".join(f"'{label}' (1 row)" for label in labels[:10])
    note = (
        "split: too few rows for val and test, so these classes are in train but missing from val or test (no metric "
        f"covers them there): {listed} and 2 more; add rows of them, or merge rare classes"
    )
    assert result.notes == [note] and capsys.readouterr().err == note + "\n"
    assert (result.split[100:] == 0).all()


# --- split: errors ---------------------------------------------------------------------------------------------------


def test_every_empty_split_message_names_the_split_its_fraction_and_the_fix() -> None:
    five = pd.DataFrame({"x": [1.0] * 5, "y": ["a"] * 5, "user": [1, 1, 2, 2, 2]})
    s = split_schema(["x"])
    with pytest.raises(DataError) as exc:
        sp.assign(five, s, SplitParams(stratify=False, seed=0))
    assert (
        str(exc.value)
        == "split: the val split is empty (5 rows, val fraction 0.15); add rows or raise split.val_fraction"
    )
    with pytest.raises(DataError) as exc:
        sp.assign(five, s, SplitParams(stratify=False, group_by="user", seed=0))
    assert str(exc.value) in {
        f"split: the {name} split is empty (5 rows in 2 groups of split.group_by 'user', {name} fraction 0.15); add "
        f"groups or raise split.{name}_fraction"
        for name in ("val", "test")
    }
    timed = five.assign(when=pd.Timestamp("2024-01-01"))
    with pytest.raises(DataError) as exc:
        sp.assign(timed, s, SplitParams(time_column="when", group_by="user", seed=0))
    assert str(exc.value) == (
        "split: the val split is empty (5 rows, 1 distinct timestamps, val fraction 0.15); add rows with other "
        "timestamps or raise split.val_fraction"
    )
    with pytest.raises(DataError) as exc:
        six = pd.concat([five.iloc[:1]] * 6, ignore_index=True)  # one key: its six rows land where their middle falls
        sp.assign(six, s, SplitParams(val_fraction=0.45, test_fraction=0.44, stratify=False, seed=0))
    assert str(exc.value) == (
        "split: the train split is empty (6 rows, train fraction 0.11); add rows or lower split.val_fraction / "
        "split.test_fraction"
    )


def test_column_errors_name_the_parameter_and_the_columns_there_are() -> None:
    frame = ids(10)
    s = split_schema(["x"])
    with pytest.raises(DataError) as exc:
        sp.assign(frame, s, SplitParams(key=[], seed=0))
    assert str(exc.value) == "split.key is an empty list: name the id column(s) to hash, or set it to null to hash rows"
    with pytest.raises(DataError) as exc:
        sp.assign(frame, s, SplitParams(group_by="user", seed=0))
    assert str(exc.value) == (
        "split.group_by: column 'user' is not in the processed table (for this data: -S 'split.group_by=null'); "
        "available columns: id, x, y"
    )
    with pytest.raises(DataError) as exc:
        sp.assign(frame, s, SplitParams(time_column="ts", key=["id"], seed=0))
    assert str(exc.value) == (
        "split.time_column: column 'ts' is not in the processed table (for this data: -S 'split.time_column=null'); "
        "available columns: id, x, y"
    )
    with pytest.raises(DataError) as exc:
        sp.assign(frame.drop(columns=["y"]), s, SplitParams(key=["id"], seed=0))
    assert str(exc.value) == (
        "split: the target column 'y' is not in the processed table (available: id, x); run `trainflow stage ingest` "
        "again"
    )
    with pytest.raises(DataError) as exc:
        sp.assign(frame.drop(columns=["x", "y"]), s, SplitParams(seed=0))
    assert str(exc.value) == (
        "split: the schema's column(s) 'x', 'y' are not in the processed table (available: id); run `trainflow stage "
        "ingest` again"
    )
    timed = frame.assign(when=pd.to_datetime(["2024-01-01"] * 9 + [None]))
    with pytest.raises(DataError) as exc:
        sp.assign(timed, s, SplitParams(time_column="when", seed=0))
    assert str(exc.value) == (
        "split.time_column: 1 of 10 rows have no timestamp in column 'when'; fill or drop them (data.missing: drop) "
        "or split without split.time_column"
    )


# --- split: time order, by hand --------------------------------------------------------------------------------------


def test_a_time_split_of_twenty_rows_is_the_hand_counted_one() -> None:
    """20 rows, .7/.15/.15: test from position 20 - 3 = 17, val from 17 - 3 = 14. Days 0..19 shuffled; rows carry
    no assignment."""
    days = np.random.default_rng(0).permutation(20)
    frame = ids(20).assign(when=pd.Timestamp("2024-01-01") + pd.to_timedelta(days, unit="D"))
    result = sp.assign(frame, split_schema(["x"]), SplitParams(time_column="when", seed=0))
    assert result.assignment is None and result.kept == 0 and result.exact and result.since is None
    np.testing.assert_array_equal(result.split, np.where(days >= 17, 2, np.where(days >= 14, 1, 0)))
    parts, _ = sp.split_frame(frame, split_schema(["x"]), SplitParams(time_column="when", seed=0))
    assert [len(p) for p in parts.values()] == [14, 3, 3]


@pytest.mark.parametrize(
    ("values", "cut", "moved"),
    [
        ([1, 2, 2, 2, 3], 2, 1),  # inside a run of 3 starting at 1: one back to its start
        ([1, 2, 2, 2, 3], 3, 4),  # two from the start, one from the end: to the end
        ([1, 2, 2, 3], 2, 1),  # equally near both ends: to the older side (the start)
        ([1, 2, 2, 3], 1, 1),  # at a run's start already
        ([1, 2, 2, 3], 3, 3),  # at a run's end already
        ([2, 2, 2], 0, 0),
        ([2, 2, 2], 3, 3),
        ([2, 2, 2, 2], 1, 0),
        ([2, 2, 2, 2], 3, 4),
    ],
)
def test_a_time_boundary_inside_equal_timestamps_moves_to_the_nearer_end(
    values: list[int], cut: int, moved: int
) -> None:
    assert sp._boundary(np.array(values), cut) == moved


def test_a_val_boundary_never_passes_the_test_boundary() -> None:
    """Ten rows, days 0 0 0 0 0 0 0 1 1 1 at .2/.2: test would start at 8, inside the run of day 1 (7..9): to 7;
    val at 6, inside the run of day 0 (0..6): to its end, 7, the same place: val is empty."""
    frame = ids(10).assign(when=pd.Timestamp("2024-01-01") + pd.to_timedelta([0] * 7 + [1] * 3, unit="D"))
    with pytest.raises(DataError) as exc:
        sp.assign(
            frame, split_schema(["x"]), SplitParams(time_column="when", val_fraction=0.2, test_fraction=0.2, seed=0)
        )
    assert str(exc.value) == (
        "split: the val split is empty (10 rows, 2 distinct timestamps, val fraction 0.2); add rows with other "
        "timestamps or raise split.val_fraction"
    )
    days = [0, 1, 2, 3, 4, 5, 6, 7, 7, 8]  # test at 8, inside 7 7 (7..8), equally near both ends: to 7; val at 6
    frame = frame.assign(when=pd.Timestamp("2024-01-01") + pd.to_timedelta(days, unit="D"))
    split = sp.assign(
        frame, split_schema(["x"]), SplitParams(time_column="when", val_fraction=0.2, test_fraction=0.2, seed=0)
    )
    assert split.split.tolist() == [0, 0, 0, 0, 0, 0, 1, 2, 2, 2]


# --- split: quotas, by hand ------------------------------------------------------------------------------------------


def test_fractions_are_integer_parts_per_billion() -> None:
    assert sp.fraction_parts(SplitParams()).tolist() == [700_000_000, 150_000_000, 150_000_000]
    assert sp.fraction_parts(SplitParams(val_fraction=0.123456789, test_fraction=0.1)).tolist() == [
        776_543_211,
        123_456_789,
        100_000_000,
    ]


def test_the_candidate_totals_are_the_roundings_largest_fractional_parts_first() -> None:
    w = sp.fraction_parts(SplitParams())
    # 24 rows: 16.8, 3.6, 3.6 -> floors 16, 3, 3 and two rows to place: train+val and train+test (.8+.6) before
    # val+test (.6+.6).
    assert [t.tolist() for t in sp._total_candidates(24, w)] == [[17, 4, 3], [17, 3, 4], [16, 4, 4]]
    assert [t.tolist() for t in sp._total_candidates(20, w)] == [[14, 3, 3]]  # exact: nothing to round
    # 10 rows: 7, 1.5, 1.5: one row to place; train (no fractional part) may not round up.
    assert [t.tolist() for t in sp._total_candidates(10, w)] == [[7, 2, 1], [7, 1, 2]]
    assert sp._choices(np.array([True, True, True]), 2, np.array([5, 9, 7])) == [(1, 2), (0, 1), (0, 2)]
    assert sp._choices(np.array([True, False, True]), 1, np.array([5, 9, 7])) == [(2,), (0,)]
    assert sp._choices(np.array([False, True, True]), 1, np.array([0, 3, 3])) == [(1,), (2,)]


def test_quotas_settle_each_class_and_the_totals_exactly() -> None:
    """Two classes of 10 rows at .7/.15/.15: each 7 / 1.5 / 1.5; the totals 14, 3, 3 need one class to round val up
    and the other test."""
    w = sp.fraction_parts(SplitParams())
    quota, exact = sp.quotas(np.array([10, 10]), np.zeros((2, 3), dtype=np.int64), w)
    assert exact and quota.tolist() == [[7, 2, 1], [7, 1, 2]]
    one, exact = sp.quotas(np.array([1, 3]), np.zeros((2, 3), dtype=np.int64), w)
    assert exact and one.tolist() == [[1, 0, 0], [2, 1, 0]]  # each class trains on one row at least; totals 3, 1, 0
    empty, exact = sp.quotas(np.array([0, 20]), np.zeros((2, 3), dtype=np.int64), w)
    assert exact and empty.tolist() == [[0, 0, 0], [14, 3, 3]]
    assert sp._settle(np.ones((1, 3), bool), np.array([1]), np.array([[0, 5, 5]]), np.array([0, 0, 2])) is None
    assert sp._settle(np.ones((1, 3), bool), np.array([1]), np.array([[0, 5, 5]]), np.array([0, -1, 2])) is None
    picks = sp._settle(np.ones((2, 3), bool), np.array([1, 1]), np.array([[0, 5, 4], [0, 5, 4]]), np.array([0, 1, 1]))
    assert picks is not None and picks.tolist() == [[0, 1, 0], [0, 0, 1]]


def test_new_units_fill_test_then_val_then_train_in_key_order() -> None:
    fixed = np.array([-1, -1, 0, -1, -1, -1], dtype=np.int8)
    stratum = np.array([0, 0, 0, 1, 1, 1])
    weight = np.array([1, 2, 1, 1, 1, 1])
    places = np.array([[0, 1, 1], [1, 1, 1]])
    # stratum 0: unit 0 (middle 0.5) < 1 test; unit 1 (rows 1..3, middle 2) -> train (val ends at 2); stratum 1 in
    # order: test, val, train.
    assert sp._fill(fixed, stratum, weight, places).tolist() == [2, 0, 0, 2, 1, 0]
    assert sp._fill(np.array([1, 2], np.int8), np.array([0, 0]), np.array([1, 1]), places).tolist() == [1, 2]
    one = sp._fill(np.array([-1, -1, -1], np.int8), np.zeros(3, np.int64), np.ones(3, np.int64), np.array([[1, -1, 1]]))
    assert one.tolist() == [2, 0, 0]  # a negative count of places is none


# --- stream: the budget, the choice and its words, the readers ------------------------------------------------------


def write_split(path: Path, frame: pd.DataFrame, row_group_size: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(path, index=False, row_group_size=row_group_size)
    return path


def uncompressed_mb(path: Path) -> float:
    meta = pq.read_metadata(path)
    return sum(meta.row_group(i).column(j).total_uncompressed_size for i in range(meta.num_row_groups)
               for j in range(meta.num_columns)) / 2**20  # fmt: skip


def test_the_budget_is_the_setting_or_a_quarter_of_the_memory() -> None:
    import os

    assert stream.budget_mb(DataParams(memory_budget_mb=12.5)) == 12.5
    quarter = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 4 / 2**20
    assert stream.budget_mb(DataParams(memory_budget_mb=None)) == quarter


def test_the_choice_to_stream_says_why_in_each_case(tmp_path: Path) -> None:
    a = write_split(tmp_path / "splits" / "train.parquet", pd.DataFrame({"x": np.arange(1000.0)}))
    b = write_split(tmp_path / "splits" / "val.parquet", pd.DataFrame({"x": np.arange(500.0)}))
    size = uncompressed_mb(a) + uncompressed_mb(b)
    assert stream.table_mb(a) + stream.table_mb(b) == approx(size)
    need = 6 * size  # a split in memory: about six times its data (the frame, the matrix, the outputs)
    what = f"train + val: {size:,.1f} MiB, about {need:,.0f} MiB in memory"
    held = stream.choose([a, b], DataParams(memory_budget_mb=1000))
    assert held == stream.Choice(False, f"held in memory ({what}; data.memory_budget_mb 1,000)")
    at_budget = stream.choose([a], DataParams(memory_budget_mb=6 * stream.table_mb(a)))
    assert not at_budget.streamed
    assert stream.choose([a], DataParams(memory_budget_mb=5.99 * stream.table_mb(a))).streamed
    small = DataParams(memory_budget_mb=0.001)
    assert stream.choose([a, b], small) == stream.Choice(
        True, f"streamed from disk ({what}, over data.memory_budget_mb 0)"
    )
    assert stream.choose([a], small, text=True) == stream.Choice(
        False,
        f"held in memory although over data.memory_budget_mb 0 (train: {uncompressed_mb(a):,.1f} MiB, about "
        f"{6 * uncompressed_mb(a):,.0f} MiB in memory): text is not streamed so far, tables and images are",
    )


def test_a_split_is_read_a_column_or_a_block_of_rows_at_a_time(tmp_path: Path) -> None:
    frame = pd.DataFrame(
        {"x": np.arange(10.0), "c": pd.Series(list("abcdefghij"), dtype="string"), "b": pd.array([True] * 10)}
    )
    path = write_split(tmp_path / "splits" / "train.parquet", frame, row_group_size=4)
    columns = stream.ParquetColumns(path)
    assert columns.columns == ["x", "c", "b"] and len(columns) == 10 and columns.split.path == path
    pd.testing.assert_series_equal(columns["c"], pd.read_parquet(path)["c"])
    parts = list(stream.blocks(path, 3, ["c", "x"]))
    assert [len(p) for p in parts] == [3, 3, 3, 1] and all(list(p.columns) == ["c", "x"] for p in parts)
    pd.testing.assert_frame_equal(pd.concat(parts, ignore_index=True), frame[["c", "x"]])
    pd.testing.assert_frame_equal(stream.head(path, 2), frame.iloc[:2])
    empty = write_split(tmp_path / "splits" / "empty.parquet", frame.iloc[:0])
    pd.testing.assert_frame_equal(stream.head(empty, 5), pd.read_parquet(empty))
    assert len(stream.head(empty, 5)) == 0


def test_rows_per_block_are_sixteen_mebibytes_of_float32_in_whole_multiples() -> None:
    assert stream.BLOCK_BYTES == 16 * 2**20
    assert stream.block_rows(4) == 2**20
    assert stream.block_rows(4, multiple=3) == 2**20 - 1  # 1048576 = 3 * 349525 + 1
    assert stream.block_rows(0) == 16 * 2**20  # no columns: a byte a row
    assert stream.block_rows(2**30) == 1 and stream.block_rows(2**30, multiple=8) == 8


def test_a_streamed_split_reads_its_rows_of_the_linked_table_as_a_file_of_its_own_would_be_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    frame = pd.DataFrame(
        {
            "x": np.arange(10.0),
            ROW_KEY: np.arange(10, dtype=np.uint64),
            "c": pd.Series(list("abcdefghij"), dtype="string"),
            "n": pd.array([1, None, 3, 4, None, 6, 7, 8, 9, 10], dtype="Int64"),  # its dtype is in pandas' metadata
        }
    )
    splits = tmp_path / "splits"
    write_split(splits / stream.LINKED, frame, row_group_size=3)
    part = np.array([0, 1, 0, 2, 2, 0, 1, 0, 0, 2], dtype=np.int8)
    np.save(splits / stream.ROWS, part)
    monkeypatch.setattr(stream, "BLOCK_BYTES", 64)  # a few rows a block
    for i, name in enumerate(SPLITS):
        want = frame.drop(columns=[ROW_KEY]).iloc[np.flatnonzero(part == i)].reset_index(drop=True)
        split = stream.Split.stored(splits, name)
        assert (split.path, split.part, split.name, len(split)) == (splits / stream.LINKED, i, name, len(want))
        assert split.exists() and split.files() == [splits / stream.LINKED, splits / stream.ROWS]
        assert split.columns == ["x", "c", "n"] and str(split).startswith(str(splits / name))
        assert split.mb() == approx(stream.table_mb(splits / stream.LINKED) * len(want) / 10)
        pd.testing.assert_frame_equal(split.read(), want, check_exact=True)
        for c in want.columns:
            pd.testing.assert_series_equal(stream.ParquetColumns(split)[c], want[c], check_exact=True)
        for rows in (1, 2, 4):
            blocks = list(stream.blocks(split, rows, ["n", "x"]))
            whole, rest = divmod(len(want), rows)
            assert [len(b) for b in blocks] == [rows] * whole + [rest] * (rest > 0)
            pd.testing.assert_frame_equal(pd.concat(blocks, ignore_index=True), want[["n", "x"]], check_exact=True)
        pd.testing.assert_frame_equal(stream.head(split, 2), want.iloc[:2], check_exact=True)
    # a file of its own wins; without rows.npy there is only the file of its own (missing: named in the message)
    write_split(splits / "val.parquet", frame.iloc[:2].drop(columns=[ROW_KEY]))
    assert stream.Split.stored(splits, "val").part is None and len(stream.Split.stored(splits, "val")) == 2
    (splits / stream.ROWS).unlink()
    test = stream.Split.stored(splits, "test")
    assert test.path == splits / "test.parquet" and not test.exists()
    # rows.npy of another table: named, with how to make it again
    np.save(splits / stream.ROWS, part[:7])
    with pytest.raises(DataError, match=r"rows.npy holds \(7,\) split numbers for the 10 rows of .*table.parquet; "
                                        r"restore .* `trainflow stage split`"):  # fmt: skip
        len(stream.Split.stored(splits, "test"))


def test_damaged_or_missing_files_say_how_to_restore_them(tmp_path: Path) -> None:
    processed = tmp_path / "data" / "processed" / "table.parquet"
    split = tmp_path / "data" / "splits" / "train.parquet"
    for path in (processed, split):
        with pytest.raises(DataError) as exc:
            stream.ParquetColumns(path)
        how = (
            "restore the version DVC committed with `dvc checkout --force data/processed`, or write it again with "
            "`trainflow stage ingest`"
            if path is processed
            else "restore the version DVC committed with `dvc checkout --force data/splits`, or write it again with "
            "`trainflow stage split`"
        )
        assert str(exc.value) == f"{path} is missing; {how}"
        path.parent.mkdir(parents=True)
        path.write_bytes(b"PAR1 not really")
        try:
            pq.ParquetFile(path, pre_buffer=False)
        except Exception as why:  # noqa: BLE001 - pyarrow's own words, for the expected message
            reason = str(why)
        with pytest.raises(DataError) as exc:
            stream.table_mb(path)
        assert str(exc.value) == f"{path} cannot be read, it is corrupt or truncated ({reason}); {how}"


def test_the_streamed_matrix_is_the_in_memory_transform_for_both_tasks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    frame = tabular_train().assign(num=[1.0, np.nan, 3.0, 4.0, 7.0], cat=pd.Series(list("babxc"), dtype="string"))
    path = write_split(tmp_path / "splits" / "train.parquet", frame)
    pre = fit(frame, schema(TABULAR))
    monkeypatch.setattr(stream, "BLOCK_BYTES", 4 * pre.width * 2)  # blocks of 2 rows: the last one partial
    x, y = stream.write_matrix(pre, path, tmp_path / "m", "train")
    assert x.dtype == np.float32 and y.dtype == np.int64
    assert isinstance(x, np.memmap) and isinstance(y, np.memmap) and not x.flags.writeable and not y.flags.writeable
    np.testing.assert_array_equal(x, pre.features(frame))
    assert y.tolist() == [0, 1, 0, 1, 0]
    reg = frame.assign(y=[1.0, 2.0, 6.0, 3.0, 3.0])
    path = write_split(tmp_path / "splits" / "reg.parquet", reg)
    rpre = fit(reg, schema(TABULAR, task="regression"))
    x, y = stream.write_matrix(rpre, path, tmp_path / "r", "train")
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, (np.array([1.0, 2.0, 6.0, 3.0, 3.0]) - 3.0) / math.sqrt(2.8), rtol=1e-6)
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["x.npy", "y.npy"]
    unknown = write_split(tmp_path / "splits" / "val.parquet", frame.assign(y=["a", "a", "a", "a", "zz"]))
    with pytest.raises(DataError) as exc:
        stream.write_matrix(pre, unknown, tmp_path / "v", "data/splits/val.parquet")
    assert message(exc) == (
        "data/splits/val.parquet: target column 'y' has labels ['zz'] in 1 row(s) that the schema does not know "
        "(known labels: ['a', 'b'])"
    )
    bad = write_split(tmp_path / "splits" / "bad.parquet", frame.assign(num=["1", "x", "2", "3", "4"]))
    with pytest.raises(DataError) as exc:
        stream.write_matrix(pre, bad, tmp_path / "b", "data/splits/bad.parquet")
    assert message(exc) == (
        "data/splits/bad.parquet: column 'num' should hold numbers but has ['x'] in 1 row(s) (first at row 1)"
    )


# --- spill: a raw table on disk, read a column or a block of rows at a time --------------------------------------


def arrow_chunk(path: Path, table: pa.Table) -> Path:
    import pyarrow.feather as feather

    path.parent.mkdir(parents=True, exist_ok=True)
    feather.write_feather(table, path)
    return path


def test_a_spilled_frame_reads_each_column_over_every_file_cast_to_its_type(tmp_path: Path) -> None:
    one = arrow_chunk(tmp_path / "0-0.arrow", pa.table({"a": pa.array([1, 2], pa.int32()), "b": ["x", "y"]}))
    two = arrow_chunk(tmp_path / "0-1.arrow", pa.table({"a": pa.array([3], pa.int32()), "b": ["z"]}))
    parquet = tmp_path / "p.parquet"
    pq.write_table(pa.table({"a": pa.array([4.5, None], pa.float64()), "b": ["w", None]}), parquet)
    typed_b = arrow_chunk(tmp_path / "typed.arrow", pa.table({"b": ["W", "V"]}))
    frame = spill.SpilledFrame(
        tmp_path, [[one, two], [parquet]], ["a", "b"], {"a": pa.float64(), "b": pa.string()},
        {(1, "b"): typed_b}, 5, ["one.csv", "p.parquet"],
    )  # fmt: skip
    assert len(frame) == 5 and frame.shape == (5, 2) and frame.folder == tmp_path
    assert frame.arrow("a").type == pa.float64() and frame.arrow("a").to_pylist() == [1.0, 2.0, 3.0, 4.5, None]
    a = frame["a"]
    assert a.name == "a" and a.dtype == np.float64 and a.tolist()[:4] == [1.0, 2.0, 3.0, 4.5] and np.isnan(a[4])
    assert frame["b"].tolist() == ["x", "y", "z", "W", "V"]
    blocks = list(frame.row_blocks())
    assert [len(b) for b in blocks] == [2, 1, 2]
    pd.testing.assert_frame_equal(
        pd.concat(blocks, ignore_index=True), pd.DataFrame({"a": [1.0, 2.0, 3.0, 4.5, np.nan], "b": list("xyzWV")})
    )
    bad = spill.SpilledFrame(tmp_path, [[one], [parquet]], ["b"], {"b": pa.int64()}, {}, 4, ["one.csv", "two.csv"])
    with pytest.raises(DataError) as exc:
        bad.arrow("b")
    try:
        pa.chunked_array([pa.array(["x", "y"])]).cast(pa.int64())
    except pa.ArrowException as why:
        reason = str(why)
    assert str(exc.value) == (
        f"data.source: column 'b' of one.csv is string, which cannot be combined with the other files' int64 ({reason})"
    )


def test_row_hashes_read_a_column_at_a_time_are_pandas_row_hashes() -> None:
    frame = pd.DataFrame({"a": [1.0, np.nan, 3.0], "b": ["x", None, "z"], "c": [True, False, True]})
    want = pd.util.hash_pandas_object(frame, index=False).to_numpy(dtype=np.uint64)
    got = spill.row_hashes((pd.util.hash_pandas_object(frame[c], index=False).to_numpy() for c in frame), 3)
    assert got.dtype == np.uint64 and got.tolist() == want.tolist()


def test_spilled_columns_come_back_typed_whole_by_rows_or_as_a_filtered_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spill, "BATCH_ROWS", 2)  # several record batches per column
    store = spill.ColumnSpill(tmp_path / "typed")
    x = pd.Series([1.5, np.nan, 3.0, 4.0, 5.0])
    c = pd.Series(["a", None, "c", "d", "e"], dtype="string")
    store.put("x", x)
    store.put("c", c)
    store.put("n", pd.array([1, None, 3, 4, 5], dtype="Int64"))
    store.put("x", x * 2)  # put again: replaces, keeps its place
    assert store.names == ["x", "c", "n"]
    assert sorted(p.name for p in (tmp_path / "typed").iterdir()) == ["0.arrow", "1.arrow", "2.arrow"]
    pd.testing.assert_series_equal(store.series("x"), (x * 2).rename("x"))
    pd.testing.assert_series_equal(store.series("c"), c.rename("c"))
    taken = store.take(np.array([4, 0]), ["c", "n"])
    want = pd.DataFrame({"c": pd.Series(["e", "a"], dtype="string"), "n": pd.array([5, 1], dtype="Int64")})
    pd.testing.assert_frame_equal(taken, want)
    keep = np.array([True, False, False, True, True])
    assert store.write_table(tmp_path / "t.parquet", ["n", "c"], keep) == 3
    want = pd.DataFrame({"n": pd.array([1, 4, 5], dtype="Int64"), "c": pd.Series(["a", "d", "e"], dtype="string")})
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "t.parquet"), want)
    assert store.write_table(tmp_path / "all.parquet", ["x"], None) == 5
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "all.parquet"), (x * 2).to_frame("x"))
    assert store.write_table(tmp_path / "none.parquet", ["x"], np.zeros(5, bool)) == 0
    again = spill.ColumnSpill(tmp_path / "typed")  # a folder that is there already (a rerun's spill)
    assert again.names == [] and again.folder == tmp_path / "typed"


TO_FRAME = pd.Series.to_frame  # pandas' own, for the references of the tests that count its calls


def count_conversions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of every Series ColumnSpill converts to Arrow (through Series.to_frame), as it converts them."""
    converted: list[int] = []

    def counted(self: pd.Series, *args: Any, **kwargs: Any) -> pd.DataFrame:
        converted.append(len(self))
        return TO_FRAME(self, *args, **kwargs)

    monkeypatch.setattr(pd.Series, "to_frame", counted)
    return converted


def test_a_column_is_put_a_batch_at_a_time_as_pyarrow_converts_it_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ColumnSpill.put converts a batch of rows at a time (never the whole column's Arrow copy), to the Arrow type and
    pandas metadata pyarrow gives the whole column, also when the first batch holds no value; objects that are not all
    strings or bytes are converted whole (ints and a float: double, where a batch of ints would be int64)."""
    store = spill.ColumnSpill(tmp_path / "typed", batch_rows=2)
    converted = count_conversions(monkeypatch)
    cases = {
        "late": pd.Series([None, None, None, "a", None, "b"], dtype=object),  # the first batch: no value
        "none": pd.Series([None, None, None], dtype=object),
        "x": pd.Series([1.5, np.nan, 3.0, 4.0, 5.0]),
        "flag": pd.Series(pd.array([None, True, False], dtype="boolean")),
        "mixed": pd.Series([1, None, 2.5, 3], dtype=object),  # ints and a float: double, as converted whole
        "bytes": pd.Series([None, None, b"\x01", b""], dtype=object),
    }
    for name, values in cases.items():
        converted.clear()
        store.put(name, values)
        whole = pa.Table.from_pandas(TO_FRAME(values, name), preserve_index=False)  # pyarrow's, independently
        with pa.OSFile(str(store._path(name)), "rb") as source:
            stored = pa.ipc.open_file(source).read_all()
        assert stored.schema.equals(whole.schema, check_metadata=True), name
        assert stored.equals(whole) and stored.column(0).num_chunks == -(-len(values) // 2), name
        if name in ("mixed", "none"):
            assert converted == [len(values)]  # whole: the type is all the values'
        else:
            assert max(converted) <= 2, name


def test_a_coded_column_is_put_as_pyarrow_converts_its_values_per_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ColumnSpill.put_coded: the column categories[codes] (None at -1) stored as pyarrow converts that whole column
    of Python objects: type, pandas metadata and values, in batches of batch_rows; never a Series per row."""
    store = spill.ColumnSpill(tmp_path / "typed", batch_rows=2)
    cases = {
        "late": (["b", "a"], [-1, -1, -1, 1, -1, 0]),  # the first batch: no value
        "some": (["x", "", "é"], [2, 0, 0, 1, -1]),
        "none": (["a"], [-1, -1, -1]),  # no value at all: typed as pyarrow types an all-missing column
        "empty": ([], [-1, -1]),
    }
    converted = count_conversions(monkeypatch)
    for name, (categories, codes) in cases.items():
        converted.clear()
        store.put_coded(name, np.array(codes, dtype=np.int32), categories)
        # the type from one value; the rows by Arrow (without a value: put converts the whole column, as before)
        assert converted == ([len(codes)] if name in ("none", "empty") else [1]), name
        values = pd.Series([categories[c] if c >= 0 else None for c in codes], dtype=object)
        whole = pa.Table.from_pandas(TO_FRAME(values, name), preserve_index=False)  # pyarrow's, by hand
        with pa.OSFile(str(store._path(name)), "rb") as source:
            stored = pa.ipc.open_file(source).read_all()
        assert stored.schema.equals(whole.schema, check_metadata=True), name
        assert stored.equals(whole) and stored.column(0).num_chunks == -(-len(codes) // 2), name


def test_ahead_gives_every_item_in_order_raises_an_error_in_its_place_and_closes_what_it_reads() -> None:
    assert list(spill.ahead(iter(range(5)))) == [0, 1, 2, 3, 4]
    closed = []

    def items(fail_at: int | None) -> Any:
        try:
            for i in range(10):
                if i == fail_at:
                    raise OSError(f"cannot read chunk {i}")
                yield i
        finally:
            closed.append(fail_at)

    got = []
    with pytest.raises(OSError, match="cannot read chunk 3"):
        for i in spill.ahead(items(3)):
            got.append(i)
    assert got == [0, 1, 2] and closed == [3]
    reading = spill.ahead(items(None))
    assert next(reading) == 0
    reading.close()  # the caller stopped early (its own error): the reader is closed, not left in its thread
    assert closed == [3, None]


def test_a_raw_table_converts_dates_to_timestamps_and_single_columns_are_read_from_either_format(
    tmp_path: Path,
) -> None:
    table = pa.table(
        {"0": [1, 2], "when": pa.array([0, 86_400], pa.timestamp("s")), "day": pa.array([0, 1], pa.date32())}
    )
    frame = spill.to_pandas(table)
    assert list(frame.columns) == ["0", "when", "day"] and str(frame["when"].dtype) == "datetime64[s]"
    assert frame["day"].tolist() == [pd.Timestamp("1970-01-01"), pd.Timestamp("1970-01-02")]  # dates as timestamps
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"a": [1, 2], "b": ["x", "y"]}), path)
    assert spill.read_column(path, "b").to_pylist() == ["x", "y"]
    chunk = arrow_chunk(tmp_path / "c.arrow", pa.table({"a": [3], "b": pa.array([1], pa.int8())}))
    assert spill.read_column(chunk, "b").type == pa.int8()


# --- preprocessing: images and text --------------------------------------------------------------------------------


def png(mode: str, size: tuple[int, int], color: int | tuple[int, ...]) -> bytes:
    """An encoded PNG of one colour; size is (width, height), as PIL has it."""
    from PIL import Image

    out = io.BytesIO()
    Image.new(mode, size, color).save(out, format="PNG")
    return out.getvalue()


IMAGES = schema({"img": "image"}, image_column="img")


def test_image_statistics_are_the_train_pixels_per_channel() -> None:
    """Two grayscale 3x2 (width x height) images of 10 and 30: mean 20, std 10, one channel, kept at 2x3."""
    frame = pd.DataFrame({"img": [png("L", (3, 2), 10), png("L", (3, 2), 30)], "y": ["a", "b"]})
    pre = fit(frame, IMAGES)
    state = pre.to_json()
    assert {k: state[k] for k in ("image_column", "image_size", "image_resize", "image_channels")} == {
        "image_column": "img", "image_size": [2, 3], "image_resize": False, "image_channels": 1
    }  # fmt: skip
    assert state["image_mean"] == approx([20.0]) and state["image_std"] == approx([10.0])
    assert pre.raw_features == [] and pre.width == 0
    values, names = pre.image_source(frame, "train")
    assert names == ["in train, row 0", "in train, row 1"]
    pixels = pre.decode(values, names)
    assert pixels.dtype == np.uint8 and pixels.shape == (2, 1, 2, 3) and pixels[:, 0, 0, 0].tolist() == [10, 30]

    # One colour image among grey ones makes every image RGB; a constant image has std 0 -> 1.
    rgb = pd.DataFrame({"img": [png("L", (3, 2), 10), png("RGB", (3, 2), (10, 20, 30))], "y": ["a", "b"]})
    colour = fit(rgb, IMAGES)
    assert colour.image_channels == 3
    assert colour.image_mean == approx([10.0, 15.0, 20.0]) and colour.image_std == approx([1.0, 5.0, 10.0])


def test_images_of_other_sizes_need_image_size_and_are_resized_to_it() -> None:
    frame = pd.DataFrame({"img": [png("L", (3, 2), 10), png("L", (5, 4), 30)], "y": ["a", "b"]})
    with pytest.raises(DataError) as exc:
        fit(frame, IMAGES)
    assert message(exc) == (
        "train: image in train, row 1 is 4x5 (height x width) but in train, row 0 is 2x3; images of different sizes "
        "need features.image_size, the [height, width] to resize them to"
    )
    square = fit(frame, IMAGES, image_size=4)
    assert (square.image_size, square.image_resize) == ([4, 4], True)
    assert square.image_mean == approx([20.0]) and square.image_std == approx([10.0])
    wide = fit(frame, IMAGES, image_size=[2, 6])
    assert wide.image_size == [2, 6]
    assert wide.decode(*wide.image_source(frame)).shape == (2, 1, 2, 6)

    kept = fit(frame.iloc[:1], IMAGES)  # 2x3, not resized: another size at prediction is an error
    with pytest.raises(DataError) as exc:
        kept.decode(*kept.image_source(frame.iloc[[1]], "predict.csv"), "predict.csv")
    assert message(exc) == (
        "predict.csv: image in predict.csv, row 0 is 4x5 (height x width) but the model takes 2x3 images; resize it, "
        "or train with features.image_size set to resize every image"
    )


def test_image_cells_are_bytes_or_paths_named_as_given(tmp_path: Path) -> None:
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "one.png").write_bytes(png("L", (3, 2), 40))
    frame = pd.DataFrame({"img": [png("L", (3, 2), 10)], "y": ["a"]})
    pre = fit(frame.assign(img_path=["raw/zero.png"]), IMAGES)
    cells = pd.DataFrame({"img": [b"", "pics/one.png", str(tmp_path / "pics" / "one.png")]})
    values, names = pre.image_source(cells.iloc[1:], base=tmp_path)
    assert values == [tmp_path / "pics" / "one.png"] * 2
    assert names == ["pics/one.png", str(tmp_path / "pics" / "one.png")]
    assert pre.image_source(cells.iloc[1:2])[0] == [Path("pics/one.png")]
    with_paths = pd.DataFrame({"img": [png("L", (3, 2), 1)], "img_path": ["raw/a.png"]})
    assert pre.image_source(with_paths)[1] == ["raw/a.png"]
    with pytest.raises(DataError) as exc:
        pre.image_source(pd.DataFrame({"img": [png("L", (3, 2), 1), None]}), "predict.csv")
    assert message(exc) == (
        "predict.csv, row 1: column 'img' should hold an image (a file's path, or its bytes) but has None; fill it in "
        "or drop the row"
    )
    with pytest.raises(DataError) as exc:
        pre.image_source(pd.DataFrame({"img": ["  "]}))
    assert message(exc) == (
        "input, row 0: column 'img' should hold an image (a file's path, or its bytes) but has '  '; fill it in or "
        "drop the row"
    )
    with pytest.raises(DataError) as exc:
        pre.decode([tmp_path / "gone.png"], ["gone.png"])
    assert message(exc) == f"image gone.png: no such file (looked for {tmp_path / 'gone.png'})"
    from PIL import Image, UnidentifiedImageError

    try:
        Image.open(io.BytesIO(b"junk"))
    except UnidentifiedImageError as why:
        reason = str(why)
    with pytest.raises(DataError) as exc:
        pre.decode([b"junk"], ["in input, row 0"])
    # PIL names the BytesIO it read by its address: the same text but for that
    assert re.sub("0x[0-9a-f]+", "0x", message(exc)) == re.sub(
        "0x[0-9a-f]+", "0x", f"image in input, row 0 cannot be read ({reason}); replace the file or remove its row"
    )
    cut = png("L", (30, 20), 7)[:-30]  # its header reads; its pixels do not
    try:
        Image.open(io.BytesIO(cut)).load()
    except OSError as why:
        reason = str(why)
    with pytest.raises(DataError) as exc:
        pre.decode([cut], ["cut.png"])
    assert message(exc) == f"image cut.png cannot be read ({reason}); replace the file or remove its row"


def test_a_pretrained_tokenizer_is_used_as_given_and_an_empty_encoding_is_named() -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"<pad>": 0, "<unk>": 1, "hello": 2, "world": 3}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    s = schema({"note": "text", "x": "numeric"}, text_column="note")
    frame = pd.DataFrame({"note": ["hello world", "world"], "x": [1.0, 2.0], "y": ["a", "b"]})
    pre = Preprocessor.fit(frame, s, FeatureParams(max_length=16), tokenizer=(tok, 7))
    assert pre.tokenizer is tok and pre.pad_id == 7 and pre.vocab_size == 4
    assert (pre.text_column, pre.max_length, pre.raw_features) == ("note", 16, ["x"])
    assert [t.tolist() for t in pre.tokens(pd.DataFrame({"note": ["hello", "world hello nope"]}))] == [[2], [3, 2, 1]]
    with pytest.raises(DataError) as exc:
        pre.tokens(pd.DataFrame({"note": ["hello", None]}), "val")
    assert message(exc) == (
        "val, row 1: the text in 'note' encodes to no tokens (the tokenizer adds no special tokens, and the text is "
        "empty or missing); give it text or drop the row"
    )


def test_a_trained_tokenizer_is_saved_beside_the_json_and_numbers_are_texts_too(tmp_path: Path) -> None:
    s = schema({"note": "text"}, text_column="note")
    frame = pd.DataFrame({"note": ["red fox", None, "blue fox", 42], "y": ["a", "b", "a", "b"]}, dtype=object)
    pre = fit(frame, s, vocab_size=100, max_length=8)
    state = pre.to_json()
    assert (state["text_column"], state["max_length"], state["pad_id"], state["columns"]) == ("note", 8, 0, [])
    vocab = pre.tokenizer.get_vocab()  # type: ignore[union-attr]
    assert {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2}.items() <= vocab.items() and {"fox", "42"} <= vocab.keys()
    pre.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["preprocess.json", "tokenizer.json"]
    assert json.loads((tmp_path / "tokenizer.json").read_text()) == json.loads(pre.tokenizer.to_str())  # type: ignore[union-attr]
    back = Preprocessor.load(tmp_path)
    ids = [t.tolist() for t in back.tokens(pd.DataFrame({"note": ["RED fox", None, 42]}))]
    assert ids == [[2, vocab["red"], vocab["fox"]], [2], [2, vocab["42"]]]


# --- split: keys -------------------------------------------------------------------------------------------------


def test_key_columns_are_hashed_as_text_with_whole_numbers_as_integers() -> None:
    from pandas.util import hash_pandas_object

    def by_hand(text: pd.DataFrame, seed: int) -> list[int]:
        return [splitmix_by_hand(int(h), seed) for h in hash_pandas_object(text, index=False)]

    whole = pd.DataFrame({"k": [3.0, np.nan, 10.0], "g": ["a", "b", None]})
    text = pd.DataFrame(
        {"k": pd.Series(["3", None, "10"], dtype="string"), "g": pd.Series(["a", "b", None], dtype="string")}
    )
    assert sp.row_keys(whole, ["k", "g"], 5).tolist() == by_hand(text, 5)
    fractions = pd.DataFrame({"k": [3.0, 2.5]})
    assert sp.row_keys(fractions, ["k"], 5).tolist() == by_hand(
        pd.DataFrame({"k": pd.Series(["3.0", "2.5"], dtype="string")}), 5
    )
    ints = pd.DataFrame({"k": [3, 10]})
    assert sp.row_keys(ints, ["k"], 9).tolist() == by_hand(
        pd.DataFrame({"k": pd.Series(["3", "10"], dtype="string")}), 9
    )
    raw = pd.DataFrame({ROW_KEY: np.array([7, 2**63], dtype=np.uint64)})  # the raw-row key: hashed as the number
    assert sp.row_keys(raw, [ROW_KEY], 1).tolist() == by_hand(raw, 1)
    assert int(sp.seed_word(4)) == int.from_bytes(hashlib.blake2b(b"trainflow.split:4", digest_size=8).digest(), "big")
    assert sp.seeded(np.array([0, 1, 2**64 - 1], dtype=np.uint64), 3).tolist() == [
        splitmix_by_hand(k, 3) for k in (0, 1, 2**64 - 1)
    ]


def test_a_large_frame_is_transformed_block_by_block_into_the_same_matrix() -> None:
    """Over 2 MiB of output (width 5: 104,857 rows a block): the rows of every block are the plain computation's."""
    n = 250_000
    rng = np.random.default_rng(0)
    num = rng.normal(5.0, 2.0, n)
    num[::7] = np.nan
    cat = rng.choice(["p", "q", "r", "s"], n)
    train = pd.DataFrame({"num": num, "cat": pd.Series(cat, dtype="string"), "y": ["a"] * n})
    pre = fit(train, schema({"num": "numeric", "cat": "categorical"}), max_categories=2)
    assert pre.width == 5
    present = num[~np.isnan(num)]
    filled = np.where(np.isnan(num), np.median(present), num)
    want = np.zeros((n, 5), dtype=np.float32)
    want[:, 0] = (filled - filled.mean()) / filled.std()
    want[:, 1] = np.isnan(num)
    kept = pre.columns[1].categories
    for i, value in enumerate(kept):
        want[:, 2 + i] = cat == value
    want[:, 4] = ~np.isin(cat, kept)
    np.testing.assert_allclose(pre.features(train), want, rtol=1e-5, atol=1e-6)


def test_duplicate_rows_count_as_rows_in_the_quotas_and_in_what_was_kept() -> None:
    """20 ids, each twice (40 rows), unstratified: quotas of 28, 6, 6 rows; each id's two rows go where their middle
    falls (1, 3, 5 for the first three ids in key order: test ends at 6), so 3 ids test, 3 val, 14 train."""
    frame = pd.concat([ids(20), ids(20)], ignore_index=True)
    p = SplitParams(key=["id"], stratify=False, seed=2)
    first = sp.assign(frame, split_schema(["x"]), p)
    assert np.bincount(first.split, minlength=3).tolist() == [28, 6, 6]
    np.testing.assert_array_equal(first.split[:20], first.split[20:])
    assert first.assignment is not None and len(first.assignment.keys) == 20
    again = sp.assign(frame, split_schema(["x"]), p, previous=first.assignment)
    assert again.kept == 40 and again.assignment is not None and again.assignment.generation == 1
    np.testing.assert_array_equal(again.split, first.split)


@pytest.mark.parametrize(
    "given",
    [
        pd.array([True, None, False], dtype="boolean"),
        [1.0, np.nan, 0.0],  # a csv/json column of 1/0 with a blank reads as float64: it crashed (a read-only view)
        pd.array([1, None, 0], dtype="Int64"),
    ],
    ids=["boolean", "float", "Int64"],
)
def test_a_missing_boolean_at_prediction_is_the_train_mode_with_its_indicator(given: object) -> None:
    """Train: True, True, False and one missing -> mode 1.0, and a missing-indicator column. Each way a 0/1 column
    can arrive at prediction gives [value or mode, missing?] worked out by hand."""
    s = Schema(source="t", target="y", task="classification", features=["b"], kinds={"b": "boolean"},
               classes=["a", "b"], n_rows=4)  # fmt: skip
    train = pd.DataFrame({"b": pd.array([True, True, False, None], dtype="boolean"), "y": ["a", "b", "a", "b"]})
    pre = Preprocessor.fit(train, s, FeatureParams())
    np.testing.assert_array_equal(pre.features(pd.DataFrame({"b": given})), [[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
