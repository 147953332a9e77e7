"""infer_schema: column kinds, typed output, target and task (auto, with its reason), classes, drift, unseen
labels, missing values and duplicates, the rows dropped and why, the whole schema and the rows' raw keys; every
message in full."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from support.ingest_checks import SRC, P, T, fails, ingest

from trainflow.core.errors import DataError
from trainflow.data import validate as v
from trainflow.data.schema import ROW_KEY, Schema
from trainflow.data.validate import infer_schema
from trainflow.params import DataParams


@dataclass
class Table:
    """Stand-in for trainflow.data.sources.RawTable: row r of the frame is line r + 2 of f.csv (after the header)."""

    frame: pd.DataFrame
    source: str = "data/raw/f.csv"
    files: list[Path] = field(default_factory=lambda: [Path("data/raw/f.csv")])
    file_index: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    record: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    fmt: str = "csv"

    def where(self, row: int, column: str | None = None) -> str:
        return f"f.csv, line {row + 2}" + (f", column {column!r}" if column is not None else "")


def run(frame: pd.DataFrame | dict[str, Any], previous: Schema | None = None, **params: Any) -> tuple[Schema, Any]:
    params.setdefault("target", "y")
    return infer_schema(Table(pd.DataFrame(frame)), DataParams(**params), previous)


def error(frame: pd.DataFrame | dict[str, Any], previous: Schema | None = None, **params: Any) -> str:
    with pytest.raises(DataError) as info:
        run(frame, previous, **params)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("data.source: ")
    return message


def labels(n: int) -> list[str]:
    return ["a", "b"] * (n // 2) + ["a"] * (n % 2)


# 1. the params' columns against the table -------------------------------------------------------------------------


def test_empty_table_and_unknown_columns_are_errors() -> None:
    assert "no rows" in error(pd.DataFrame({"x": pd.Series([], dtype=float), "y": pd.Series([], dtype=str)}))

    message = error({"x": [1.0, 2.0], "label": ["a", "b"]})
    assert "data.target 'y' is not a column" in message and "'x', 'label'" in message

    message = error({"x": [1.0, 2.0], "y": ["a", "b"]}, features=["x", "nope"], exclude=["gone"])
    assert "data.features names columns that do not exist: 'nope' (for this data: -S 'data.features=[x]')" in message
    assert "data.exclude names columns that do not exist: 'gone' (for this data: -S 'data.exclude=[]')" in message
    assert "the columns are: 'x', 'y'" in message
    # The advice, followed: the -S values it gives validate against this table.
    try:
        run({"x": [1.0, 2.0], "y": ["a", "b"]}, None, features=["x"], exclude=[])
    except DataError as exc:  # a two-row table may fail later checks, never this one
        assert "do not exist" not in str(exc)
    message = error({"x": [1.0, 2.0], "y": ["a", "b"]}, features=["nope"])
    assert "(for this data: -S 'data.features=null')" in message

    message = error({"x": [1.0, 2.0], "y": ["a", "b"]}, text_column="body")
    assert "data.text_column 'body' is not a column" in message


# 2. column kinds and the typed table ------------------------------------------------------------------------------


def test_kinds_and_types_of_the_cleaned_table() -> None:
    frame = pd.DataFrame(
        {
            "id": [1, 2, 3, 4],
            "num": [1.5, np.nan, 3.0, 4.0],
            "count": pd.array([1, None, 3, 4], dtype="Int64"),
            "flag": [True, False, True, False],
            "answer": pd.Series(["Yes", "no", None, "TRUE"], dtype=object),
            "numtext": pd.Series(["1", " 2.5", None, "4"], dtype="str"),
            "when": ["2024-01-31", "2024-02-01T12:30:00", None, "2024-02-03"],
            "stamp": pd.to_datetime(["2024-01-01"] * 4).astype("datetime64[s]"),
            "city": pd.Series(["Oslo", None, "Rome", "Oslo"], dtype="str"),
            "body": ["good stuff", "bad", None, "fine"],
            "y": ["a", "b", "a", "b"],
        }
    )
    schema, out = run(frame, exclude=["id"], text_column="body")
    assert schema.features == ["num", "count", "flag", "answer", "numtext", "when", "stamp", "city"]
    assert schema.kinds == {
        "num": "numeric",
        "count": "numeric",
        "flag": "boolean",
        "answer": "boolean",
        "numtext": "numeric",
        "when": "datetime",
        "stamp": "datetime",
        "city": "categorical",
        "body": "text",
    }
    # The excluded column travels along as read; every row has the key of its raw values.
    assert list(out.columns) == [*schema.features, "body", "y", "id", ROW_KEY] and schema.carried == ["id"]
    assert out["id"].tolist() == [1, 2, 3, 4] and out[ROW_KEY].dtype == np.uint64 and out[ROW_KEY].is_unique
    assert schema.text_column == "body" and schema.source == "data/raw/f.csv" and schema.n_rows == 4
    for c in ("num", "count", "numtext"):
        assert out[c].dtype == np.float64
    assert out["count"].isna().tolist() == [False, True, False, False]
    assert out["numtext"].tolist()[:2] == [1.0, 2.5]
    assert out["flag"].dtype == "boolean" and out["answer"].dtype == "boolean"
    assert out["answer"].tolist() == [True, False, pd.NA, True]
    assert out["when"].dtype == "datetime64[ns]" and out["stamp"].dtype == "datetime64[ns]"
    assert out["when"][1] == pd.Timestamp("2024-02-01 12:30") and pd.isna(out["when"][2])
    for c in ("city", "body", "y"):
        assert out[c].dtype == object
    assert out["city"].tolist() == ["Oslo", None, "Rome", "Oslo"]
    assert out["body"].tolist() == ["good stuff", "bad", None, "fine"]
    assert out["y"].tolist() == ["a", "b", "a", "b"]


def test_float_columns_are_not_copied() -> None:
    frame = pd.DataFrame({"x": np.arange(1000, dtype=np.float64), "y": labels(1000)})
    _, out = infer_schema(Table(frame), DataParams.model_validate({"target": "y"}))
    assert np.shares_memory(out["x"].to_numpy(), frame["x"].to_numpy())


def test_wrong_typed_value_in_a_numeric_column() -> None:
    age = [str(20 + i % 50) for i in range(199)]
    age.insert(55, "abc")
    message = error({"age": age, "y": labels(200)})
    assert message == (
        "data.source: f.csv, line 57, column 'age': 'abc' is not a number (the column is numeric in 99% of rows); "
        "fix the value or add 'age' to data.exclude"
    )
    # with data.features the hint names that list; below 95% numbers the column is categorical
    assert "remove 'age' from data.features" in error({"age": age, "y": labels(200)}, features=["age"])
    schema, _ = run({"code": ["1", "2", "x", "y"] * 5, "y": labels(20)})
    assert schema.kinds["code"] == "categorical"


def test_stray_value_in_a_date_column() -> None:
    when = ["2024-01-01"] * 40
    when[7] = "soon"
    message = error({"when": when, "y": labels(40)})
    assert "f.csv, line 9, column 'when': 'soon' is not an ISO date" in message and "data.exclude" in message


def test_entirely_missing_feature_column() -> None:
    message = error({"x": [1.0, 2.0], "empty": [np.nan, np.nan], "y": ["a", "b"]})
    assert message == (
        "data.source: data/raw/f.csv, column 'empty': every value is missing; fill it in or add 'empty' to data.exclude"
    )
    schema, _ = run({"x": [1.0, 2.0], "empty": [None, None], "y": ["a", "b"]}, exclude=["empty"])
    assert schema.features == ["x"]


# 3. non-finite numbers --------------------------------------------------------------------------------------------


def test_non_finite_numbers_are_errors() -> None:
    message = error({"x": [1.0, 2.0, np.inf, 4.0], "y": labels(4)})
    assert message.startswith("data.source: f.csv, line 4, column 'x': inf is not a finite number")
    message = error({"x": [1.0, 2.0, 3.0, 4.0], "y": [1.5, -np.inf, 2.5, 3.5]}, task="regression")
    assert message.startswith("data.source: f.csv, line 3, column 'y': the target -inf is not a finite number")


# 4. target and task -----------------------------------------------------------------------------------------------


def test_missing_target_value_names_the_line() -> None:
    message = error({"x": [1.0, 2.0, 3.0, 4.0], "y": ["a", "b", None, "a"]})
    assert message.startswith("data.source: f.csv, line 4, column 'y': the target value is missing")
    message = error({"x": [1.0, 2.0, 3.0], "y": [1.0, np.nan, 2.0]})
    assert "f.csv, line 3, column 'y'" in message


def test_auto_task_regression_on_a_continuous_target() -> None:
    rng = np.random.default_rng(0)
    schema, out = run({"x": rng.normal(size=200), "y": rng.normal(size=200) * 10})
    assert schema.task == "regression" and schema.classes == []
    assert out["y"].dtype == np.float64


def test_auto_task_keeps_integer_coded_classes() -> None:
    # 30 classes 0..29 on 120 rows: more than 20 distinct and more than 5% of rows, but integer-coded classes
    y = np.arange(120) % 30
    schema, out = run({"x": np.arange(120.0), "y": y})
    assert schema.task == "classification"
    assert schema.classes == [str(i) for i in range(30)]  # sorted by value, not as text ("10" after "9")
    assert out["y"].dtype == object and out["y"][0] == "0"
    # few distinct values relative to the rows, but with fractions: measurements, so regression
    schema, _ = run({"x": np.arange(1000.0), "y": np.arange(1000) % 25 + 0.5})
    assert schema.task == "regression" and "fractions (e.g. 0.5)" in schema.task_reason


def test_class_labels_are_normalised_and_sorted() -> None:
    schema, out = run({"x": [1.0, 2.0, 3.0, 4.0], "y": [1.0, 0.0, 2.0, 1.0]}, task="classification")
    assert schema.classes == ["0", "1", "2"] and out["y"].tolist() == ["1", "0", "2", "1"]
    schema, out = run({"x": [1.0, 2.0, 3.0, 4.0], "y": [" cat", "dog ", "cat", "ant"]})
    assert schema.classes == ["ant", "cat", "dog"] and out["y"].tolist() == ["cat", "dog", "cat", "ant"]
    schema, out = run({"x": [1.0, 2.0, 3.0], "y": [True, False, True]})
    assert schema.task == "classification" and schema.classes == ["False", "True"]


def test_too_few_classes_and_non_numeric_regression_target() -> None:
    assert "single class ('a')" in error({"x": [1.0, 2.0], "y": ["a", "a"]})
    message = error({"x": [1.0, 2.0, 3.0], "y": ["1.5", "2.5", "lots"]}, task="regression")
    assert message.startswith("data.source: f.csv, line 4, column 'y': 'lots' is not a finite number")
    assert "data.task: classification" in message


def test_labels_differing_only_in_case_warn_once(capsys: pytest.CaptureFixture[str]) -> None:
    schema, _ = run({"x": [1.0, 2.0, 3.0, 4.0], "y": ["Spam", "spam", "ham", "spam"]})
    assert schema.classes == ["Spam", "ham", "spam"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'Spam'/'spam'" in err[0] and "'y'" in err[0]


# 5. previous schema: drift and unseen labels ----------------------------------------------------------------------


def previous_schema(**overrides: Any) -> Schema:
    fields: dict[str, Any] = dict(
        source="data/raw/f.csv",
        target="y",
        task="classification",
        features=["age", "city", "score"],
        kinds={"age": "numeric", "city": "categorical", "score": "numeric"},
        classes=["b", "a"],
        n_rows=10,
    )
    return Schema(**(fields | overrides))


def test_schema_drift_lists_every_changed_column() -> None:
    frame = {"age": ["young", "old"], "score": [1.0, 2.0], "zip": [1234, 5678], "y": ["a", "b"]}
    message = error(frame, previous_schema())
    assert "'age': numeric -> categorical" in message
    assert "'city' (categorical) is missing" in message
    assert "'zip' (numeric) is new" in message
    assert "'score'" not in message
    assert "3 changes" in message and "trainflow stage ingest --accept-schema" in message
    assert "data.features" not in message  # a column of before is gone: training on them is no way out
    frame = {"age": [1.0, 2.0], "city": ["x", "y"], "score": [1.0, 2.0], "zip": [1, 2], "y": ["a", "b"]}
    message = error(frame, previous_schema())
    assert "1 change: 'zip' (numeric) is new" in message
    assert "-S 'data.features=[age, city, score]'" in message  # only new columns: the ones of before still work


def test_previous_class_order_is_kept() -> None:
    frame = {"age": [1.0, 2.0, 3.0], "city": ["x", "y", "x"], "score": [1.0, 2.0, 3.0], "y": ["a", "a", "b"]}
    schema, out = run(frame, previous_schema(classes=["b", "a", "c"]))
    assert schema.classes == ["b", "a", "c"]  # not re-sorted, and "c" keeps its index though absent now
    assert out["y"].tolist() == ["a", "a", "b"]


def test_unseen_labels_error_or_drop(capsys: pytest.CaptureFixture[str]) -> None:
    frame = {
        "age": [1.0, 2.0, 3.0, 4.0, 5.0],
        "city": ["x", "y", "x", "y", "x"],
        "score": [1.0, 2.0, 3.0, 4.0, 5.0],
        "y": ["a", "b", "new", "a", "other"],
    }
    message = error(frame, previous_schema())
    assert message.startswith("data.source: f.csv, line 4, column 'y': label 'new' is not among the classes")
    assert "'new', 'other' in 2 rows" in message and "data.unseen_labels: drop" in message

    schema, out = run(frame, previous_schema(), unseen_labels="drop")
    assert schema.n_rows == 3 and schema.dropped == {"unseen_labels": 2}
    assert schema.classes == ["b", "a"]
    assert out["y"].tolist() == ["a", "b", "a"] and out["age"].tolist() == [1.0, 2.0, 4.0]
    err = capsys.readouterr().err
    assert "dropped 2 rows" in err and "'new', 'other'" in err


# 6. missing feature values ----------------------------------------------------------------------------------------


MISSING = {
    "x": [1.0, 2.0, np.nan, 4.0, 5.0],
    "c": pd.Series(["p", "q", "p", None, "q"], dtype=object),
    "y": labels(5),
}


def test_missing_values_impute_keeps_them() -> None:
    schema, out = run(MISSING)
    assert schema.n_rows == 5 and schema.dropped == {}
    assert np.isnan(out["x"][2]) and out["c"][3] is None


def test_missing_values_drop_counts_them() -> None:
    schema, out = run(MISSING, missing="drop")
    assert schema.n_rows == 3 and schema.dropped == {"missing": 2}
    assert out["x"].tolist() == [1.0, 2.0, 5.0] and list(out.index) == [0, 1, 2]


def test_missing_values_error_names_first_row_and_column() -> None:
    message = error(MISSING, missing="error")
    assert message.startswith("data.source: f.csv, line 4, column 'x': the value is missing (2 rows")


# 7. duplicates ----------------------------------------------------------------------------------------------------


DUPS = {"x": [1.0, 2.0, 1.0, 3.0, 2.0, 1.0], "c": ["p", "q", "p", "p", "q", "p"], "y": ["a", "b", "a", "a", "b", "b"]}


def test_duplicates_keep_and_drop() -> None:
    schema, out = run(DUPS)
    assert schema.n_rows == 6 and "duplicates" not in schema.dropped
    schema, out = run(DUPS, duplicates="drop")
    assert schema.n_rows == 4 and schema.dropped == {"duplicates": 2}
    assert out["x"].tolist() == [1.0, 2.0, 3.0, 1.0] and out["y"].tolist() == ["a", "b", "a", "b"]


def test_duplicates_error_names_both_lines() -> None:
    message = error(DUPS, duplicates="error")
    assert message.startswith("data.source: f.csv, line 4: the row duplicates f.csv, line 2 (2 duplicate rows")


def test_duplicates_consider_only_kept_columns() -> None:
    schema, _ = run({"id": [1, 2, 3], "x": [1.0, 1.0, 2.0], "y": ["a", "a", "b"]}, exclude=["id"], duplicates="drop")
    assert schema.dropped == {"duplicates": 1} and schema.n_rows == 2


def test_schema_params_leave_out_what_only_decides_rows() -> None:
    d = P(missing="drop", duplicates="drop", missing_target="drop", unseen_labels="drop", memory_budget_mb=5.0)
    got = v.schema_params(d)
    rows = {"missing", "duplicates", "missing_target", "unseen_labels", "memory_budget_mb"}
    assert got == {k: val for k, val in d.model_dump().items() if k not in rows}
    assert set(got) == {"source", "format", "delimiter", "header", "header_rows", "quoting", "columns", "encoding",
                        "target", "task", "features", "exclude", "text_column", "image_column"}  # fmt: skip


def test_raw_row_keys_hash_rows_and_fall_back_to_text_for_unhashable_values() -> None:
    frame = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    expected = pd.util.hash_pandas_object(frame, index=False).to_numpy(dtype=np.uint64)
    assert v.raw_row_keys(frame).dtype == np.uint64
    np.testing.assert_array_equal(v.raw_row_keys(frame), expected)
    nested = pd.DataFrame({"a": [1, 2], "b": pd.Series([[1, 2], {"k": 1}], dtype=object)})
    as_text = pd.DataFrame({"a": [1, 2], "b": pd.Series(["[1, 2]", "{'k': 1}"], dtype=object).astype(str)})
    np.testing.assert_array_equal(
        v.raw_row_keys(nested), pd.util.hash_pandas_object(as_text, index=False).to_numpy(dtype=np.uint64)
    )


def test_row_keys_of_a_table_with_nested_values_carried_along() -> None:
    tags = pd.Series([[1, 2], {"k": 1}, None], dtype=object)
    frame = pd.DataFrame({"x": [1.0, 2.0, 3.0], "tags": tags, "y": ["a", "b", "a"]})
    schema, out = ingest(frame, exclude=["tags"])
    assert schema.carried == ["tags"] and out["tags"].dtype == "string"
    assert out["tags"].tolist() == ["[1, 2]", "{'k': 1}", pd.NA]
    as_str = pd.Series(["[1, 2]", "{'k': 1}", None], dtype="str")  # what astype(str) makes of them
    text = pd.DataFrame({"x": [1.0, 2.0, 3.0], "tags": as_str, "y": pd.Series(["a", "b", "a"], dtype="str")})
    expected = pd.util.hash_pandas_object(text, index=False).to_numpy(dtype=np.uint64)
    assert out[ROW_KEY].tolist() == expected.tolist()


# --- the whole schema, and rows keyed by their raw values ------------------------------------------------------------


def test_the_whole_schema_of_an_ingest() -> None:
    frame = {"x": [1.0, 2.0, 3.0], "t": ["a b", "c", "d"], "id": [7, 8, 9], "y": pd.Series([True, False, True],
                                                                                             dtype=object)}  # fmt: skip
    schema, out = ingest(frame, exclude=["id"], text_column="t")
    assert schema == Schema(
        source=SRC,
        target="y",
        task="classification",
        features=["x"],
        kinds={"x": "numeric", "t": "text"},
        classes=["False", "True"],
        n_rows=3,
        text_column="t",
        dropped={},
        task_reason="target 'y' holds booleans",
        carried=["id"],
        data_params={"source": "builtin:digits", "format": "auto", "delimiter": None, "header": True,
                     "header_rows": 1, "quoting": "auto", "columns": None, "encoding": "utf-8", "target": "y",
                     "task": "auto", "features": None, "exclude": ["id"], "text_column": "t", "image_column": None},
        image_column=None,
    )  # fmt: skip
    assert out["y"].tolist() == ["True", "False", "True"]


# --- schema drift ----------------------------------------------------------------------------------------------------


def prev(**overrides: Any) -> Schema:
    fields: dict[str, Any] = dict(
        source=SRC,
        target="y",
        task="classification",
        features=["age", "city"],
        kinds={"age": "numeric", "city": "categorical"},
        classes=["b", "a"],
        n_rows=10,
    )
    return Schema(**(fields | overrides))


def test_drift_lists_every_change_in_order() -> None:
    frame = {"age": ["x", "y"], "zip": [1.0, 2.0], "t": [1.0, 2.0], "y": ["a", "b"]}
    assert fails(
        frame, prev(text_column="t", kinds={"age": "numeric", "city": "categorical", "t": "text"}), exclude=["t"]
    ) == (  # fmt: skip
        f"data.source: {SRC}: the data changed since the last ingest under the same data params (3 changes: 'age': "
        "numeric -> categorical; 'city' (categorical) is missing; 'zip' (numeric) is new). If the new data is "
        "right, accept its schema once with `trainflow stage ingest --accept-schema`, then rerun"
    )


def test_drift_of_new_columns_only_offers_the_columns_of_before() -> None:
    frame = {"age": [1.0, 2.0], "city": ["x", "y"], "zip": [1.0, 2.0], "y": ["a", "b"]}
    assert fails(frame, prev()) == (
        f"data.source: {SRC}: the data changed since the last ingest under the same data params (1 change: 'zip' "
        "(numeric) is new). If the new data is right, accept its schema once with `trainflow stage ingest "
        "--accept-schema`, then rerun; or keep training on the columns of before: -S 'data.features=[age, city]'"
    )
    # with data.features the new columns are not features: no drift
    schema, _ = ingest(frame, prev(), features=["age", "city"])
    assert schema.features == ["age", "city"]


def test_drift_reported_before_a_columns_problem() -> None:
    frame = {"age": [1.0, np.inf], "city": ["x", "y"], "y": ["a", "b"]}
    message = fails(frame, prev(kinds={"age": "numeric", "city": "numeric"}))
    assert message == (
        f"data.source: {SRC}: the data changed since the last ingest under the same data params (1 change: 'city': "
        "numeric -> categorical). If the new data is right, accept its schema once with `trainflow stage ingest "
        "--accept-schema`, then rerun"
    )
    assert fails(frame, prev()) == (
        "data.source: f.csv, line 3, column 'age': inf is not a finite number; fix the value or add 'age' to "
        "data.exclude"
    )


def test_drift_of_text_and_image_columns_and_unknown_kinds() -> None:
    table = T(pd.DataFrame({"a": [1.0]}))
    old = prev(features=["a"], kinds={}, text_column="t", image_column="img")
    with pytest.raises(DataError) as info:
        v._check_drift(table, P(), old, ["a"], {"a": "numeric", "t": "categorical"}, {"a": "a", "t": "t"})
    assert str(info.value) == (
        f"data.source: {SRC}: the data changed since the last ingest under the same data params (3 changes: 'a': "
        "? -> numeric; 't': ? -> categorical; 'img' (?) is missing). If the new data is right, accept its schema "
        "once with `trainflow stage ingest --accept-schema`, then rerun"
    )
    same = prev(features=["a"], kinds={"a": "numeric", "t": "text"}, text_column="t")
    v._check_drift(table, P(), same, ["a"], {"a": "numeric", "t": "text"}, {"a": "a", "t": "t"})  # no drift
    # a known column present but not typed this time (excluded now) is no change
    v._check_drift(table, P(), same, ["a"], {"a": "numeric"}, {"a": "a", "t": "t"})


# --- the target: auto task -------------------------------------------------------------------------------------------


def test_auto_task_rules_and_reasons() -> None:
    a = np.array
    assert v.auto_task("y", None, 5, "booleans") == ("classification", "target 'y' holds booleans")
    assert v.auto_task("y", a([1.0, 2.25, 3.5]), 5, "") == (
        "regression", "target 'y' holds numbers with fractions (e.g. 2.25)")  # fmt: skip
    assert v.auto_task("y", a(np.arange(100.0)), 100, "") == (
        "classification", "target 'y' holds the integer codes 0..99 (100 classes)")  # fmt: skip
    assert v.auto_task("y", a(np.arange(1.0, 101.0)), 100, "") == (
        "classification", "target 'y' holds the integer codes 1..100 (100 classes)")  # fmt: skip
    assert v.auto_task("y", a(np.arange(101.0)), 1000, "") == (
        "regression", "target 'y' holds 101 distinct integers, too many to be classes of 1,000 rows")  # fmt: skip
    assert v.auto_task("y", a(np.arange(2.0, 22.0)), 200, "") == (
        "classification", "target 'y' holds 20 distinct integers, few for 200 rows")  # fmt: skip
    assert v.auto_task("y", a(np.arange(2.0, 22.0)), 199, "") == (
        "regression", "target 'y' holds 20 distinct integers, too many to be classes of 199 rows")  # fmt: skip
    assert v.auto_task("y", a(np.arange(2.0, 23.0)), 5000, "") == (
        "regression", "target 'y' holds 21 distinct integers, too many to be classes of 5,000 rows")  # fmt: skip
    assert v.auto_task("y", a([0.0, 1.0, 3.0]), 10, "") == (  # a gap: not codes, and 3 * 10 > 10 rows
        "regression", "target 'y' holds 3 distinct integers, too many to be classes of 10 rows")  # fmt: skip
    assert v.auto_task("y", a([-1.0, 0.0, 1.0]), 30, "") == (
        "classification", "target 'y' holds 3 distinct integers, few for 30 rows")  # fmt: skip
    assert v.auto_task("y", a([2.0, 3.0]), 19, "")[0] == "regression"


def test_num_label_prints_integers_without_a_fraction() -> None:
    assert [v._num_label(x) for x in (1.0, -2.0, 2.5, np.float64(3.0), 1e20)] == [
        "1", "-2", "2.5", "3", "100000000000000000000"]  # fmt: skip


def test_auto_task_on_ingest_and_its_reason() -> None:
    y = [0, 1, 2, 3] * 3
    schema, out = ingest({"x": np.arange(12.0), "y": y})
    assert (schema.task, schema.task_reason) == (
        "classification",
        "target 'y' holds the integer codes 0..3 (4 classes)",
    )
    assert schema.classes == ["0", "1", "2", "3"] and out["y"].tolist() == [str(i) for i in y]
    schema, out = ingest({"x": np.arange(4.0), "y": [1.5, 2.0, 1.5, 3.0]})
    assert (schema.task, schema.task_reason) == ("regression", "target 'y' holds numbers with fractions (e.g. 1.5)")
    assert out["y"].tolist() == [1.5, 2.0, 1.5, 3.0]
    schema, _ = ingest({"x": np.arange(4.0), "y": ["b", "a", "b", "a"]})
    assert (schema.task, schema.task_reason) == ("classification", "target 'y' holds text labels")
    schema, _ = ingest({"x": np.arange(4.0), "y": [True, False, True, False]})
    assert (schema.task, schema.task_reason, schema.classes) == (
        "classification", "target 'y' holds booleans", ["False", "True"])  # fmt: skip
    # numbers written as text: decided as numbers, "01" and "1" being one value
    schema, out = ingest({"x": np.arange(5.0), "y": pd.Series(["01", "1", " 2", "3", "1"], dtype=object)})
    assert (schema.task, schema.task_reason) == (
        "classification",
        "target 'y' holds the integer codes 1..3 (3 classes)",
    )
    assert schema.classes == ["1", "2", "3"] and out["y"].tolist() == ["1", "1", "2", "3", "1"]


def test_task_from_params_or_the_previous_ingest() -> None:
    frame = {"age": np.arange(4.0), "city": ["p", "q", "p", "q"], "y": [1, 2, 1, 2]}
    schema, out = ingest(frame, task="regression")
    assert (schema.task, schema.task_reason, schema.classes) == ("regression", "data.task is regression", [])
    assert out["y"].dtype == np.float64 and out["y"].tolist() == [1.0, 2.0, 1.0, 2.0]
    schema, out = ingest(frame, task="classification")
    assert (schema.task, schema.task_reason) == ("classification", "data.task is classification")
    old = prev(task="regression", classes=[], task_reason="")
    schema, _ = ingest(frame, old)
    assert (schema.task, schema.task_reason) == ("regression", "the previous ingest found regression")
    schema, _ = ingest(frame, prev(task="regression", classes=[], task_reason="because"))
    assert (schema.task, schema.task_reason) == ("regression", "because")
    schema, out = ingest(frame, prev(classes=["2", "1"], task_reason="kept"))
    assert (schema.task, schema.task_reason, schema.classes) == ("classification", "kept", ["2", "1"])
    assert out["y"].tolist() == ["1", "2", "1", "2"]
    # data.task wins over the previous ingest
    schema, _ = ingest(frame, old, task="classification")
    assert (schema.task, schema.task_reason) == ("classification", "data.task is classification")


# --- the target: values and problems ---------------------------------------------------------------------------------


def test_regression_targets_as_float64() -> None:
    frame = pd.DataFrame({"x": np.arange(4.0), "y": [1.5, 2.0, 1.5, 3.0]})
    out = ingest(frame)[1]
    assert np.shares_memory(out["y"].to_numpy(), frame["y"].to_numpy())  # shared, not copied
    out = ingest(frame, task="regression")[1]
    assert np.shares_memory(out["y"].to_numpy(), frame["y"].to_numpy())
    schema, out = ingest({"x": np.arange(3.0), "y": pd.array([1, 5, 2], dtype="Int64")}, task="regression")
    assert out["y"].dtype == np.float64 and out["y"].tolist() == [1.0, 5.0, 2.0]
    schema, out = ingest({"x": np.arange(3.0), "y": pd.Series(["1.5", " 2", "1.5"], dtype=object)}, task="regression")
    assert out["y"].dtype == np.float64 and out["y"].tolist() == [1.5, 2.0, 1.5]
    schema, out = ingest({"x": np.arange(3.0), "y": pd.Series([1, 2.5, 1], dtype=object)})
    assert schema.task == "regression" and out["y"].dtype == np.float64 and out["y"].tolist() == [1.0, 2.5, 1.0]
    # integers too many to be classes
    schema, out = ingest({"x": np.arange(25.0), "y": np.arange(2, 27)})
    assert schema.task == "regression" and out["y"].dtype == np.float64 and out["y"].tolist() == list(range(2, 27))


def test_non_finite_targets_name_the_first_row() -> None:
    msg = "data.source: f.csv, line {}, column 'y': the target {} is not a finite number; fix the value"
    assert fails({"x": np.arange(4.0), "y": [1.0, 2.0, np.inf, -np.inf]}, task="regression") == msg.format(4, "inf")
    assert fails({"x": np.arange(4.0), "y": [1.0, -np.inf, 2.0, np.inf]}) == msg.format(3, "-inf")
    y = pd.Series([1, 2.5, float("inf")], dtype=object)
    assert fails({"x": np.arange(3.0), "y": y}) == msg.format(4, "inf")
    assert fails({"x": np.arange(3.0), "y": y}, task="regression") == msg.format(4, "inf")


def test_a_regression_target_that_is_not_numbers() -> None:
    frame = {"x": np.arange(3.0), "y": pd.Series(["1.5", "inf", "lots"], dtype=object)}
    assert fails(frame, task="regression") == (
        "data.source: f.csv, line 3, column 'y': 'inf' is not a finite number, but data.task is regression: a "
        "regression target must be numbers; fix the value, or set data.task: classification"
    )
    frame = {"x": np.arange(4.0), "y": [True, False, True, True]}
    assert fails(frame, task="regression") == (
        "data.source: f.csv, line 2, column 'y': the target is boolean (False, True), but data.task is regression: a "
        "regression target must be numbers; fix the value, or set data.task: classification"
    )
    old = prev(task="regression", classes=[], task_reason="fare is money")
    assert fails({"age": [1.0, 2.0], "city": ["p", "q"], "y": ["a", "b"]}, old) == (
        "data.source: f.csv, line 2, column 'y': 'a' is not a finite number, but fare is money: a regression target "
        "must be numbers; fix the value, or set data.task: classification"
    )
    # text labels with task classification are labels, stripped
    schema, out = ingest({"x": np.arange(3.0), "y": pd.Series(["inf", " b", "inf"], dtype=object)})
    assert schema.classes == ["b", "inf"] and out["y"].tolist() == ["inf", "b", "inf"]


def test_a_constant_regression_target_is_refused() -> None:
    assert fails({"x": np.arange(3.0), "y": [2.5, 2.5, 2.5]}) == (
        f"data.source: {SRC}, column 'y': every target value is 2.5; there is nothing to learn, check data.target"
    )
    frame = {"x": np.arange(3.0), "y": [np.nan, 7.0, 7.0]}
    assert fails(frame, task="regression", missing_target="drop") == (
        f"data.source: {SRC}, column 'y': every target value is 7; there is nothing to learn, check data.target"
    )


def test_classification_labels_of_numbers() -> None:
    schema, out = ingest({"x": np.arange(5.0), "y": [3, 1, 2, 10, 3]}, task="classification")
    assert schema.classes == ["1", "2", "3", "10"] and out["y"].tolist() == ["3", "1", "2", "10", "3"]
    schema, out = ingest({"x": np.arange(4.0), "y": [2.0, 0.5, 2.0, 1.0]}, task="classification")
    assert schema.classes == ["0.5", "1", "2"] and out["y"].tolist() == ["2", "0.5", "2", "1"]
    big = np.array([2**62 + 1, 2**62], dtype=np.int64)  # ints keep their digits (as floats they would be one)
    schema, out = ingest({"x": np.arange(2.0), "y": big}, task="classification")
    assert out["y"].tolist() == [str(2**62 + 1), str(2**62)]
    schema, out = ingest({"x": np.arange(3.0), "y": pd.Series([1, 2.0, 1.0], dtype=object)}, task="classification")
    assert schema.classes == ["1", "2"] and out["y"].tolist() == ["1", "2", "1"]
    assert out["y"].dtype == object


def test_object_targets_of_booleans_and_integers() -> None:
    schema, out = ingest({"x": np.arange(4.0), "y": pd.Series([1, 2, 1, 2], dtype=object)})
    assert (schema.task, schema.classes, out["y"].tolist()) == ("classification", ["1", "2"], ["1", "2", "1", "2"])
    assert schema.task_reason == "target 'y' holds the integer codes 1..2 (2 classes)"
    schema, out = ingest({"x": np.arange(3.0), "y": pd.Series([0.5, 1.5, 0.5], dtype=object)})
    assert (schema.task, out["y"].tolist()) == ("regression", [0.5, 1.5, 0.5])
    frame = {"x": np.arange(3.0), "y": pd.Series([True, None, False], dtype=object)}
    schema, out = ingest(frame, missing_target="drop")
    assert (schema.task, schema.classes, out["y"].tolist()) == ("classification", ["False", "True"], ["True", "False"])


def test_missing_target_values_error_or_drop(capsys: pytest.CaptureFixture[str]) -> None:
    frame = {"x": np.arange(5.0), "y": pd.Series(["a", " ", "b", None, "a"], dtype=object)}
    assert fails(frame) == (
        "data.source: f.csv, line 3, column 'y': the target value is missing (2 rows without one); fill in the "
        "labels, or set data.missing_target: drop"
    )
    frame1 = {"x": np.arange(3.0), "y": [1.5, np.nan, 2.5]}
    assert fails(frame1) == (
        "data.source: f.csv, line 3, column 'y': the target value is missing (1 row without one); fill in the "
        "labels, or set data.missing_target: drop"
    )
    blank = {"x": np.arange(2.0), "y": pd.Series(["", None], dtype=object)}
    assert fails(blank, missing_target="drop") == (
        "data.source: f.csv, line 2, column 'y': the target value is missing (2 rows without one); fill in the label"
    )
    capsys.readouterr()
    schema, out = ingest(frame, missing_target="drop")
    assert capsys.readouterr().err == (
        "ingest: dropped 2 rows without a target value 'y' (data.missing_target: drop)\n"
    )
    assert (schema.n_rows, schema.dropped, schema.classes) == (3, {"missing_target": 2}, ["a", "b"])
    assert out["y"].tolist() == ["a", "b", "a"] and out["x"].tolist() == [0.0, 2.0, 4.0]
    schema, out = ingest(frame1, missing_target="drop")
    assert capsys.readouterr().err == "ingest: dropped 1 row without a target value 'y' (data.missing_target: drop)\n"
    assert (schema.task, schema.n_rows, schema.dropped) == ("regression", 2, {"missing_target": 1})
    assert out["y"].tolist() == [1.5, 2.5]


def test_missing_target_rows() -> None:
    s = pd.Series(["a", "", "  ", None, np.nan, "b"], dtype=object)
    assert v._missing_target_rows(s).tolist() == [False, True, True, True, True, False]
    s = pd.Series(["a", "", None], dtype="string")
    assert v._missing_target_rows(s).tolist() == [False, True, True]
    s = pd.Series(["a", " ", None], dtype="str")
    assert v._missing_target_rows(s).tolist() == [False, True, True]
    assert v._missing_target_rows(pd.Series([1.0, np.nan, 0.0])).tolist() == [False, True, False]
    filled, missing = v._without_missing(T(None), P(missing_target="drop"), pd.Series([np.nan, 4.0, np.nan, 5.0]))
    assert filled.tolist() == [4.0, 4.0, 4.0, 5.0] and missing is not None and missing.tolist() == [
        True, False, True, False]  # fmt: skip
    s = pd.Series([1.0, 2.0])
    same, none = v._without_missing(T(None), P(), s)
    assert same is s and none is None


def test_the_auto_task_counts_the_rows_with_a_target() -> None:
    # 20 distinct integers 2..21 on 200 rows + 1 without a target: classes with 10 rows each of the 200 kept
    y = list(np.repeat(np.arange(2, 22), 10).astype(float)) + [np.nan]
    schema, _ = ingest({"x": np.arange(201.0), "y": y}, missing_target="drop")
    assert (schema.task, schema.task_reason) == (
        "classification",
        "target 'y' holds 20 distinct integers, few for 200 rows",
    )
    y = list(np.repeat(np.arange(2, 22), 10).astype(float))
    y[5] = np.nan  # 199 rows with a target
    schema, _ = ingest({"x": np.arange(200.0), "y": y}, missing_target="drop")
    assert (schema.task, schema.task_reason) == (
        "regression", "target 'y' holds 20 distinct integers, too many to be classes of 199 rows")  # fmt: skip


# --- classes ---------------------------------------------------------------------------------------------------------


def test_mostly_single_row_classes_are_refused_in_auto() -> None:
    # 10 classes, 6 of one row: more than half
    y = list("abcdef") + ["g"] * 2 + ["h"] * 2 + ["i"] * 2 + ["j"] * 2
    assert fails({"x": np.arange(14.0), "y": y}) == (
        f"data.source: {SRC}, column 'y': as classes, the target has 10 of them and 6 have a single row; check "
        "data.target (is it an id or a free-text column?), or set data.task: classification to train on it anyway"
    )
    # 5 of 10: not more than half
    y5 = list("abcde") + ["f"] * 2 + ["g"] * 2 + ["h"] * 2 + ["i"] * 2 + ["j"] * 2
    schema, _ = ingest({"x": np.arange(15.0), "y": y5})
    assert len(schema.classes) == 10
    # 9 classes of one row each: too few classes to tell
    schema, _ = ingest({"x": np.arange(9.0), "y": list("abcdefghi")})
    assert len(schema.classes) == 9
    # with data.task: classification, or a previous ingest, it is the user's choice
    schema, _ = ingest({"x": np.arange(14.0), "y": y}, task="classification")
    assert len(schema.classes) == 10
    # integer codes, one row each
    ids = [f"id{i}" for i in range(1001)] + ["id0"]
    assert fails({"x": np.arange(1002.0), "y": ids}) == (
        f"data.source: {SRC}, column 'y': as classes, the target has 1,001 of them and 1,000 have a single row; "
        "check data.target (is it an id or a free-text column?), or set data.task: classification to train on it "
        "anyway"
    )
    assert fails({"x": np.arange(12.0), "y": np.arange(12)}) == (
        f"data.source: {SRC}, column 'y': as classes, the target has 12 of them and 12 have a single row; it looks "
        "like a number to predict: set data.task: regression"
    )


def test_single_row_classes_counted_over_the_rows_with_a_target() -> None:
    # 6 single-row classes of 10 once the row without a target is left out; counted with it (filled by the first
    # label, 'a'), 'a' would have two rows and only 5 of 10 would be single
    y: list[Any] = list("abcdef") + ["g"] * 2 + ["h"] * 2 + ["i"] * 2 + ["j"] * 2 + [None]
    assert fails({"x": np.arange(15.0), "y": pd.Series(y, dtype=object)}, missing_target="drop") == (
        f"data.source: {SRC}, column 'y': as classes, the target has 10 of them and 6 have a single row; check "
        "data.target (is it an id or a free-text column?), or set data.task: classification to train on it anyway"
    )


def test_classes_sorted_by_value_or_text_and_a_single_class_refused(capsys: pytest.CaptureFixture[str]) -> None:
    schema, _ = ingest({"x": np.arange(4.0), "y": pd.Series(["10", "9", "x", "9"], dtype=object)})
    assert schema.classes == ["10", "9", "x"]
    schema, _ = ingest({"x": np.arange(4.0), "y": ["10", "9", "-1", "9"]}, task="classification")
    assert schema.classes == ["-1", "9", "10"]
    assert fails({"x": np.arange(2.0), "y": ["a", "a"]}) == (
        f"data.source: {SRC}, column 'y': the target has a single class ('a'); a classifier needs at least two, "
        "check data.target and the data"
    )
    # the classes are those of the rows kept: 'b' only in a dropped row
    assert fails({"x": [1.0, np.nan, 2.0], "y": ["a", "b", "a"]}, missing="drop") == (
        f"data.source: {SRC}, column 'y': the target has a single class ('a'); a classifier needs at least two, "
        "check data.target and the data"
    )
    schema, _ = ingest({"x": [1.0, np.nan, 2.0, 3.0], "y": ["a", "b", "c", "a"]}, missing="drop")
    assert schema.classes == ["a", "c"]
    capsys.readouterr()
    schema, _ = ingest({"x": np.arange(6.0), "y": ["Spam", "spam", "A", "a", "SPAM", "b"]})
    assert schema.classes == ["A", "SPAM", "Spam", "a", "b", "spam"]
    assert capsys.readouterr().err == (
        "ingest: warning: target 'y' has labels that differ only in case ('A'/'a', 'SPAM'/'Spam'/'spam'); they stay "
        "separate classes, fix the data if they are the same\n"
    )
    ingest({"x": np.arange(3.0), "y": ["a", "b", "a"]})
    assert capsys.readouterr().err == ""


def test_unseen_labels_name_the_first_row_and_count_what_is_dropped(capsys: pytest.CaptureFixture[str]) -> None:
    frame = {"age": np.arange(5.0), "city": list("pqpqp"), "y": ["a", "new", "b", "old", "new"]}
    assert fails(frame, prev()) == (
        "data.source: f.csv, line 3, column 'y': label 'new' is not among the classes the current model was trained "
        "on ('b', 'a'); unseen labels 'new', 'old' in 3 rows. Set data.unseen_labels: drop to drop those rows, or "
        "accept the new labels once with `trainflow stage ingest --accept-schema`, then rerun"
    )
    one = {"age": np.arange(3.0), "city": list("pqp"), "y": ["a", "b", "c"]}
    assert fails(one, prev()) == (
        "data.source: f.csv, line 4, column 'y': label 'c' is not among the classes the current model was trained "
        "on ('b', 'a'); unseen labels 'c' in 1 row. Set data.unseen_labels: drop to drop those rows, or "
        "accept the new labels once with `trainflow stage ingest --accept-schema`, then rerun"
    )
    capsys.readouterr()
    schema, out = ingest(frame, prev(), unseen_labels="drop")
    assert capsys.readouterr().err == (
        "ingest: dropped 3 rows whose target 'y' has a label the current model was not trained on ('new', 'old'; "
        "data.unseen_labels: drop)\n"
    )
    assert (schema.n_rows, schema.dropped, schema.classes) == (2, {"unseen_labels": 3}, ["b", "a"])
    assert out["y"].tolist() == ["a", "b"] and out["age"].tolist() == [0.0, 2.0]
    schema, out = ingest(one, prev(), unseen_labels="drop")
    assert capsys.readouterr().err == (
        "ingest: dropped 1 row whose target 'y' has a label the current model was not trained on ('c'; "
        "data.unseen_labels: drop)\n"
    )
    assert (schema.n_rows, schema.dropped) == (2, {"unseen_labels": 1})
    # a previous regression ingest knows no classes: no unseen labels when data.task says classification
    schema, _ = ingest(one, prev(task="regression", classes=[]), task="classification")
    assert schema.classes == ["a", "b", "c"] and schema.dropped == {}


def test_rows_dropped_for_several_reasons(capsys: pytest.CaptureFixture[str]) -> None:
    frame = {
        "age": [1.0, 2.0, np.nan, 4.0, 5.0, 1.0, 7.0],
        "city": ["p", "q", "p", "q", "p", "p", "q"],
        "y": ["a", None, "a", "new", "b", "a", "b"],
    }
    schema, out = ingest(frame, prev(), missing_target="drop", unseen_labels="drop", missing="drop",
                         duplicates="drop")  # fmt: skip
    assert list(schema.dropped.items()) == [("missing_target", 1), ("unseen_labels", 1), ("missing", 1),
                                            ("duplicates", 1)]  # fmt: skip
    assert schema.n_rows == 3 and schema.classes == ["b", "a"]
    assert out["age"].tolist() == [1.0, 5.0, 7.0] and out["y"].tolist() == ["a", "b", "b"]
    raw = pd.DataFrame(frame)
    keys = pd.util.hash_pandas_object(raw, index=False).to_numpy(dtype=np.uint64)
    assert out[ROW_KEY].tolist() == keys[[0, 4, 6]].tolist() and list(out.index) == [0, 1, 2]


def test_no_rows_left_names_every_reason() -> None:
    frame = {"x": [np.nan, np.nan, 1.0], "y": ["a", "b", None]}
    assert fails(frame, missing="drop", missing_target="drop") == (
        f"data.source: {SRC}: no rows left after dropping 3 of 3 (missing_target: 1, missing: 2); fix the data or "
        "set data.missing/data.duplicates/data.unseen_labels to keep them"
    )


# --- missing feature values and duplicate rows -----------------------------------------------------------------------


def test_missing_values_error_names_the_first_row_and_its_first_column() -> None:
    frame = {"x": [1.0, 2.0, 3.0, np.nan], "c": pd.Series(["p", None, "q", None], dtype=object), "y": list("abab")}
    assert fails(frame, missing="error") == (
        "data.source: f.csv, line 3, column 'c': the value is missing (2 rows have missing values; data.missing: "
        "error); fill it in, or set data.missing: impute or drop"
    )
    one = {"x": [1.0, np.nan, 3.0], "c": pd.Series(["p", None, "q"], dtype=object), "y": list("aba")}
    assert fails(one, missing="error") == (
        "data.source: f.csv, line 3, column 'x': the value is missing (1 row has missing values; data.missing: "
        "error); fill it in, or set data.missing: impute or drop"
    )
    # rows already dropped (no target) are not counted
    frame = {"x": [np.nan, 2.0, np.nan, 1.0, 3.0], "y": pd.Series([None, "a", "b", "a", "b"], dtype=object)}
    assert fails(frame, missing="error", missing_target="drop") == (
        "data.source: f.csv, line 4, column 'x': the value is missing (1 row has missing values; data.missing: "
        "error); fill it in, or set data.missing: impute or drop"
    )
    schema, out = ingest(frame, missing="drop", missing_target="drop")
    assert schema.dropped == {"missing_target": 1, "missing": 1} and out["x"].tolist() == [2.0, 1.0, 3.0]
    # a missing text or boolean value counts too; none missing: nothing dropped (but counted as 0)
    frame = {"b": pd.array([True, None, False, False], dtype="boolean"), "t": ["w", "v", None, "u"], "y": list("abab")}
    schema, out = ingest(frame, missing="drop", text_column="t")
    assert schema.dropped == {"missing": 2} and out["b"].tolist() == [True, False]
    schema, out = ingest({"x": [1.0, 2.0], "y": ["a", "b"]}, missing="drop")
    assert (schema.dropped, schema.n_rows) == ({"missing": 0}, 2)
    schema, out = ingest({"x": [1.0, 2.0], "y": ["a", "b"]}, missing="error")
    assert (schema.dropped, schema.n_rows) == ({"missing": 0}, 2)
    schema, out = ingest({"x": [1.0, np.nan], "y": ["a", "b"]})  # impute: not checked
    assert (schema.dropped, schema.n_rows) == ({}, 2)


def test_missing_of_no_columns_keeps_the_rows_as_they_are() -> None:
    keep = np.array([True, False])
    assert v._missing(T(pd.DataFrame({"y": [1, 2]})), P(missing="drop"), [], keep, {}) is keep


def test_duplicates_error_names_the_row_and_the_earlier_one() -> None:
    assert fails(DUPS, duplicates="error") == (
        "data.source: f.csv, line 4: the row duplicates f.csv, line 2 (2 duplicate rows; data.duplicates: error); "
        "remove the duplicates, or set data.duplicates: keep or drop"
    )
    one = {"x": [1.0, 2.0, 3.0, 2.0], "y": list("abab")}
    assert fails(one, duplicates="error") == (
        "data.source: f.csv, line 5: the row duplicates f.csv, line 3 (1 duplicate row; data.duplicates: error); "
        "remove the duplicates, or set data.duplicates: keep or drop"
    )
    # a duplicate of a dropped row: the earlier row is dropped for the same reason, so this one is not counted
    dropped = {"x": [np.nan, 2.0, np.nan, 3.0, 3.0], "y": list("abaaa")}
    assert fails(dropped, duplicates="error", missing="drop") == (
        "data.source: f.csv, line 6: the row duplicates f.csv, line 5 (1 duplicate row; data.duplicates: error); "
        "remove the duplicates, or set data.duplicates: keep or drop"
    )
    schema, out = ingest(dropped, duplicates="drop", missing="drop")
    assert schema.dropped == {"missing": 2, "duplicates": 1} and out["x"].tolist() == [2.0, 3.0]
    schema, out = ingest({"x": [1.0, 2.0], "y": ["a", "b"]}, duplicates="drop")
    assert schema.dropped == {"duplicates": 0}
    schema, out = ingest({"x": [1.0, 2.0], "y": ["a", "b"]}, duplicates="error")
    assert schema.dropped == {"duplicates": 0}
    schema, out = ingest({"x": [1.0, 1.0, 2.0], "y": ["a", "a", "b"]})  # keep: not checked
    assert (schema.dropped, schema.n_rows) == ({}, 3)


def test_duplicated_is_pandas_duplicated() -> None:
    frame = pd.DataFrame({"a": [1.0, 2.0, 1.0, 1.0, 2.0], "b": ["x", "y", "x", "z", "y"]})
    columns = v._FrameColumns(frame)
    assert columns.names == ["a", "b"]
    want_b = pd.util.hash_pandas_object(frame["b"], index=False).to_numpy(dtype=np.uint64)
    np.testing.assert_array_equal(columns.hashes("b"), want_b)
    hashes = v._hashes(columns)
    np.testing.assert_array_equal(hashes, pd.util.hash_pandas_object(frame, index=False).to_numpy(dtype=np.uint64))
    assert v._duplicated(columns, hashes).tolist() == frame.duplicated().tolist() == [False, False, True, False, True]
    # rows whose hashes collide but whose values differ are not duplicates
    fake = np.array([7, 7, 7, 8, 9], dtype=np.uint64)
    assert v._duplicated(columns, fake).tolist() == [False, False, True, False, False]
    assert v._duplicated(columns, np.arange(5, dtype=np.uint64)).tolist() == [False] * 5
    assert columns.take(np.array([3, 0])).index.tolist() == [3, 0]


# --- ISO timestamps with offsets, Python objects, labels that differ only in case -----------------------------


def test_iso_timestamps_with_offsets_are_read_as_the_same_instants_in_utc() -> None:
    """+02:00, Z and -05:00 are three offsets of one column: parsed together in UTC (naive UTC values), 22:00 the
    day before, noon, and 05:00. A column of mixed offsets is not readable without UTC."""
    frame = pd.DataFrame(
        {
            "when": ["2026-01-01T00:00:00+02:00", "2026-01-02T12:00:00Z", "2026-01-03T00:00:00-05:00", None],
            "y": ["a", "b", "a", "b"],
        }
    )
    schema, out = infer_schema(Table(frame), DataParams(target="y"), None)
    assert schema.kinds["when"] == "datetime"
    expected = np.array(["2025-12-31T22:00", "2026-01-02T12:00", "2026-01-03T05:00", "NaT"], dtype="datetime64[ns]")
    np.testing.assert_array_equal(out["when"].to_numpy(), expected)


def test_object_columns_of_booleans_and_of_datetimes_are_typed_from_their_python_values() -> None:
    """A column of Python True/False/None (object dtype, as JSON gives it) is a nullable boolean; one of Python
    datetimes with time zones is datetime64 in UTC (naive): 10:00+02:00 is 08:00 UTC."""
    import datetime

    tz = datetime.timezone(datetime.timedelta(hours=2))
    frame = pd.DataFrame(
        {
            "flag": pd.Series([True, False, None, True], dtype=object),
            "when": pd.Series([datetime.datetime(2026, 1, d, 10, tzinfo=tz) for d in (1, 2, 3, 4)], dtype=object),
            "y": ["a", "b", "a", "b"],
        }
    )
    schema, out = infer_schema(Table(frame), DataParams(target="y"), None)
    assert (schema.kinds["flag"], schema.kinds["when"]) == ("boolean", "datetime")
    assert out["flag"].tolist() == [True, False, pd.NA, True]
    expected = np.array([f"2026-01-0{d}T08:00" for d in (1, 2, 3, 4)], dtype="datetime64[ns]")
    np.testing.assert_array_equal(out["when"].to_numpy(), expected)


def test_labels_that_differ_only_in_case_are_warned_of_and_others_are_not(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from trainflow.data.validate import infer_schema
    from trainflow.params import DataParams

    d = DataParams.model_validate({"source": "t.csv", "target": "y"})
    for labels, warned in ((["spam", "ham"], False), (["spam", "ham", "Spam"], True)):
        path = tmp_path / "t.csv"
        pd.DataFrame({"x": range(30), "y": [labels[i % len(labels)] for i in range(30)]}).to_csv(path, index=False)
        from trainflow.data.sources import read_source

        infer_schema(read_source(d, tmp_path), d)
        err = capfd.readouterr().err
        assert ("differ only in case" in err) is warned, err
        if warned:
            assert "'Spam'/'spam'" in err or "'spam'/'Spam'" in err
