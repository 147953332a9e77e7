"""infer_schema: column kinds, typed output, target and task, drift, unseen labels, missing values, duplicates."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from trainflow.core.errors import DataError
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
